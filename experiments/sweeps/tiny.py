r"""The papers' protocol at a size CI runs in a minute (``benchmarks/campaign.py --size=tiny``).

Cut: every piece of ``paper_table.py``'s protocol on the first 400 examples of
CIFAR-10's splits, 4 clients of the two test-only CNNs ``tiny`` and ``tiny2`` (FedMRL's
and FedMoE's shared models ``tiny`` too), 2 rounds of one epoch, two seeds: it checks
the campaign's path (estimate, budget, seeds on a replica axis, results files), not
accuracy.

  python experiments/sweep.py --sweep=experiments/sweeps/tiny.py --sweep_dir=/tmp/tiny \
      --seed_batch=2
"""
import os

import ml_collections

from fedjax_het import config_files

paper_table = config_files.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "paper_table.py"))


def get_config():
  c = ml_collections.ConfigDict()
  c.algorithms = ["standalone", "fedmrl", "fedmoe"]
  c.variant = ""
  c.settings = ml_collections.ConfigDict({
      "CIFAR-10 N=4,C=50% (400 examples)": {
          "data.name": "cifar10", "data.subsample": 400, "data.validation": 0,
          "partition.classes_per_client": 2, "num_clients": 4, "participation": 0.5,
          "models": "tiny,tiny2"},
  }, allow_dotted_keys=True, sort_keys=False)
  c.seeds = (0, 1)
  c.base_overrides = ml_collections.ConfigDict(
      {**paper_table.PROTOCOL, "num_rounds": 2, "local_epochs": 1, "batch_size": 16,
       "checkpoint_every": 1},
      allow_dotted_keys=True, sort_keys=False)
  c.algorithm_overrides = ml_collections.ConfigDict(
      {"fedmrl": {"algo.d1": 50, "algo.small_arch": "tiny"},
       "fedmoe": {"algo.global_arch": "tiny"}}, allow_dotted_keys=True)
  return c
