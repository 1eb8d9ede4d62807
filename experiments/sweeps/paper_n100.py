r"""The papers' CIFAR-10 (N=100, C=10%) cell under their protocol: what a GPU lease finishes.

``paper_table.py``'s cheapest CIFAR-10 cell (10 of 100 clients train a round: Standalone
0.43 PFLOP a seed against N=10's 4.0); on one H200 (jax 0.11.2) Standalone's 3 seeds on a
replica axis took 3m56s (compilation 57 s, 0.29 s a round). Uncut protocol (T = 500,
E = 10, B = 512, both evaluations every round, 3 seeds); Standalone, FedMoE, FedMRL.
Not the campaign's runs (``campaign.py --size=paper``): with Moss in a sweep every method
of a cell holds Moss's 500 public images out of the pool (``sweeps.plan``), here none.

  python experiments/sweep.py --sweep=experiments/sweeps/paper_n100.py \
      --sweep_dir=results/paper_n100 --seed_batch=3 --budget_min=8
"""
import os

import ml_collections

from fedjax_het import config_files

paper_table = config_files.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "paper_table.py"))
SETTING = "CIFAR-10 N=100,C=10%"
ALGORITHMS = ["standalone", "fedmoe", "fedmrl"]
# pFedMoE Table 3's CIFAR-10 N=100 column (FedMRL's paper: above the best baseline)
PAPER_CELLS = {"cell": "pFedMoE Table 3, CIFAR-10 N=100 C=10%",
               "values": {"standalone": 91.97, "lg_fedavg": 91.27, "fedproto": 92.49,
                          "fedkd": 73.21, "fedmoe": 93.07}}


def get_config():
  c = paper_table.get_config()
  c.settings = ml_collections.ConfigDict({SETTING: c.settings[SETTING].to_dict()},
                                         allow_dotted_keys=True)
  c.algorithms = list(ALGORITHMS)
  c.algorithm_overrides = ml_collections.ConfigDict(
      {a: v for a, v in c.algorithm_overrides.items() if a in ALGORITHMS},
      allow_dotted_keys=True)
  return c
