"""Client partitions as files: a run's exact client tables out, a partition of yours in.

Every run writes ``partition_indices.npz`` into its workdir (``save``): for each client
k its train and test indices into the run's *pool*, the examples the run partitions
(``data.pool``: the dataset's train split in canonical row order, then its test split,
after ``data.subsample`` / ``data.validation``; see ``fedjax_het.data.pool``). Given
back (``partition.kind='file'``, ``partition.path=<file>``) it reproduces the run's
clients exactly; a partition of your own or another library's goes in the same way.

Formats (``FORMATS``):

- ``.npz``: ``train_0, test_0, train_1, ...`` (1-D integer arrays), optionally
  ``pool_size`` and ``fingerprint`` (0-d: the pool and data it was written for, checked
  when present), and in an exported file ``pool_split`` int8 [P] (0: the source's
  train split, 1: its test split) and ``pool_row`` int64 [P] (the row of the source
  file's split that each pool row is), which map the indices back to the original
  arrays for another library.
- ``.json``: ``{"train": [[...], ...], "test": [[...], ...]}`` (optionally
  ``"pool_size"``, ``"fingerprint"``).

``read`` checks a file against the run before anything is computed (``check``): one
train and one test table per client, ``num_clients`` of them, indices within the pool,
no client without train or test examples, no example twice (within a table, in a
client's train and test, or in two clients), and enough examples no client holds for a
public set of ``data.public``.
"""
from __future__ import annotations

import json
import os
import re
import zipfile
from typing import NamedTuple, Sequence

import numpy as np

FORMATS = (".npz", ".json")
INDICES_FILE = "partition_indices.npz"  # what a run writes into its workdir


class ClientTables(NamedTuple):
  """Every client's examples, as indices into a pool.

  Attributes:
    train, test: one sorted int64 index array per client.
    pool_size: examples in the pool the indices point into.
    fingerprint: the dataset's fingerprint (``sources.fingerprint``), or ''.
    pool_split: int8 [pool_size] source split of each pool row (0 train, 1 test), or None.
    pool_row: int64 [pool_size] row of each pool row in its source split, or None.
  """
  train: list
  test: list
  pool_size: int
  fingerprint: str = ""
  pool_split: np.ndarray | None = None
  pool_row: np.ndarray | None = None


def _where(path: str) -> str:
  return f"partition file {path!r}"


def save(path: str, tables: ClientTables) -> None:
  """Writes ``tables`` to ``path`` (``.npz`` or ``.json``, see the module docstring)."""
  ext = os.path.splitext(path)[1]
  if ext not in FORMATS:
    raise ValueError(f"{_where(path)}: expected one of {list(FORMATS)}")
  if ext == ".json":
    with open(path, "w") as f:
      json.dump({"train": [np.asarray(t).tolist() for t in tables.train],
                 "test": [np.asarray(t).tolist() for t in tables.test],
                 "pool_size": int(tables.pool_size), "fingerprint": tables.fingerprint}, f)
    return
  arrays = {f"{kind}_{k}": np.asarray(t, np.int64)
            for kind, table in (("train", tables.train), ("test", tables.test))
            for k, t in enumerate(table)}
  arrays.update(pool_size=np.asarray(tables.pool_size, np.int64),
                fingerprint=np.asarray(tables.fingerprint))
  if tables.pool_split is not None:
    arrays.update(pool_split=np.asarray(tables.pool_split, np.int8),
                  pool_row=np.asarray(tables.pool_row, np.int64))
  tmp = f"{path}.tmp.npz"
  np.savez(tmp, **arrays)
  os.replace(tmp, path)


def _tables_npz(path: str) -> tuple[list, list, dict]:
  """(train, test, metadata) of an ``.npz`` partition file."""
  try:
    with np.load(path, allow_pickle=False) as data:
      arrays = {k: data[k] for k in data.files}
  except (zipfile.BadZipFile, OSError, EOFError, ValueError, AttributeError) as err:
    raise ValueError(f"{_where(path)} is not a readable .npz of train_<k>/test_<k> "
                     f"arrays ({err})") from err
  tables = {}
  for key in arrays:
    m = re.fullmatch(r"(train|test)_(\d+)", key)
    if m:
      tables.setdefault(m.group(1), {})[int(m.group(2))] = arrays[key]
  out = []
  for kind in ("train", "test"):
    found = tables.get(kind, {})
    if sorted(found) != list(range(len(found))) or not found:
      raise ValueError(f"{_where(path)}: expected arrays {kind}_0 .. {kind}_<N-1> (one "
                       f"per client); found {sorted(k for k in arrays)}")
    out.append([found[k] for k in range(len(found))])
  meta = {k: arrays[k].item() for k in ("pool_size", "fingerprint") if k in arrays}
  return out[0], out[1], meta


def _tables_json(path: str) -> tuple[list, list, dict]:
  """(train, test, metadata) of a ``.json`` partition file."""
  try:
    with open(path) as f:
      data = json.load(f)
  except (OSError, ValueError) as err:
    raise ValueError(f"{_where(path)} is not readable JSON ({err})") from err
  if not isinstance(data, dict) or not all(isinstance(data.get(k), list)
                                           for k in ("train", "test")):
    raise ValueError(f'{_where(path)}: expected {{"train": [[...], ...], "test": '
                     "[[...], ...]}} (one index list per client)")
  meta = {k: data[k] for k in ("pool_size", "fingerprint") if k in data}
  return data["train"], data["test"], meta


