r"""pFedMoE P3 (Fig. 8 right): FedMoE's sensitivity to the gating network's learning
rate in {0.001, 0.01, 0.1, 1}, 3 seeds, the other learning rates at 0.01. The paper
shows it robust; the ledger reports the spread of final accuracy over the four rates
against the seeds' spread. The ledger's cut (``protocol.py``, T = ``ROUNDS`` there).

  python experiments/sweep.py --sweep=experiments/claims/p3_gating_lr.py \
      --sweep_dir=results/claims/p3_gating_lr --seed_batch=3 --budget_min=30

Cost: 12 runs, 0.25 PFLOP, 1h57m of the 2-core CPU by `sweep.py`'s plan.
"""
import os

from fedjax_het import config_files

protocol = config_files.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol.py"))


def get_config(arg=None):
  return protocol.sweep(
      ["fedmoe"],
      {f"gating lr={lr}": {"algo.gating_learning_rate": lr} for lr in (0.001, 0.01, 0.1, 1.0)},
      arg=arg)
