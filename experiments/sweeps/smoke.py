r"""A sweep of a few seconds per run: 3 methods x 2 settings x 2 seeds on the :smoke configs.

Cut: 12 runs of 3 rounds each on 1000 pooled CIFAR-10 examples (``FEDJAX_HET_DATA`` or
``--sweep.base_overrides.data.path``). Every run should finish with finite losses; the
accuracies mean little.

  python experiments/sweep.py --sweep=experiments/sweeps/smoke.py --sweep_dir=/tmp/sweep
  python experiments/plots.py --runs=/tmp/sweep --out=/tmp/sweep/plots \
      --compare=fedmrl,standalone
"""
import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.algorithms = ["standalone", "fedmrl", "fedmoe"]
  c.variant = "smoke"
  c.settings = ml_collections.ConfigDict({
      "N=5,C=100%": {"num_clients": 5, "participation": 1.0},
      "N=5,C=60%": {"num_clients": 5, "participation": 0.6},
  }, allow_dotted_keys=True, sort_keys=False)
  c.seeds = (0, 1)
  # nested (not dotted) so that --sweep.base_overrides.data.path=... can set it
  c.base_overrides = ml_collections.ConfigDict({"data": {"path": ""}})
  c.algorithm_overrides = ml_collections.ConfigDict({}, allow_dotted_keys=True)
  return c
