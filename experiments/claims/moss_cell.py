r"""Moss S1-S4 in paper_cpu.py's N = 10, C = 100% cell: Moss as built against its ablations.

The ablations of ``moss_ablations.py`` (plain averaging of the proxies, the naive
mapping, 50 of the 200 public examples, a synthetic public set) and Moss as built in the
headline cell (same partitions and public set, T = 20), 5 seeds (the effects are small).

  python experiments/sweep.py --sweep=experiments/claims/moss_cell.py \
      --sweep_dir=results/claims/moss_cell --seed_batch=3 --budget_min=60

Cost: 25 runs (22 made here), about 2h50m of the 2-core CPU when nothing else runs: a
naive-mapping run 4-6 min, the others 7-10 min.
"""
import os

from fedjax_het import config_files

HERE = os.path.dirname(os.path.abspath(__file__))
moss_ablations = config_files.load_module(os.path.join(HERE, "moss_ablations.py"))
protocol = config_files.load_module(os.path.join(HERE, "protocol.py"))
SEEDS = (0, 1, 2, 3, 4)
# Seeds 0-2 of Moss as built are paper_cpu.py's runs (same config, seeds and partitions),
# copied into results/claims/moss_cell (the sweep skips them as finished). Its seeds 1-2
# ran on a replica axis (--seed_batch=2): another program, which rounds floats otherwise
# (a rerun one seed at a time differs at noise level, not in its config).


def get_config(arg=None):
  return protocol.cell_sweep(["moss"], {"FILE + WIRE": {}, **moss_ablations.ABLATIONS},
                             arg=arg, seeds=SEEDS)
