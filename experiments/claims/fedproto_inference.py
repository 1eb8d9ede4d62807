r"""FedProto at the ledger's cut: its clients' own header against the nearest prototype.

FedProto's P1 runs predict by the nearest global prototype (its paper, HtFLlib; our
default) and stay near chance over 10 classes at the ledger's cut; pFedMoE's Table 3 has
FedProto at 92.49 (N = 100, C = 10%). The same FedProto at 2/10 predicting with the
client's own header (``algo.inference='header'``; the training is the same), paired by
seed with P1's 2/10 runs. The ledger's cut (``protocol.py``, T = ``ROUNDS`` there).

  python experiments/sweep.py --sweep=experiments/claims/fedproto_inference.py \
      --sweep_dir=results/claims/fedproto_inference --seed_batch=3 --budget_min=60

Cost: 3 runs, 8m24s-8m46s each on the quiet 2-core CPU.
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
