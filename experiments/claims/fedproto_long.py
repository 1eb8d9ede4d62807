r"""FedProto at P1's 2/10 cell for 3 T: does the prototype rule's collapse outlast the cut?

P1's FedProto run of seed 0 (``p1_classes.py``; round t of a 3 T run is round t of a T
run) carried to 3 ``ROUNDS``, a checkpoint every T rounds kept, from which
``diagnose/fedproto_collapse.py`` reads the rule and the client's own header at T, 2 T
and 3 T (docs/fidelity.md, "FedProto at the N=100 cut", has the commands and results).

  python experiments/sweep.py --sweep=experiments/claims/fedproto_long.py \
      --sweep_dir=results/claims/fedproto_long --keep_checkpoints=all --budget_min=30

Cost: 1 run, 13m33s of the 2-core CPU (shared); each kept checkpoint ~1.1 GB.
"""
import os

from fedjax_het import config_files

protocol = config_files.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol.py"))

LONG = 3  # x the ledger's T


def get_config(arg=None):
  _, classes = protocol.dataset(arg)
  return protocol.sweep(
      ["fedproto"],
      {f"{classes} classes, {LONG} T": {"checkpoint_every": protocol.ROUNDS,
                                        "keep_checkpoints": 2 * LONG + 2}},
      arg=arg, rounds=LONG * protocol.ROUNDS, seeds=(0,))
