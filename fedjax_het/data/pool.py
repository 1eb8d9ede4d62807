"""The data pool of a run and its clients: which examples exist, who holds which.

Two pools (``data.pool``):

- ``'pooled'`` (pFedMoE's text, Sec. 5.1): CIFAR's train and test splits concatenated,
  partitioned among the clients, and each client's share split 8:2 into its own train
  and test sets (``partition.test_fraction``).
- ``'official'`` (the FedMRL authors' code, ``experiments/dataset.py``): CIFAR's train
  split (minus ``data.validation`` examples held out, used by nobody; the authors hold
  out 10,000) partitioned for training, and CIFAR's test split partitioned so that each
  client's test set has the class proportions of its training set.

Either pool can instead be split by a partition file (``partition.kind='file'``,
``fedjax_het.data.partition_file``), such as the ``partition_indices.npz`` every run
writes: indices into the pool, whose rows are the dataset's train split in canonical
order then its test split (``sources.canonical``), as kept by ``data.subsample`` and
``data.validation``.

Everything is numpy and deterministic in the seed, so a resumed run (and every process
of a deployment) rebuilds the same clients.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np

from fedjax_het.data import partition_file
from fedjax_het.data import sources
from fedjax_het.data.partition import class_counts
from fedjax_het.data.partition import papers_classes_per_client
from fedjax_het.data.partition import partition as partition_lib
from fedjax_het.data.partition import split_like
from fedjax_het.data.partition import train_test_split

POOLS = ("pooled", "official")


class Pool(NamedTuple):
  """The examples of a run.

  Attributes:
    x: uint8 [P, H, W, C] images.
    y: int32 [P] labels.
    num_classes: classes of the dataset.
    num_train: the first ``num_train`` rows come from the dataset's train split (the
      rest from its test split); ``'official'`` partitions the two parts separately.
    source: where the dataset was read (``sources.RawData.source``).
    fingerprint: hash of the whole dataset in canonical order (before subsampling).
    normalization: per-channel ``(mean, std)`` of the dataset (``sources.normalization``).
    pool_split: int8 [P] the source split of each row (0 train, 1 test), or None.
    pool_row: int64 [P] the row of the source's split each row is, or None.
  """
  x: np.ndarray
  y: np.ndarray
  num_classes: int
  num_train: int
  source: str = ""
  fingerprint: str = ""
  normalization: tuple | None = None
  pool_split: np.ndarray | None = None
  pool_row: np.ndarray | None = None

  @property
  def image_shape(self) -> tuple[int, ...]:
    """(H, W, C) of one image."""
    return tuple(int(d) for d in self.x.shape[1:])

  def summary(self) -> dict:
    """What ``summary.json`` records of the data (``experiment.Experiment.data_source``)."""
    stats = self.normalization
    return {"source": self.source, "fingerprint": self.fingerprint, "examples": len(self.y),
            "image_shape": list(self.image_shape), "num_classes": self.num_classes,
            "normalization": None if stats is None else {"mean": list(stats[0]),
                                                         "std": list(stats[1])}}

  def tables(self, train, test) -> partition_file.ClientTables:
    """Client tables into this pool, with what an exported partition file records."""
    return partition_file.ClientTables(list(train), list(test), len(self.y),
                                       self.fingerprint, self.pool_split, self.pool_row)


class PoolSizes(NamedTuple):
  """How many examples a pool keeps of a dataset's splits (``pool_sizes``).

  Attributes:
    num_train: rows of the pool from the train split (after ``validation`` and
      ``subsample``).
    num_test: rows of the pool from the test split.
    candidates: rows the public set is held out of: the train rows (``'official'``,
      whose test rows follow the clients' train classes) or all rows.
  """
  num_train: int
  num_test: int
  candidates: int

  @property
  def size(self) -> int:
    """Rows of the pool."""
    return self.num_train + self.num_test


def pool_sizes(train_size: int, test_size: int, *, num_clients: int, pool: str = "pooled",
               subsample: int = 0, validation: int = 0, public: int = 0) -> PoolSizes:
  """The sizes of the pool of a dataset of ``train_size + test_size`` examples.

  Pure arithmetic over sizes: ``load_pool`` and ``partition_clients`` keep the rows it
  counts, and ``fedjax_het.validation`` calls it for a dataset of known split sizes
  (``sources.SPLIT_SIZES``) before any data is read.

  Args:
    train_size, test_size: examples of the dataset's train and test splits.
    num_clients: N; every client needs an example.
    pool: ``'pooled'`` or ``'official'`` (module docstring).
    subsample: keep the first N examples (0: all; ``data.subsample_per_class`` already
      multiplied by the number of classes).
    validation: ``'official'``: train examples held out for validation.
    public: examples held out from every client as the server's public set.

  Raises:
    ValueError: naming ``data.validation``, ``data.public`` or ``num_clients`` when
      fewer examples than clients are left.
  """
  if pool == "official":
    if validation and validation >= train_size - num_clients:
      raise ValueError(f"config.data.validation={validation} leaves too few of the "
                       f"{train_size} training examples for {num_clients} clients")
    n_tr, n_te = train_size - validation, test_size
    if subsample:
      n_tr_sub = round(subsample * n_tr / (n_tr + n_te))
      n_tr, n_te = min(n_tr, n_tr_sub), min(n_te, subsample - n_tr_sub)
  else:
    size = min(subsample, train_size + test_size) if subsample else train_size + test_size
    n_tr, n_te = min(train_size, size), size - min(train_size, size)
  sizes = PoolSizes(n_tr, n_te, n_tr if pool == "official" else n_tr + n_te)
  if public and public >= sizes.candidates - num_clients:
    raise ValueError(f"config.data.public={public} leaves too few of the "
                     f"{sizes.candidates} examples for {num_clients} clients")
  if sizes.size < num_clients:
    raise ValueError(f"config.num_clients={num_clients} exceeds the {sizes.size} "
                     "examples of the data")
  return sizes


def load_pool(*, name: str, seed: int, num_clients: int, path: str = "",
              num_classes: int = 0, pool: str = "pooled", subsample: int = 0,
              subsample_per_class: int = 0, validation: int = 0, mean: str = "",
              std: str = "") -> Pool:
  """The pool of a dataset (see module docstring); the arguments are ``config.data``'s.

  ``subsample`` keeps the first N examples (``subsample_per_class``: N = that times the
  number of classes): of the concatenation (``'pooled'``), or of each split in
  proportion to its size (``'official'``). ``config_lib.pool_args(config)`` gives the
  arguments of a config.

  Args:
    name, path, num_classes: the dataset and where it is (``sources.load_dataset``).
    seed: the run's seed (which train examples ``validation`` holds out).
    num_clients: N (``validation`` must leave an example for each).
    pool: ``'pooled'`` or ``'official'``.
    subsample, subsample_per_class, validation: see above and ``pool_sizes``.
    mean, std: normalisation statistics (``sources.normalization``).
  """
  raw = sources.load_dataset(name, path, num_classes=num_classes)
  subsample = subsample or subsample_per_class * raw.num_classes
  x_tr, y_tr, x_te, y_te = raw.x_train, raw.y_train, raw.x_test, raw.y_test
  r_tr, r_te = (np.arange(len(y)) if r is None else r for r, y in (
      (raw.train_rows, y_tr), (raw.test_rows, y_te)))
  if pool == "official":
    if validation:
      pool_sizes(len(y_tr), len(y_te), num_clients=num_clients, pool=pool,
                 validation=validation)  # raises when too few are left
      keep = np.sort(np.random.default_rng([seed, 2]).permutation(len(y_tr))[
          :len(y_tr) - validation])
      x_tr, y_tr, r_tr = x_tr[keep], y_tr[keep], r_tr[keep]
    if subsample:
      n_tr = round(subsample * len(y_tr) / (len(y_tr) + len(y_te)))
      x_tr, y_tr, r_tr = x_tr[:n_tr], y_tr[:n_tr], r_tr[:n_tr]
      n_te = subsample - n_tr
      x_te, y_te, r_te = x_te[:n_te], y_te[:n_te], r_te[:n_te]
  x = np.concatenate([x_tr, x_te])
  y = np.concatenate([y_tr, y_te]).astype(np.int32)
  split = np.concatenate([np.zeros(len(y_tr), np.int8), np.ones(len(y_te), np.int8)])
  rows = np.concatenate([r_tr, r_te]).astype(np.int64)
  num_train = len(y_tr)
  if pool == "pooled" and subsample:
    x, y, split, rows = x[:subsample], y[:subsample], split[:subsample], rows[:subsample]
    num_train = min(num_train, len(y))
  stats = sources.normalization(name, raw, mean, std)
  return Pool(x, y, raw.num_classes, num_train, raw.source, raw.fingerprint, stats, split,
              rows)


def public_holdout(candidates: np.ndarray, *, public: int, seed: int,
                   num_clients: int) -> np.ndarray:
  """``candidates`` minus the last ``public`` of a seeded permutation (sorted).

  The held-out examples stay in the pool as the server's public set (Moss) and no client
  holds them.
  """
  if not public:
    return candidates
  pool_sizes(len(candidates), 0, num_clients=num_clients,
             public=public)  # raises when too few are left
  perm = np.random.default_rng([seed, 1]).permutation(len(candidates))
  return np.sort(candidates[perm[:len(candidates) - public]])


def partition_clients(y: np.ndarray, num_classes: int, num_train: int | None = None,
                      fingerprint: str = "", *, num_clients: int, seed: int,
                      partition: str, classes_per_client: int = 0, alpha: float = 1.0,
                      shares: str = "uniform", test_fraction: float = 0.2,
                      pool: str = "pooled", public: int = 0, partition_path: str = ""):
  """Per-client (train, test) index lists and class counts, deterministic from the seed.

  ``config_lib.partition_args(config)`` gives the keyword arguments of a config.

  Args:
    y: int [P] labels of the pool.
    num_classes: C.
    num_train: rows of the pool from the train split (``Pool.num_train``); needed by
      ``'official'`` (default: all rows).
    fingerprint: the data's fingerprint, checked against a partition file's.
    num_clients, seed: N and the run's seed.
    partition: ``partition.kind``: one of ``partition.PARTITIONS`` or ``'file'`` (the
      tables of ``partition_path``, ``fedjax_het.data.partition_file``).
    classes_per_client, alpha, shares, test_fraction: ``partition.*`` (0 classes per
      client: the papers' count for C).
    pool: ``data.pool``.
    public: ``data.public``: examples held out from every client (``public_holdout``).

  Returns:
    (train, test, counts): lists of N int64 index arrays into the pool, and int
    [N, 2, C] train and test class counts.
  """
  if partition == "file":
    train, test = partition_file.read(partition_path, num_clients=num_clients,
                                      pool_size=len(y), fingerprint=fingerprint,
                                      public=public)
    return train, test, np.stack([class_counts(y, train, num_classes),
                                  class_counts(y, test, num_classes)], axis=1)
  kwargs = dict(kind=partition, seed=seed, num_classes=num_classes,
                classes_per_client=(classes_per_client
                                    or papers_classes_per_client(num_classes)),
                alpha=alpha, shares=shares)
  holdout = dict(public=public, seed=seed, num_clients=num_clients)
  if pool == "official":
    num_train = len(y) if num_train is None else num_train
    rest = public_holdout(np.arange(num_train), **holdout)
    train = [rest[np.asarray(i, np.int64)] for i in
             partition_lib(y[rest], num_clients, **kwargs)]
    train_counts = class_counts(y, train, num_classes)
    test = [num_train + i for i in
            split_like(y[num_train:], train_counts, seed=seed + 1)]
  else:
    rest = public_holdout(np.arange(len(y)), **holdout)
    parts = partition_lib(y[rest], num_clients, **kwargs)
    parts = [rest[np.asarray(idx, np.int64)] for idx in parts]
    train, test = train_test_split(parts, seed=seed, test_fraction=test_fraction)
  counts = np.stack([class_counts(y, train, num_classes),
                     class_counts(y, test, num_classes)], axis=1)
  return train, test, counts


def load_clients(*, name: str, seed: int, num_clients: int, partition: str,
                 path: str = "", num_classes: int = 0, pool: str = "pooled",
                 subsample: int = 0, subsample_per_class: int = 0, validation: int = 0,
                 public: int = 0, mean: str = "", std: str = "",
                 classes_per_client: int = 0, alpha: float = 1.0, shares: str = "uniform",
                 test_fraction: float = 0.2, partition_path: str = ""
                 ) -> tuple[Pool, list, list, np.ndarray]:
  """The pool and its clients: ``(pool, train, test, counts)``.

  ``load_pool`` then ``partition_clients`` (a partition file is checked against the
  pool), taking the arguments of both: what the simulator and every process of a
  deployment build first (``config_lib.data_args(config)`` gives those of a config).

  Raises:
    ValueError: more clients than examples, or a bad partition file.
  """
  data = load_pool(name=name, seed=seed, num_clients=num_clients, path=path,
                   num_classes=num_classes, pool=pool, subsample=subsample,
                   subsample_per_class=subsample_per_class, validation=validation,
                   mean=mean, std=std)
  pool_sizes(data.num_train, len(data.y) - data.num_train,
             num_clients=num_clients)  # raises with more clients than examples
  train, test, counts = partition_clients(
      data.y, data.num_classes, data.num_train, data.fingerprint, num_clients=num_clients,
      seed=seed, partition=partition, classes_per_client=classes_per_client, alpha=alpha,
      shares=shares, test_fraction=test_fraction, pool=pool, public=public,
      partition_path=partition_path)
  return data, train, test, counts
