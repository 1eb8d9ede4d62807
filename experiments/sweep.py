r"""Runs a grid of experiments (algorithms x settings x seeds) and tabulates the results.

  python experiments/sweep.py --sweep=experiments/sweeps/smoke.py --sweep_dir=/tmp/sweep
  python experiments/sweep.py --sweep=experiments/sweeps/paper_cpu.py \
      --sweep_dir=results/paper_cpu --dry_run      # list the runs, run nothing
  python experiments/sweep.py --sweep=experiments/claims/table.py --sweep_dir=/tmp/two \
      --sweep.algorithms=standalone,fedmoe --sweep.settings=cifar-10_n10_c100pct_5k+1k_examples

``--sweep.algorithms=a,b`` and ``--sweep.settings=s,t`` (names or slugs) run some of the
file's rows and columns; the file's overrides of the rows left out are dropped, with a
line that says so.

The command line of ``fedjax_het.sweeps.runner`` (see its docstring for the details).
"""
import os

from fedjax_het.sweeps import runner

if __name__ == "__main__":
  # an algorithm named in a sweep file (``fedmrl``) is its config file here
  runner.cli(configs_dir=os.path.dirname(os.path.abspath(__file__)))
