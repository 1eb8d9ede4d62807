r"""The papers' main table under the earlier SHORT protocol (quick comparisons only).

Cut: 100 rounds x 1 local epoch, plain SGD (no momentum, weight decay or clipping), no
augmentation, the pooled 8:2 data, Dirichlet(1.0) shares of a class among its holders,
all clients evaluated every 10 rounds; rows, columns and seeds as ``paper_table.py``.

  python experiments/sweep.py --sweep=experiments/sweeps/short_table.py \
      --sweep_dir=runs/short_table
  # fewer seeds or rounds: --sweep.seeds=0,1 --sweep.base_overrides.num_rounds=50
"""
import ml_collections

SETTINGS = (("N=10,C=100%", 10, 1.0), ("N=50,C=20%", 50, 0.2), ("N=100,C=10%", 100, 0.1))
DATASETS = (("CIFAR-10", "cifar10", 2), ("CIFAR-100", "cifar100", 10))


def get_config():
  c = ml_collections.ConfigDict()
  c.algorithms = ["standalone", "lg_fedavg", "fd", "fedproto", "fml", "fedkd", "fedapen",
                  "moss", "fedmoe", "fedmrl"]
  c.variant = ""
  c.settings = ml_collections.ConfigDict({
      f"{title} {name}": {"data.name": data, "partition.kind": "pathological",
                          "partition.classes_per_client": classes,
                          "num_clients": n, "participation": frac}
      for title, data, classes in DATASETS for name, n, frac in SETTINGS
  }, allow_dotted_keys=True, sort_keys=False)
  c.seeds = (0, 1, 2)
  c.base_overrides = ml_collections.ConfigDict({"num_rounds": 100, "eval_every": 10,
                                                "partition.shares": "dirichlet",
                                                "eval_sampled": False},
                                               allow_dotted_keys=True, sort_keys=False)
  c.algorithm_overrides = ml_collections.ConfigDict({}, allow_dotted_keys=True)
  return c
