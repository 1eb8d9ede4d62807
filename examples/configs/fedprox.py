r"""FedProx (examples/fedprox.py) on model-homogeneous CNN-5 clients, CIFAR-10 2/10.

  python experiments/main.py --config=examples/configs/fedprox.py:smoke --workdir=/tmp/fedprox
  python experiments/main.py --config=examples/configs/fedprox.py:smoke \
      --workdir=/tmp/fedprox_mu --config.algo.mu=0.1 --config.algo.aggregation=uniform

Run from the repository root (``examples`` is imported from the current directory) or
with it on PYTHONPATH.
"""
from fedjax_het.config import apply_variant
from fedjax_het.config import base_config


def get_config(arg=None):
  c = base_config()
  c.algorithm = "examples.fedprox:SPEC"
  c.models = "cnn5"
  c.algo.mu = 0.01
  c.algo.aggregation = "weighted"
  return apply_variant(c, arg)