def load(path: str) -> tuple[list[np.ndarray], list[np.ndarray], dict]:
  """``(train, test, metadata)`` of a partition file, as int64 arrays (unchecked).

  Raises:
    FileNotFoundError: no such file.
    ValueError: an unknown extension, an unreadable file, or tables that are not lists
      of integer indices.
  """
  ext = os.path.splitext(path)[1]
  if ext not in FORMATS:
    raise ValueError(f"config.partition.path={path!r}: expected a file ending in "
                     f"{list(FORMATS)}")
  if not os.path.isfile(path):
    raise FileNotFoundError(f"config.partition.path={path!r} does not exist")
  train, test, meta = (_tables_json if ext == ".json" else _tables_npz)(path)
  out = []
  for kind, table in (("train", train), ("test", test)):
    arrays = []
    for k, t in enumerate(table):
      a = np.asarray(t)
      if a.ndim != 1 or not (np.issubdtype(a.dtype, np.integer) or a.size == 0):
        raise ValueError(f"{_where(path)}: client {k}'s {kind} table has dtype {a.dtype} "
                         f"and shape {a.shape}; expected a 1-D list of integer indices")
      arrays.append(a.astype(np.int64))
    out.append(arrays)
  return out[0], out[1], meta


def check(train: Sequence[np.ndarray], test: Sequence[np.ndarray], *, num_clients: int,
          pool_size: int, public: int = 0, where: str = "partition") -> None:
  """Raises ValueError naming the first problem of client tables for a run.

  Args:
    train, test: one int index array per client.
    num_clients: ``config.num_clients``.
    pool_size: examples in the run's pool.
    public: ``config.data.public``: examples no client may hold (the server's).
    where: what the tables are, for messages.
  """
  if len(train) != len(test):
    raise ValueError(f"{where}: {len(train)} train tables but {len(test)} test tables; "
                     "expected one of each per client")
  if len(train) != num_clients:
    raise ValueError(f"{where}: holds {len(train)} clients; config.num_clients="
                     f"{num_clients}")
  for kind, table in (("train", train), ("test", test)):
    for k, t in enumerate(table):
      if not len(t):
        raise ValueError(f"{where}: client {k} has no {kind} examples")
      if t.min() < 0 or t.max() >= pool_size:
        raise ValueError(f"{where}: client {k}'s {kind} indices lie in [{t.min()}, "
                         f"{t.max()}]; the pool has {pool_size} examples (indices "
                         f"[0, {pool_size}))")
  _check_disjoint(train, test, where)
  held = len(np.unique(np.concatenate(list(train) + list(test))))
  if pool_size - held < public:
    raise ValueError(f"{where}: the clients hold {held} of the pool's {pool_size} "
                     f"examples, which leaves {pool_size - held} for the public set of "
                     f"config.data.public={public}")


def _check_disjoint(train, test, where: str) -> None:
  """ValueError naming the first example held twice (and by whom)."""
  owners = [(k, kind) for kind, table in (("train", train), ("test", test))
            for k in range(len(table))]
  tables = list(train) + list(test)
  flat = np.concatenate(tables)
  who = np.repeat(np.arange(len(tables)), [len(t) for t in tables])
  order = np.argsort(flat, kind="stable")
  same = np.flatnonzero(flat[order][1:] == flat[order][:-1])
  if not len(same):
    return
  i, j = who[order[same[0]]], who[order[same[0] + 1]]
  index = flat[order[same[0]]]
  (ki, kind_i), (kj, kind_j) = owners[i], owners[j]
  if i == j:
    what = f"client {ki}'s {kind_i} table holds index {index} twice"
  elif ki == kj:
    what = f"client {ki}'s train and test tables both hold index {index}"
  else:
    what = (f"index {index} is held by two clients: {ki} ({kind_i}) and {kj} "
            f"({kind_j})")
  raise ValueError(f"{where}: {what}; every example may belong to one client's train "
                   "or test split only")


def read(path: str, *, num_clients: int, pool_size: int, fingerprint: str = "",
         public: int = 0) -> tuple[list[np.ndarray], list[np.ndarray]]:
  """A partition file's ``(train, test)`` tables, checked against the run.

  Besides ``check``: a file that records the pool size or data fingerprint it was
  written for must match this run's.
  """
  train, test, meta = load(path)
  where = _where(path)
  if "pool_size" in meta and int(meta["pool_size"]) != pool_size:
    raise ValueError(f"{where} was written for a pool of {int(meta['pool_size'])} "
                     f"examples; this config's pool has {pool_size} (data.name, "
                     "data.subsample, data.pool and data.validation decide the pool)")
  if meta.get("fingerprint") and fingerprint and meta["fingerprint"] != fingerprint:
    raise ValueError(f"{where} was written for data of fingerprint "
                     f"{meta['fingerprint']}; this config's data has {fingerprint}")
  check(train, test, num_clients=num_clients, pool_size=pool_size, public=public,
        where=where)
  return [np.sort(t) for t in train], [np.sort(t) for t in test]
