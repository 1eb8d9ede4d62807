"""The device-side view of a partitioned dataset: one image pool, padded index tables.

Images and labels stay in ONE pooled array (``FederatedData.x``, ``.y``). Clients are
grouped by model architecture; each group holds ``ClientIndex`` tables of indices into
the pool, padded to fixed shapes and carrying masks, so a compiled round never changes
shape:

- the client axis of a group is padded to a multiple of the device count with dummy
  clients (all masks False, counts 0);
- the example axis is padded to a multiple of the batch size with index 0, mask False.

``Layout`` is the static (hashable, non-pytree) side: which real client sits at which
position of which group.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import flax
import jax
import numpy as np

from fedjax_het.sharding import round_up


@flax.struct.dataclass
class ClientIndex:
  """Padded example tables of the clients of one architecture group.

  ``n`` is the group's client count after padding; padded entries (dummy clients,
  positions past a client's count) have index 0 and mask False. Real examples come first.

  Attributes:
    train_idx: int32 [n, max_train] indices into the pool of each client's train set.
    train_mask: bool [n, max_train], True on real entries.
    test_idx: int32 [n, max_test] indices of each client's test set.
    test_mask: bool [n, max_test].
    num_train: int32 [n] real train examples (0 for dummy clients).
    num_test: int32 [n] real test examples (0 for dummy clients).
  """
  train_idx: np.ndarray
  train_mask: np.ndarray
  test_idx: np.ndarray
  test_mask: np.ndarray
  num_train: np.ndarray
  num_test: np.ndarray


@flax.struct.dataclass
class FederatedData:
  """The pooled examples and the index tables of every group.

  Attributes:
    x: uint8 [P, H, W, C] pooled images (replicated on devices).
    y: int32 [P] pooled labels.
    groups: one ``ClientIndex`` per architecture group, in ``Layout.archs`` order
      (leading client axis sharded on devices).
  """
  x: np.ndarray
  y: np.ndarray
  groups: tuple[ClientIndex, ...]


@dataclasses.dataclass(frozen=True)
class Layout:
  """Static description of the groups (hashable; safe as a jit static argument).

  Attributes:
    archs: architecture name of each group.
    client_ids: the real client ids of each group, in their order on the client axis.
    padded_sizes: each group's client-axis length after padding.
    num_clients: total real clients.
    num_classes: number of classes.
    image_shape: (H, W, C) of one image (the models are initialised with it).
  """
  archs: tuple[str, ...]
  client_ids: tuple[tuple[int, ...], ...]
  padded_sizes: tuple[int, ...]
  num_clients: int
  num_classes: int
  image_shape: tuple[int, ...] = (32, 32, 3)

  def __post_init__(self):
    if not len(self.archs) == len(self.client_ids) == len(self.padded_sizes):
      raise ValueError(f"Layout: {len(self.archs)} archs, {len(self.client_ids)} "
                       f"client_ids and {len(self.padded_sizes)} padded_sizes; expected "
                       "one of each per group")
    ids = sorted(i for g in self.client_ids for i in g)
    if ids != list(range(self.num_clients)):
      raise ValueError(f"Layout: client_ids must hold each of 0..{self.num_clients - 1} "
                       f"exactly once; got {self.client_ids}")
    for ids_g, size in zip(self.client_ids, self.padded_sizes):
      if size < len(ids_g):
        raise ValueError(f"Layout: padded size {size} < {len(ids_g)} real clients")

  @property
  def num_groups(self) -> int:
    """Number of architecture groups."""
    return len(self.archs)

  @property
  def group_sizes(self) -> tuple[int, ...]:
    """Real (unpadded) clients of each group."""
    return tuple(len(ids) for ids in self.client_ids)

  def group_of(self, client_id: int) -> tuple[int, int]:
    """``(group, position on the group's client axis)`` of a client."""
    for g, ids in enumerate(self.client_ids):
      if client_id in ids:
        return g, ids.index(client_id)
    raise ValueError(f"client_id={client_id} is not in [0, {self.num_clients})")


def group_clients(client_archs: Sequence[str]) -> tuple[tuple[str, ...],
                                                         tuple[tuple[int, ...], ...]]:
  """Groups client ids by architecture, groups ordered by first appearance.

  Args:
    client_archs: architecture name of each client, e.g. ``['cnn1', 'cnn2', 'cnn1']``.

  Returns:
    ``(archs, client_ids)``, e.g. ``(('cnn1', 'cnn2'), ((0, 2), (1,)))``.
  """
  groups: dict[str, list[int]] = {}
  for k, arch in enumerate(client_archs):
    groups.setdefault(arch, []).append(k)
  return tuple(groups), tuple(tuple(ids) for ids in groups.values())


def pad_table(indices: Sequence[np.ndarray], num_rows: int,
              multiple: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Stacks index arrays into a padded table.

  Args:
    indices: one index array per real client (``len(indices) <= num_rows``).
    num_rows: rows after padding (the extra rows are dummy clients).
    multiple: the width is the longest array rounded up to this (at least ``multiple``).

  Returns:
    ``(idx int32 [num_rows, width], mask bool [num_rows, width], counts int32
    [num_rows])``; padding has index 0 and mask False.
  """
  longest = max([len(i) for i in indices] + [1])
  width = round_up(longest, multiple)
  idx = np.zeros((num_rows, width), np.int32)
  mask = np.zeros((num_rows, width), bool)
  counts = np.zeros(num_rows, np.int32)
  for row, ind in enumerate(indices):
    idx[row, :len(ind)] = ind
    mask[row, :len(ind)] = True
    counts[row] = len(ind)
  return idx, mask, counts


def _check_inputs(x, y, train_indices, test_indices, client_archs, num_classes,
                  pad_clients_to, pad_examples_to) -> None:
  """ValueError naming the first inconsistent input of ``build_federated_data``."""
  if len(x) != len(y):
    raise ValueError(f"x has {len(x)} examples but y has {len(y)}")
  if not len(train_indices) == len(test_indices) == len(client_archs):
    raise ValueError(f"{len(train_indices)} train_indices, {len(test_indices)} "
                     f"test_indices and {len(client_archs)} client_archs; expected one "
                     "of each per client")
  if not client_archs:
    raise ValueError("no clients: client_archs is empty")
  if pad_clients_to < 1 or pad_examples_to < 1:
    raise ValueError(f"pad_clients_to={pad_clients_to} and pad_examples_to="
                     f"{pad_examples_to} must be >= 1")
  if len(y) and (y.min() < 0 or y.max() >= num_classes):
    raise ValueError(f"labels lie in [{y.min()}, {y.max()}]; expected [0, "
                     f"num_classes={num_classes})")
  for name, table in (("train", train_indices), ("test", test_indices)):
    for k, ind in enumerate(table):
      if len(ind) and (np.min(ind) < 0 or np.max(ind) >= len(x)):
        raise ValueError(f"client {k}: {name} indices must lie in [0, {len(x)})")


def build_federated_data(x: np.ndarray, y: np.ndarray,
                         train_indices: Sequence[np.ndarray],
                         test_indices: Sequence[np.ndarray],
                         client_archs: Sequence[str], *, num_classes: int,
                         pad_clients_to: int = 1,
                         pad_examples_to: int = 1) -> tuple[FederatedData, Layout]:
  """Builds the pooled arrays and the padded per-group index tables.

  Args:
    x: uint8 [P, H, W, C] pooled images.
    y: int [P] pooled labels.
    train_indices: ``train_indices[k]`` indices into x/y of client k's train set.
    test_indices: same for the test sets.
    client_archs: architecture name of each client.
    num_classes: number of classes.
    pad_clients_to: each group's client axis is padded to a multiple of this (the
      device count) with dummy clients.
    pad_examples_to: each group's ``max_train`` and ``max_test`` are padded to a multiple
      of this (the batch size).

  Returns:
    ``(FederatedData of numpy arrays, Layout)``; the caller places arrays on devices.

  Raises:
    ValueError: inconsistent lengths, out-of-range indices or labels.
  """
  x, y = np.asarray(x), np.asarray(y)
  _check_inputs(x, y, train_indices, test_indices, client_archs, num_classes,
                pad_clients_to, pad_examples_to)
  archs, client_ids = group_clients(client_archs)
  padded = tuple(round_up(len(ids), pad_clients_to) for ids in client_ids)
  groups = []
  for ids, rows in zip(client_ids, padded):
    tr = pad_table([train_indices[k] for k in ids], rows, pad_examples_to)
    te = pad_table([test_indices[k] for k in ids], rows, pad_examples_to)
    groups.append(ClientIndex(train_idx=tr[0], train_mask=tr[1], test_idx=te[0],
                              test_mask=te[1], num_train=tr[2], num_test=te[2]))
  layout = Layout(archs=archs, client_ids=client_ids, padded_sizes=padded,
                  num_clients=len(client_archs), num_classes=num_classes,
                  image_shape=tuple(int(d) for d in x.shape[1:]))
  return FederatedData(x=x, y=y.astype(np.int32), groups=tuple(groups)), layout


def unpad_clients(values_per_group: Sequence[np.ndarray], layout: Layout) -> np.ndarray:
  """Merges per-group values (leading padded client axis) into client-id order.

  Args:
    values_per_group: one array per group of shape [padded_sizes[g], ...].
    layout: the ``Layout`` the groups follow.

  Returns:
    [num_clients, ...] array: row k is client k's value; dummy clients are dropped.
  """
  if len(values_per_group) != layout.num_groups:
    raise ValueError(f"got {len(values_per_group)} arrays; expected one per group "
                     f"({layout.num_groups})")
  values = [np.asarray(v) for v in values_per_group]
  for g, (v, size) in enumerate(zip(values, layout.padded_sizes)):
    if v.ndim == 0 or v.shape[0] != size:
      raise ValueError(f"group {g}: leading axis {v.shape[:1]} must be the padded "
                       f"client count {size}")
  out = np.empty((layout.num_clients,) + values[0].shape[1:],
                 np.result_type(*values))
  for v, ids in zip(values, layout.client_ids):
    out[list(ids)] = v[:len(ids)]
  return out


def pad_examples(index: ClientIndex, train_width: int, test_width: int) -> ClientIndex:
  """``index`` with its example axes padded to ``train_width`` / ``test_width``.

  Padding has index 0 and mask False, so a padded table trains and evaluates exactly as
  the original (``clients.epoch_batches`` puts real examples first; JAX's random draws of
  a longer shape start with those of the shorter one). Used to stack the tables of runs
  with other seeds (other partitions) on one replica axis.
  """
  def pad(a, width):
    extra = width - a.shape[1]
    if extra < 0:
      raise ValueError(f"cannot pad a table of width {a.shape[1]} to {width}")
    return np.pad(a, ((0, 0), (0, extra)))
  return index.replace(train_idx=pad(index.train_idx, train_width),
                       train_mask=pad(index.train_mask, train_width),
                       test_idx=pad(index.test_idx, test_width),
                       test_mask=pad(index.test_mask, test_width))


def stack_replicas(datas: Sequence[FederatedData]) -> tuple[FederatedData, FederatedData]:
  """The data of S runs on a leading replica axis, and the ``vmap`` axes to read it.

  Each group's tables are padded to the widest of the S runs (``pad_examples``) and
  stacked ``[S, n_g, ...]``. The pooled ``x``/``y`` are stacked too unless every run holds
  the same pool (then one copy is shared: axis None).

  Returns:
    ``(stacked data of numpy arrays, in_axes)``: ``in_axes`` is a ``FederatedData`` whose
    leaves are 0 (stacked) or None (shared), for ``jax.vmap(..., in_axes=...)``.
  """
  first = datas[0]
  shared = all(d.x.shape == first.x.shape and np.array_equal(d.y, first.y)
               and np.array_equal(d.x, first.x) for d in datas[1:])
  groups, axes = [], []
  for g in range(len(first.groups)):
    tables = [d.groups[g] for d in datas]
    tw = max(t.train_idx.shape[1] for t in tables)
    sw = max(t.test_idx.shape[1] for t in tables)
    tables = [pad_examples(t, tw, sw) for t in tables]
    groups.append(jax.tree.map(lambda *a: np.stack(a), *tables))
    axes.append(ClientIndex(*([0] * 6)))
  x = first.x if shared else np.stack([d.x for d in datas])
  y = first.y if shared else np.stack([d.y for d in datas])
  axis = None if shared else 0
  return (FederatedData(x=x, y=y, groups=tuple(groups)),
          FederatedData(x=axis, y=axis, groups=tuple(axes)))

