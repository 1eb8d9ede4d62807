r"""Your algorithm as a row of a sweep table, beside built-in ones (docs/extending.md).

An ``algorithms`` entry may be an experiment config file of your own; its file name
names the row (``fedprox``).

  python experiments/sweep.py --sweep=examples/configs/sweep.py --sweep_dir=/tmp/ext_sweep
"""
import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.algorithms = ["fedavg", "examples/configs/fedprox.py"]
  c.variant = "smoke"
  c.settings = ml_collections.ConfigDict({
      "N=5,C=100%": {"num_clients": 5, "participation": 1.0},
      "N=5,C=60%": {"num_clients": 5, "participation": 0.6},
  }, allow_dotted_keys=True, sort_keys=False)
  c.seeds = (0,)
  # both rows on CNN-5 clients; nested so that --sweep.base_overrides.data.path=... works
  c.base_overrides = ml_collections.ConfigDict({"models": "cnn5", "data": {"path": ""}})
  # a row's own keys: FedProx's proximal weight (experiments/sweep.py --dry_run lists runs)
  c.algorithm_overrides = ml_collections.ConfigDict({"fedprox": {"algo.mu": 1.0}},
                                                    allow_dotted_keys=True)
  return c
