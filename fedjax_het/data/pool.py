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

from fedjax_het.data.partition import (class_counts, papers_classes_per_client, partition,
                                       split_like, train_test_split)
from fedjax_het.data import partition_file, sources

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
    """What ``summary.json`` records of the data (``loop.Experiment.data_source``)."""
    stats = self.normalization
    return {"source": self.source, "fingerprint": self.fingerprint, "examples": len(self.y),
            "image_shape": list(self.image_shape), "num_classes": self.num_classes,
            "normalization": None if stats is None else {"mean": list(stats[0]),
                                                         "std": list(stats[1])}}

  def tables(self, train, test) -> partition_file.ClientTables:
    """Client tables into this pool, with what an exported partition file records."""
    return partition_file.ClientTables(list(train), list(test), len(self.y),
                                       self.fingerprint, self.pool_split, self.pool_row)


def load_pool(config) -> Pool:
  """The pool of ``config.data`` (see module docstring).

  ``data.subsample`` keeps the first N examples (``data.subsample_per_class``: N = that
  times the number of classes): of the concatenation (``'pooled'``), or of each split in
  proportion to its size (``'official'``).
  """
  raw = sources.load_dataset(config.data.name, config.data.path,
                             num_classes=config.data.num_classes)
  subsample = config.data.subsample or config.data.subsample_per_class * raw.num_classes
  x_tr, y_tr, x_te, y_te = raw.x_train, raw.y_train, raw.x_test, raw.y_test
  r_tr, r_te = (np.arange(len(y)) if r is None else r for r, y in (
      (raw.train_rows, y_tr), (raw.test_rows, y_te)))
  if config.data.pool == "official":
    if config.data.validation:
      if config.data.validation >= len(y_tr) - config.num_clients:
        raise ValueError(f"config.data.validation={config.data.validation} leaves too few "
                         f"of the {len(y_tr)} training examples for {config.num_clients} "
                         "clients")
      keep = np.sort(np.random.default_rng([config.seed, 2]).permutation(len(y_tr))[
          :len(y_tr) - config.data.validation])
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
  if config.data.pool == "pooled" and subsample:
    x, y, split, rows = x[:subsample], y[:subsample], split[:subsample], rows[:subsample]
    num_train = min(num_train, len(y))
  stats = sources.normalization(config.data.name, raw, config.data.mean, config.data.std)
  return Pool(x, y, raw.num_classes, num_train, raw.source, raw.fingerprint, stats, split,
              rows)


def public_holdout(config, candidates: np.ndarray) -> np.ndarray:
  """``candidates`` minus the last ``data.public`` of a seeded permutation (sorted).

  The held-out examples stay in the pool as the server's public set (Moss) and no client
  holds them.
  """
  if not config.data.public:
    return candidates
  if config.data.public >= len(candidates) - config.num_clients:
    raise ValueError(f"config.data.public={config.data.public} leaves too few of the "
                     f"{len(candidates)} examples for {config.num_clients} clients")
  perm = np.random.default_rng([config.seed, 1]).permutation(len(candidates))
  return np.sort(candidates[perm[:len(candidates) - config.data.public]])


def partition_clients(config, y: np.ndarray, num_classes: int, num_train: int | None = None,
                      fingerprint: str = ""):
  """Per-client (train, test) index lists and class counts, deterministic from the seed.

  Args:
    config: the run's config (``data``, ``partition``, ``num_clients``, ``seed``).
    y: int [P] labels of the pool.
    num_classes: C.
    num_train: rows of the pool from the train split (``Pool.num_train``); needed by
      ``'official'`` (default: all rows).
    fingerprint: the data's fingerprint, checked against a partition file's.

  Returns:
    (train, test, counts): lists of N int64 index arrays into the pool, and int
    [N, 2, C] train and test class counts.
  """
  p = config.partition
  if p.kind == "file":
    train, test = partition_file.read(p.path, num_clients=config.num_clients,
                                      pool_size=len(y), fingerprint=fingerprint,
                                      public=config.data.public)
    return train, test, np.stack([class_counts(y, train, num_classes),
                                  class_counts(y, test, num_classes)], axis=1)
  kwargs = dict(kind=p.kind, seed=config.seed, num_classes=num_classes,
                classes_per_client=(p.classes_per_client
                                    or papers_classes_per_client(num_classes)),
                alpha=p.alpha, shares=p.shares)
  if config.data.pool == "official":
    num_train = len(y) if num_train is None else num_train
    rest = public_holdout(config, np.arange(num_train))
    train = [rest[np.asarray(i, np.int64)] for i in
             partition(y[rest], config.num_clients, **kwargs)]
    train_counts = class_counts(y, train, num_classes)
    test = [num_train + i for i in
            split_like(y[num_train:], train_counts, seed=config.seed + 1)]
  else:
    rest = public_holdout(config, np.arange(len(y)))
    parts = partition(y[rest], config.num_clients, **kwargs)
    parts = [rest[np.asarray(idx, np.int64)] for idx in parts]
    train, test = train_test_split(parts, seed=config.seed,
                                                 test_fraction=p.test_fraction)
  counts = np.stack([class_counts(y, train, num_classes),
                     class_counts(y, test, num_classes)], axis=1)
  return train, test, counts


def load_clients(config) -> tuple[Pool, list, list, np.ndarray]:
  """The pool of ``config`` and its clients: ``(pool, train, test, counts)``.

  ``load_pool`` then ``partition_clients`` (a partition file is checked against the
  pool): what the simulator and every process of a deployment build first.

  Raises:
    ValueError: more clients than examples, or a bad partition file.
  """
  pool = load_pool(config)
  if len(pool.y) < config.num_clients:
    raise ValueError(f"config.num_clients={config.num_clients} exceeds the {len(pool.y)} "
                     "examples of the data")
  train, test, counts = partition_clients(config, pool.y, pool.num_classes, pool.num_train,
                                          pool.fingerprint)
  return pool, train, test, counts
