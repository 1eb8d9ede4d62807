r"""FedProto at the ledger's cut with the reference implementations' choices.

P1, P2 and M5 hold FedMoE and FedMRL against FedProto predicting by the nearest global
prototype, which at this cut ends below its clients' chance (issue 80; docs/fidelity.md,
"FedProto at the N=100 cut"). This runs FedProto with every choice of FedProto's code
(yuetan031/FedProto) and HtFLlib's (TsingZ0/HtFLlib ``clientproto``/``serverproto``)
where ours differs: the prototype rule over the client's own classes only
(``algo.prototype_classes='own'``, FedProto's ``test_inference_new_het_lt``), each client
counted once in a global prototype (``algo.prototype_weighting='clients'``, both codes),
local prototypes from the features of the training batches
(``algo.prototypes_from='during_training'``, HtFLlib) and a table of this round's
classes only (``algo.prototype_memory=False``, HtFLlib); and our FedProto with only the
rule changed to the client's own classes (the same training as P1's runs). P1's 2/10
cell, its seeds and partitions, paired with P1's runs (``:cifar100``: 10 of 100 classes,
not run).

  python experiments/sweep.py --sweep=experiments/claims/fedproto_reference.py \
      --sweep_dir=results/claims/fedproto_reference --budget_min=60

Cost: 6 runs; 3m40s each on the 2-core CPU when nothing else runs (22m13s while it was
shared).
"""
import os

from fedjax_het import config_files

protocol = config_files.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol.py"))

REFERENCE = {"algo.prototype_classes": "own", "algo.prototype_weighting": "clients",
             "algo.prototypes_from": "during_training", "algo.prototype_memory": False}
SETTING = "references' choices, {} classes"
OWN_RULE = "own-class rule, {} classes"


def get_config(arg=None):
  _, classes = protocol.dataset(arg)  # the papers' classes per client: 2 of 10, 10 of 100
  return protocol.sweep(["fedproto"], {
      SETTING.format(classes): REFERENCE,
      OWN_RULE.format(classes): {"algo.prototype_classes": "own"}}, arg=arg)
