r"""Figures (PNG, matplotlib Agg) and TensorBoard logs (tensorboardX) from run workdirs.

  python experiments/plots.py --runs=results/paper_cpu --out=results/paper_cpu/plots \
      --compare=fedmrl,standalone

The command line of ``fedjax_het.sweeps.plots`` (see its docstring for the details).
"""
from fedjax_het.sweeps import plots

if __name__ == "__main__":
  plots.cli()
