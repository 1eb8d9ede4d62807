r"""Paired differences between a sweep's groups of runs, matched by seed.

  python experiments/paired.py --sweep_dir=results/bf16_fedmrl_cpu --baseline=float32
  python experiments/paired.py --sweep_dir=results/paper_cpu --baseline=standalone \
      [--last_k=5] [--per_seed]

The command line of ``fedjax_het.sweeps.paired_report`` (``fedjax_het.sweeps.paired``'s
docstring says what is compared and how).
"""
from fedjax_het.sweeps import paired_report

if __name__ == "__main__":
  paired_report.cli()
