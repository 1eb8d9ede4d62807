r"""FedProto at the ledger's cut with the reference implementations' choices.

P1's 2/10 cell (its seeds and partitions) with FedProto as yuetan031/FedProto and
TsingZ0/HtFLlib run it where ours differs (``algo.prototype_classes='own'``,
``prototype_weighting='clients'``, ``prototypes_from='during_training'``,
``prototype_memory=False``), and ours with only the rule over the client's own classes;
docs/fidelity.md, "FedProto at the N=100 cut", says why.

  python experiments/sweep.py --sweep=experiments/claims/fedproto_reference.py \
      --sweep_dir=results/claims/fedproto_reference --budget_min=60

Cost: 6 runs, 3m40s each on the quiet 2-core CPU.
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
