"""The experiment configuration's defaults, its variants and dotted-key overrides.

Experiment files (``experiments/<algorithm>.py``) start from ``base_config()`` and set a
few fields. This module is a leaf, as flax's ``configs/default.py``: it imports only
``ml_collections``, so a config file loads without JAX or the library.
``fedjax_het.validation`` checks a config (before any data is read or anything is
compiled) and fills in its algorithm's defaults; ``pool_args``, ``partition_args`` and
``data_args`` spell out what the data layer (``fedjax_het.data.pool``) takes of it.
"""
from __future__ import annotations

import ml_collections


def base_config() -> ml_collections.ConfigDict:
  """Defaults for every key every algorithm understands (see docs/configs.md)."""
  c = ml_collections.ConfigDict()
  c.algorithm = "standalone"
  c.data = ml_collections.ConfigDict(dict(
      name="cifar10", path="", subsample=0, subsample_per_class=0, public=0, pool="pooled",
      validation=0, augment="none", num_classes=0, mean="", std=""))
  c.num_clients = 10
  c.participation = 1.0
  c.num_rounds = 100
  c.local_epochs = 1
  c.batch_size = 64
  c.drop_last = False
  c.learning_rate = 0.01
  c.momentum = 0.0
  c.weight_decay = 0.0
  c.grad_clip = 0.0
  c.reset_downloaded_momentum = True
  c.partition = ml_collections.ConfigDict(dict(
      kind="pathological", classes_per_client=0, shares="uniform", alpha=1.0,
      test_fraction=0.2, path=""))
  c.models = "heterogeneous"
  c.seed = 0
  c.eval_every = 10
  c.eval_sampled = True
  c.log_every = 0
  c.checkpoint_every = 50
  c.keep_checkpoints = 2
  c.runtime = ml_collections.ConfigDict(
      dict(client_parallelism="auto", num_devices=0, compute_dtype="float32"))
  c.algo = ml_collections.ConfigDict()
  return c


def smoke(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Shrinks a config to a CPU run of a few seconds (the ``:smoke`` variants)."""
  c.num_clients = 5
  c.num_rounds = 3
  c.batch_size = 16
  c.eval_every = 1
  c.checkpoint_every = 2
  # the first 100 pooled examples per class: 1000 of CIFAR-10, 10000 of CIFAR-100 (with
  # the papers' 10 classes per client, ~80 training examples per class and client)
  c.data.subsample = 0
  c.data.subsample_per_class = 100
  return c


def cpu(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """Shrinks a config to a few minutes on a laptop's CPU (the ``:cpu`` variants).

  The papers' client setting (N=10, every client each round) on the first 6000 pooled
  examples, 20 rounds of one local epoch with the FedMRL authors' optimizer (momentum
  0.9, weight decay 1e-3, clipping at 50; plain SGD learns too little in 20 short
  rounds): accuracies far above chance, minutes of CPU.
  """
  c.num_clients = 10
  c.participation = 1.0
  c.num_rounds = 20
  c.momentum = 0.9
  c.weight_decay = 1e-3
  c.grad_clip = 50.0
  c.eval_every = 5
  c.checkpoint_every = 10
  c.data.subsample = 6000
  return c


def override(c: ml_collections.ConfigDict, values: dict) -> ml_collections.ConfigDict:
  """Sets dotted keys (``{"partition.kind": "iid"}``) in place, as ``--config.x=v`` does."""
  for key, value in values.items():
    node = c
    *path, leaf = key.split(".")
    for p in path:
      node = node[p]
    node[leaf] = value
  return c


VARIANTS = {"smoke": smoke, "cpu": cpu}


def apply_variant(c: ml_collections.ConfigDict, arg: str | None) -> ml_collections.ConfigDict:
  """Applies a ``get_config(arg)`` variant such as ``'smoke'`` (None: the config itself)."""
  if not arg:
    return c
  if arg not in VARIANTS:
    raise ValueError(f"unknown config variant {arg!r}; valid: {sorted(VARIANTS)}")
  return VARIANTS[arg](c)


def pool_args(c: ml_collections.ConfigDict) -> dict:
  """The keyword arguments of ``fedjax_het.data.pool.load_pool`` that ``c`` sets."""
  d = c.data
  return dict(name=d.name, path=d.path, num_classes=d.num_classes, pool=d.pool,
              subsample=d.subsample, subsample_per_class=d.subsample_per_class,
              validation=d.validation, mean=d.mean, std=d.std, seed=c.seed,
              num_clients=c.num_clients)


def partition_args(c: ml_collections.ConfigDict) -> dict:
  """The keyword arguments of ``fedjax_het.data.pool.partition_clients`` that ``c`` sets."""
  p = c.partition
  return dict(partition=p.kind, classes_per_client=p.classes_per_client, alpha=p.alpha,
              shares=p.shares, test_fraction=p.test_fraction, partition_path=p.path,
              pool=c.data.pool, public=c.data.public, seed=c.seed,
              num_clients=c.num_clients)


def data_args(c: ml_collections.ConfigDict) -> dict:
  """The keyword arguments of ``fedjax_het.data.pool.load_clients`` that ``c`` sets."""
  return {**pool_args(c), **partition_args(c)}
