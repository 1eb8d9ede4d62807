r"""pFedMoE P2 (Fig. 8 left) and FedMRL M5: FedMoE and FedMRL above FedProto for
Dirichlet(gamma) label shares, gamma in {0.1, 0.2, 0.3, 0.4, 0.5} (every client holds
every class in Dirichlet proportions; smaller gamma is more skewed). The ledger's cut
(``protocol.py``, T = ``ROUNDS`` there) with ``partition.kind='dirichlet'``.

  python experiments/sweep.py --sweep=experiments/claims/p2_dirichlet.py \
      --sweep_dir=results/claims/p2_dirichlet --seed_batch=3 --budget_min=60

Cost: 45 runs, 0.87 PFLOP, 7h04m of the 2-core CPU by `sweep.py`'s plan.
"""
import os

from fedjax_het import config_files

protocol = config_files.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol.py"))


def get_config(arg=None):
  return protocol.sweep(
      ["fedmoe", "fedproto", "fedmrl"],
      {f"gamma={g}": {"partition.kind": "dirichlet", "partition.alpha": g}
       for g in (0.1, 0.2, 0.3, 0.4, 0.5)},
      arg=arg)
