r"""FedProto at the ledger's cut: its clients' own header against the nearest prototype.

The FedProto paper and HtFLlib's ``clientproto`` predict the class of the nearest global
prototype (``algo.inference='prototype'``, our default); pFedMoE's Table 3 reports
FedProto at 92.49 on CIFAR-10 at N = 100, C = 10%, above Standalone's 91.97, so its
prototypes classify a client's own classes well there. At the ledger's cut (T = 100 of
the papers' 500 rounds, 100 examples per client, so a client trains on about 10 visits)
FedProto's P1 runs stay near chance over 10 classes with the nearest prototype; this
sweep runs the same FedProto at 2/10 classes predicting with the client's own header
(``algo.inference='header'``; training is the same, the local loss does not depend on
the inference), and the ledger pairs it by seed with P1's 2/10 FedProto runs
(``p1_classes.py``). The ledger's cut (``protocol.py``, T = ``ROUNDS`` there).

  python experiments/sweep.py --sweep=experiments/claims/fedproto_inference.py \
      --sweep_dir=results/claims/fedproto_inference --seed_batch=3 --budget_min=60

Cost: 3 runs, about 20 minutes each on the 2-core CPU (P1's FedProto runs).
"""
import os

from fedjax_het import config_files

protocol = config_files.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol.py"))


def get_config(arg=None):
  _, classes = protocol.dataset(arg)
  return protocol.sweep(["fedproto"],
                        {f"header inference, {classes} classes": {"algo.inference": "header"}},
                        arg=arg)
