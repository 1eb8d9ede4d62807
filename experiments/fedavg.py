r"""FedAvg on model-homogeneous CNN-1 clients, CIFAR-10, pathological non-IID 2/10.

  python experiments/main.py --config=experiments/fedavg.py --workdir=runs/fedavg
  python experiments/main.py --config=experiments/fedavg.py:smoke --workdir=/tmp/fedavg

Results: see docs/results.md.
"""
from fedjax_het.config import apply_variant
from fedjax_het.config import base_config


def get_config(arg=None):
  c = base_config()
  c.algorithm = "fedavg"
  c.models = "cnn1"
  return apply_variant(c, arg)
