r"""Standalone (no federation) on model-heterogeneous CNN-1..5 clients, CIFAR-10 2/10.

  python experiments/main.py --config=experiments/standalone.py --workdir=runs/standalone
  python experiments/main.py --config=experiments/standalone.py:smoke --workdir=/tmp/sa

Results: see docs/results.md.
"""
from fedjax_het.config import apply_variant
from fedjax_het.config import base_config


def get_config(arg=None):
  c = base_config()
  c.algorithm = "standalone"
  c.models = "heterogeneous"
  return apply_variant(c, arg)
