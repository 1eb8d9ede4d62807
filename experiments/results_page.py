r"""Generates the results page (``docs/results.md``) from a sweep and its figures.

  python experiments/results_page.py --sweep_dir=results/paper_cpu --out=docs/results.md \
      [--plots_dir=results/paper_cpu/plots] [--earlier=results/cpu_table]

The command line of ``fedjax_het.sweeps.results_page`` (see its docstring for the details).
"""
from fedjax_het.sweeps import results_page

if __name__ == "__main__":
  results_page.cli()
