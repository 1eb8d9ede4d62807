r"""Moss S1-S4 in ``paper_cpu.py``'s N = 10, C = 100% cell, paired with its Moss runs.

The ablations of ``moss_ablations.py`` (plain averaging of the proxies, the naive
mapping, 50 of the 200 public examples, a synthetic public set) in the headline cell
(same seeds, partitions and public set, T = 20), each paired with ``paper_cpu``'s Moss.

  python experiments/sweep.py --sweep=experiments/claims/moss_cell.py \
      --sweep_dir=results/claims/moss_cell --seed_batch=3 --budget_min=60

Cost: 12 runs, 1h28m on the 2-core CPU (a naive-mapping run 4m20s, the others 7-10 min).
"""
import os

from fedjax_het import config_files

HERE = os.path.dirname(os.path.abspath(__file__))
paper_cpu = config_files.load_module(
    os.path.join(os.path.dirname(HERE), "sweeps", "paper_cpu.py"))
moss_ablations = config_files.load_module(os.path.join(HERE, "moss_ablations.py"))
protocol = config_files.load_module(os.path.join(HERE, "protocol.py"))


def get_config(arg=None):
  c = paper_cpu.get_config()
  (_, values), = c.settings.items()
  values = protocol.on_dataset(values, arg)
  c.algorithms = ["moss"]
  c.settings = type(c.settings)(
      {k: {**values, **v} for k, v in moss_ablations.ABLATIONS.items()},
      allow_dotted_keys=True, sort_keys=False)
  c.algorithm_overrides = type(c.algorithm_overrides)(
      {"moss": c.algorithm_overrides["moss"]}, allow_dotted_keys=True)
  return c
