"""Checks an experiment config before any data is read or anything is compiled.

``validate`` names the first bad key with its valid choices or bounds: the shared keys
(``config.base_config``), the dataset's keys, the sizes the data pool would have
(``data.pool.pool_sizes``, for a built-in dataset whose split sizes are known), and the
algorithm's own keys (its ``Spec``: ``hparams``, ``choices``, ``check``).
``algorithm``, ``models`` and the architecture-valued ``algo`` keys may reference
research code outside the package (``'package.module:attribute'``,
``fedjax_het.plugins``); ``validate`` imports it. ``with_algo_defaults`` and
``flat_defaults`` fill in an algorithm's defaults.
"""
from __future__ import annotations

import ml_collections

from fedjax_het.algorithms import get_spec
from fedjax_het.clients import PARALLELISM
from fedjax_het.config import base_config
from fedjax_het.config_files import flatten
from fedjax_het.data.augment import AUGMENTATIONS
from fedjax_het.data.partition import PARTITIONS
from fedjax_het.data.partition import SHARES
from fedjax_het.data.partition_file import FORMATS as PARTITION_FORMATS
from fedjax_het.data.pool import POOLS
from fedjax_het.data.pool import pool_sizes
from fedjax_het.data.sources import DATASETS
from fedjax_het.data.sources import SPLIT_SIZES
from fedjax_het.data.sources import check_name
from fedjax_het.data.sources import parse_floats
from fedjax_het.models.registry import REFERENCE_HINT
from fedjax_het.models.registry import ArchitectureChoices
from fedjax_het.models.registry import check_architectures
from fedjax_het.models.registry import client_archs

COMPUTE_DTYPES = ("float32", "bfloat16")
# partition.kind: the random partitions, or client tables read from partition.path
PARTITION_KINDS = PARTITIONS + ("file",)


def _fail(key: str, value, expected: str):
  raise ValueError(f"config.{key}={value!r} is invalid: {expected}")


def _check_choice(key, value, choices):
  if value not in choices:
    hint = f" {REFERENCE_HINT}" if isinstance(choices, ArchitectureChoices) else ""
    _fail(key, value, f"valid choices are {list(choices)}{hint}")


def _check_range(key, value, lo=None, hi=None, *, lo_open=False, integer=False):
  if integer and (not isinstance(value, int) or isinstance(value, bool)):
    _fail(key, value, "must be an integer")
  if not integer and not isinstance(value, (int, float)):
    _fail(key, value, "must be a number")
  if lo is not None and (value <= lo if lo_open else value < lo):
    _fail(key, value, f"must be {'>' if lo_open else '>='} {lo}")
  if hi is not None and value > hi:
    _fail(key, value, f"must be <= {hi}")


def _check_bool(key, value):
  if not isinstance(value, bool):
    _fail(key, value, "must be True or False")


