r"""Moss (arXiv 2503.10218) on model-heterogeneous CNN-1..5, CIFAR-10 2/10.

Device types = architectures CNN-1..5 (client k runs CNN-((k mod 5)+1)); proxies are CNN-1
(the largest); the server's public set is ``algo.public_size`` pooled examples that no
client holds (``data.public`` examples are held out of the partition; see docs/moss.md).

  python experiments/main.py --config=experiments/moss.py --workdir=runs/moss
  python experiments/main.py --config=experiments/moss.py:smoke --workdir=/tmp/moss_smoke
  # ablations: FILE off / WIRE off
  python experiments/main.py --config=experiments/moss.py --workdir=runs/moss_uniform \
      --config.algo.aggregation=uniform
  python experiments/main.py --config=experiments/moss.py --workdir=runs/moss_naive \
      --config.algo.mapping=naive

Expected: the smoke run finishes 3 rounds on CPU with finite losses; full-run results are
not recorded yet.
"""
from fedjax_het.config import apply_variant
from fedjax_het.config import base_config


def get_config(arg=None):
  c = base_config()
  c.algorithm = "moss"
  c.models = "heterogeneous"
  c.batch_size = 64
  c.learning_rate = 0.01
  c.algo.proxy_arch = "auto"
  c.algo.aggregation = "file"
  c.algo.mapping = "wire"
  c.algo.public_size = 500
  c.data.public = 500  # held out of the clients' partition: the server's public set
  c.algo.public_batch = 50
  c.algo.wire_steps = 10
  c.algo.wire_lr = 0.01
  c.algo.meta_lr = 1e-3
  c.algo.beta = 0.5
  c.algo.wire_layers = "conv1,conv2,rep"
  c.algo.public_domain = "held_out"  # or "synthetic" (docs/moss.md)
  c.algo.wire_clip = 0.0  # no clip of WIRE's steps (docs/moss.md)
  c = apply_variant(c, arg)
  if arg == "smoke":  # a few WIRE steps on a small public set keep CPU runs short
    c.algo.public_size = 64
    c.data.public = 64
    c.algo.public_batch = 16
    c.algo.wire_steps = 2
  return c
