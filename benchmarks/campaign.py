r"""The campaign: speed comparison and the papers' CIFAR-10 column in a time budget.

  python benchmarks/campaign.py --size=tiny --results=/tmp/results   # CPU, about a minute
  python benchmarks/campaign.py --size=paper --budget_min=25         # one GPU; rerun to continue

The command line of ``fedjax_het.sweeps.campaign`` (see its docstring).
"""
import os

from fedjax_het.sweeps import campaign

# the source tree: its experiments/ (sweep and config files) and benchmarks/compare.py
REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

if __name__ == "__main__":
  campaign.cli(repo_dir=REPO_DIR)