def _check_keys(prefix: str, given, allowed):
  unknown = sorted(set(given) - set(allowed))
  if unknown:
    raise ValueError(f"unknown config keys {[prefix + k for k in unknown]}; "
                     f"valid keys are {sorted(prefix + k for k in allowed)}")


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises ValueError naming the first bad key (and its valid values)."""
  base = base_config()
  _check_keys("", c.keys(), base.keys())
  spec = get_spec(c.algorithm)
  _check_keys("data.", c.data.keys(), base.data.keys())
  _check_data(c.data)
  _check_range("data.subsample", c.data.subsample, 0, integer=True)
  _check_range("data.subsample_per_class", c.data.subsample_per_class, 0, integer=True)
  if c.data.subsample and c.data.subsample_per_class:
    _fail("data.subsample_per_class", c.data.subsample_per_class,
          f"set either data.subsample ({c.data.subsample}) or data.subsample_per_class, "
          "not both")
  _check_range("data.public", c.data.public, 0, integer=True)
  _check_choice("data.pool", c.data.pool, POOLS)
  _check_range("data.validation", c.data.validation, 0, integer=True)
  if c.data.validation and c.data.pool != "official":
    _fail("data.validation", c.data.validation,
          "a validation part exists only with data.pool='official' (set it to 0)")
  _check_choice("data.augment", c.data.augment, AUGMENTATIONS)
  _check_range("num_clients", c.num_clients, 1, integer=True)
  _check_sizes(c)
  _check_range("participation", c.participation, 0, 1, lo_open=True)
  _check_range("num_rounds", c.num_rounds, 1, integer=True)
  _check_range("local_epochs", c.local_epochs, 1, integer=True)
  _check_range("batch_size", c.batch_size, 1, integer=True)
  _check_bool("drop_last", c.drop_last)
  _check_range("learning_rate", c.learning_rate, 0, lo_open=True)
  _check_range("momentum", c.momentum, 0, 1)
  _check_range("weight_decay", c.weight_decay, 0)
  _check_range("grad_clip", c.grad_clip, 0)
  _check_bool("reset_downloaded_momentum", c.reset_downloaded_momentum)
  _check_keys("partition.", c.partition.keys(), base.partition.keys())
  _check_choice("partition.kind", c.partition.kind, PARTITION_KINDS)
  if c.partition.kind == "file":
    if not str(c.partition.path).endswith(PARTITION_FORMATS):
      _fail("partition.path", c.partition.path, "partition.kind='file' reads client "
            f"tables from a file ending in {list(PARTITION_FORMATS)}")
  elif c.partition.path:
    _fail("partition.path", c.partition.path, "a partition file is read only with "
          "partition.kind='file' (set partition.path='')")
  num_classes = DATASETS.get(c.data.name) or c.data.num_classes or None
  if c.partition.kind == "pathological":
    _check_range("partition.classes_per_client", c.partition.classes_per_client, 0,
                 num_classes, integer=True)
  _check_choice("partition.shares", c.partition.shares, SHARES)
  _check_range("partition.alpha", c.partition.alpha, 0, lo_open=True)
  _check_range("partition.test_fraction", c.partition.test_fraction, 0, 1, lo_open=True)
  archs = client_archs(c.models, c.num_clients)  # raises, naming `models` and the values
  if spec.homogeneous_only and len(set(archs)) > 1:
    _fail("models", c.models, f"algorithm {c.algorithm!r} needs model-homogeneous clients; "
          f"choose one of {list(ArchitectureChoices())} {REFERENCE_HINT}")
  _check_range("seed", c.seed, 0, integer=True)
  _check_range("eval_every", c.eval_every, 1, integer=True)
  _check_bool("eval_sampled", c.eval_sampled)
  _check_range("log_every", c.log_every, 0, integer=True)
  _check_range("checkpoint_every", c.checkpoint_every, 0, integer=True)
  _check_range("keep_checkpoints", c.keep_checkpoints, 1, integer=True)
  _check_keys("runtime.", c.runtime.keys(), base.runtime.keys())
  _check_choice("runtime.client_parallelism", c.runtime.client_parallelism, PARALLELISM)
  _check_range("runtime.num_devices", c.runtime.num_devices, 0, integer=True)
  _check_choice("runtime.compute_dtype", c.runtime.compute_dtype, COMPUTE_DTYPES)
  _check_keys("algo.", c.algo.keys(), spec.hparams)
  for key, choices in spec.choices.items():
    _check_choice(f"algo.{key}", c.algo.get(key, spec.hparams[key]), choices)
  for key, default in spec.hparams.items():
    if isinstance(default, bool):
      _check_bool(f"algo.{key}", c.algo.get(key, default))
  if spec.check is not None:
    spec.check(c)


def _check_data(d: ml_collections.ConfigDict) -> None:
  """The ``data`` keys that describe the dataset: name, classes, statistics."""
  try:
    check_name(d.name)
  except ValueError as err:
    raise ValueError(str(err)) from None
  _check_range("data.num_classes", d.num_classes, 0, integer=True)
  if d.name in DATASETS and d.num_classes not in (0, DATASETS[d.name]):
    _fail("data.num_classes", d.num_classes, f"{d.name} has {DATASETS[d.name]} classes "
          "(0: the dataset's own)")
  if d.num_classes == 1:
    _fail("data.num_classes", d.num_classes, "a classifier needs >= 2 classes (0: infer)")
  stats = {}
  for key in ("mean", "std"):
    try:
      stats[key] = parse_floats(d[key]) if isinstance(d[key], str) else None
    except ValueError:
      stats[key] = None
    if stats[key] is None:
      _fail(f"data.{key}", d[key], "a comma-separated list of numbers, one per image "
            "channel (empty: computed from the training split)")
  if len(stats["mean"]) != len(stats["std"]):
    _fail("data.std", d.std, f"give data.mean ({d.mean!r}) and data.std with one value "
          "per channel each, or neither")
  if any(s <= 0 for s in stats["std"]):
    _fail("data.std", d.std, "every value must be > 0")


def _check_sizes(c: ml_collections.ConfigDict) -> None:
  """The pool's sizes (``data.validation``, ``data.public``, ``num_clients``) of a
  built-in dataset, from its split sizes (``sources.SPLIT_SIZES``).

  Other datasets, and a smaller stand-in under a built-in name, are checked again when
  read (``data.pool.load_clients``).
  """
  if c.data.name not in SPLIT_SIZES:
    return
  subsample = c.data.subsample or c.data.subsample_per_class * DATASETS[c.data.name]
  pool_sizes(*SPLIT_SIZES[c.data.name], num_clients=c.num_clients, pool=c.data.pool,
             subsample=subsample, validation=c.data.validation,
             public=c.data.public if c.partition.kind != "file" else 0)


def with_algo_defaults(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A copy of ``c`` whose ``algo`` holds every hyper-parameter of its algorithm."""
  c = ml_collections.ConfigDict(c.to_dict())
  for key, value in get_spec(c.algorithm).hparams.items():
    if key not in c.algo:
      c.algo[key] = value
  return c


def flat_defaults(algorithm: str) -> dict:
  """Every key's default (``algo`` ones of ``algorithm``) as ``{dotted key: value}``.

  A run saved before a key existed is compared as if it had the key's default
  (``checkpoint.fingerprint_diff``, the sweep's finished-run check): adding a key to the
  library does not invalidate finished runs or checkpoints at its default.
  """
  c = base_config()
  c.algorithm = algorithm
  return flatten(with_algo_defaults(c).to_dict())


def check_models(config, archs, pool) -> None:
  """Every architecture of the run (clients' and ``algo`` ones) takes the pool's images.

  Shapes only (``models.check_architectures``), once the data is read (its image shape
  and classes) and before anything is compiled.
  """
  spec = get_spec(config.algorithm)
  extra = [v for k, v in config.algo.items()
           if isinstance(spec.choices.get(k), ArchitectureChoices)
           and v not in spec.choices[k].extra]
  check_architectures(tuple(archs) + tuple(extra), pool.image_shape, pool.num_classes)
