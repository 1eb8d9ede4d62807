r"""The earlier SHORT protocol on CPU (N=10, C=100%, pathological 2/10), for comparison.

What the library ran before the papers' protocol existed: 10 rounds of 1 local epoch,
plain SGD (lr 0.01, no momentum, weight decay, clipping or augmentation), batch 64, the
first 6000 pooled examples split 8:2 per client, Dir(1.0) shares of a class among its
holders; both evaluation protocols are reported. ``paper_cpu.py`` is the same setting
under the papers' protocol; docs/results.md shows both.

  python experiments/sweep.py --sweep=experiments/sweeps/cpu_table.py \
      --sweep_dir=results/cpu_table
"""
import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.algorithms = ("standalone", "fedmrl", "fedmoe")  # the papers' two and the floor
  c.variant = ""
  c.settings = ml_collections.ConfigDict({
      "CIFAR-10 N=10,C=100% (6k examples)": {
          "data.name": "cifar10", "data.subsample": 6000, "partition.kind": "pathological",
          "partition.classes_per_client": 2, "num_clients": 10, "participation": 1.0},
  }, allow_dotted_keys=True, sort_keys=False)
  c.seeds = (0,)
  c.base_overrides = ml_collections.ConfigDict(
      {"num_rounds": 10, "eval_every": 5, "checkpoint_every": 5,
       "partition.shares": "dirichlet"},
      allow_dotted_keys=True, sort_keys=False)
  c.algorithm_overrides = ml_collections.ConfigDict({}, allow_dotted_keys=True)
  return c
