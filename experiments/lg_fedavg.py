r"""LG-FedAvg (Liang et al., 2020) on model-heterogeneous CNN-1..5, CIFAR-10 2/10.

Clients keep their extractors and share the linear header (500 -> 10), averaged by the
server over all architectures.

  python experiments/main.py --config=experiments/lg_fedavg.py --workdir=runs/lg_fedavg
  python experiments/main.py --config=experiments/lg_fedavg.py:smoke --workdir=/tmp/lg

Results (command, seed, rounds): docs/results.md.
"""
from fedjax_het.config import apply_variant
from fedjax_het.config import base_config


def get_config(arg=None):
  c = base_config()
  c.algorithm = "lg_fedavg"
  c.models = "heterogeneous"
  c.batch_size = 64
  c.learning_rate = 0.01
  return apply_variant(c, arg)
