r"""Seeds 3 and 4 of ``paper_cpu.py``'s N = 10, C = 100% cell (same configs, T = 20) for
the T = 20 rows that 3 seeds left within two standard errors of zero: FedMoE (Table 3),
FedMRL (M1), FedKD and FML, each against Standalone. The ledger reads these methods'
paper_cpu runs and these (``ledger.FIVE_SEEDS``, ``Group.more``): 5 seeds a row.

  python experiments/sweep.py --sweep=experiments/claims/cell_seeds.py \
      --sweep_dir=results/claims/cell_seeds --budget_min=60

Cost: 10 runs, about 40 min of the 2-core CPU (paper_cpu's seed-0 runs of these methods
took 2-4 min each).
"""
import os

from fedjax_het import config_files

protocol = config_files.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol.py"))
ALGORITHMS = ["standalone", "fedmoe", "fedmrl", "fml", "fedkd"]
SEEDS = (3, 4)


def get_config(arg=None):
  return protocol.cell_sweep(ALGORITHMS, {protocol.cell_name(arg): {}}, arg=arg, seeds=SEEDS)
