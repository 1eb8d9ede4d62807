"""A group's stacked client state packed as one contiguous buffer per dtype.

The algorithms write a client's state as a pytree (``base.ClientState``: params, model
state, optimizer state); a group of ``n_g`` clients stacks every leaf on a leading
client axis. Stored leaf by leaf, a round gathers the sampled clients' rows of every leaf
and scatters them back, and XLA sees one gather and one scatter (with their bounds
handling) per leaf and group: for an algorithm of many leaves over several
architectures, most of the largest computation of a round (docs/performance.md,
"Program size and compile cost"). ``Packed`` holds the same values as one buffer per dtype, ``[..., n_g,
size]`` (each client's leaves raveled in tree order and concatenated), so a round gathers
and scatters its clients with one op per buffer, and a finiteness check is one reduction
per buffer. A client's tree is rebuilt inside its own step with static slices and
reshapes (``unpack``), which XLA fuses into the ops that read them.

``Packed`` is a pytree whose leaves are its buffers, keyed by dtype name
(``clients/0/float32`` in a checkpoint), and whose static part is the
``PackSpec`` (tree structure, leaf shapes and dtypes, offsets): ``jax.tree.map``,
shardings, ``jax.eval_shape``, donation and orbax see buffers. ``unpack`` (the method)
gives the stacked tree, a copy: ``state.clients[g].unpack().params``; ``replace`` packs
a changed tree again (``state.clients[g].replace(params=...)``). A field of arrays only
reads through (FedAPEN's ``state.clients[g].model_state``, an ``ApenState``); one that
holds dicts or lists (``state.clients[g].params``) is refused with a ``PackedReadError``
saying both calls, because it would be a copy, and ``state.clients[g].params[k] = v``
would write nothing.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

PyTree = Any


class LeafSpec(NamedTuple):
  """Where one leaf of a client's state lives: ``buffers[dtype][offset:offset + size]``."""
  shape: tuple[int, ...]
  dtype: str
  offset: int
  size: int


class PackSpec(NamedTuple):
  """The static half of a ``Packed``: the client tree's structure and its leaves' places.

  Attributes:
    treedef: structure of one client's state.
    leaves: ``LeafSpec`` per leaf, in ``jax.tree.leaves`` order.
    dtypes: the buffers' dtype names, in order of first appearance.
  """
  treedef: Any
  leaves: tuple[LeafSpec, ...]
  dtypes: tuple[str, ...]

  def sizes(self) -> dict[str, int]:
    """Scalars per client in each buffer."""
    out = dict.fromkeys(self.dtypes, 0)
    for leaf in self.leaves:
      out[leaf.dtype] += leaf.size
    return out


def pack_spec(tree: PyTree, lead: int = 1) -> PackSpec:
  """The ``PackSpec`` of ``tree``, whose leaves have ``lead`` leading (client) axes.

  Works on arrays and on ``jax.ShapeDtypeStruct`` leaves alike.
  """
  leaves, treedef = jax.tree.flatten(tree)
  offsets: dict[str, int] = {}
  specs = []
  for leaf in leaves:
    shape = tuple(leaf.shape[lead:])
    dtype = np.dtype(leaf.dtype).name
    size = int(np.prod(shape, dtype=np.int64))
    specs.append(LeafSpec(shape, dtype, offsets.get(dtype, 0), size))
    offsets[dtype] = offsets.get(dtype, 0) + size
  return PackSpec(treedef, tuple(specs), tuple(offsets))


class PackedReadError(TypeError):
  """Reading a field of a packed state that holds dicts or lists (``state.clients[g].params``):
  the value would be a copy, and a write into it lost; the message says what to call."""


def holds_container(value) -> bool:
  """Whether ``value`` is or holds a dict or a list (a container a write can go into)."""
  mutable = lambda x: isinstance(x, (dict, list))  # noqa: E731
  return any(mutable(x) for x in jax.tree.leaves(value, is_leaf=mutable))


@jax.tree_util.register_pytree_with_keys_class
class Packed:
  """A stacked client state as one buffer per dtype (see module docstring).

  Attributes:
    buffers: ``{dtype name: array [..., n, size]}``: the leading axes are the client
      axis (and a replica axis before it on ``loop.run_seeds``' stacked states), the last
      one every leaf of one client raveled and concatenated.
    spec: the ``PackSpec`` (static).
  """

  def __init__(self, buffers: dict, spec: PackSpec):
    self.buffers = buffers
    self.spec = spec

  def tree_flatten_with_keys(self):
    children = tuple((jax.tree_util.DictKey(d), self.buffers[d]) for d in self.spec.dtypes)
    return children, self.spec

  def tree_flatten(self):
    return tuple(self.buffers[d] for d in self.spec.dtypes), self.spec

  @classmethod
  def tree_unflatten(cls, spec, children):
    return cls(dict(zip(spec.dtypes, children)), spec)

  def unpack(self) -> PyTree:
    """The stacked tree, every leaf ``[..., n, *shape]`` (``unpack``)."""
    return unpack(self)

  def replace(self, **changes) -> Packed:
    """The packed tree with fields replaced, packed again (``ClientState.replace`` of
    the stacked state): ``state.clients[g].replace(params=...)`` writes, as on a tree.

    Raises:
      ValueError: a change alters the tree's structure, or the tree has no ``replace``.
    """
    tree = unpack(self)
    if not hasattr(tree, "replace"):
      raise ValueError(f"Packed.replace: the packed tree is a {type(tree).__name__}, not a "
                       "dataclass; write packing.pack_like(x.spec, new_tree, lead) instead")
    lead = len(self.buffers[self.spec.dtypes[0]].shape) - 1
    return pack_like(self.spec, tree.replace(**changes), lead)

  def __getattr__(self, name: str):
    # only reached for names a Packed lacks: the packed tree's own attributes
    # (``.params``, ``.opt_state``), read from the unpacked stacked tree
    if name.startswith("__") or name in ("buffers", "spec"):
      raise AttributeError(name)
    value = getattr(unpack(self), name)
    if holds_container(value):
      # a fresh copy: an item written into it (``x.params[k] = v``) would be lost
      raise PackedReadError(
          f"packed client state: .{name} would be a copy of the group's buffers, so a "
          f"write into it would be lost; read it with .unpack().{name}, write it with "
          f".replace({name}=...)")
    return value

  def __repr__(self) -> str:
    shapes = {d: tuple(getattr(b, "shape", ())) for d, b in self.buffers.items()}
    return f"Packed({shapes}, {len(self.spec.leaves)} leaves)"


def pack(tree: PyTree, lead: int = 1) -> Packed:
  """``tree`` (every leaf ``[*lead_axes, *shape]``) as a ``Packed``.

  Args:
    tree: stacked state; every leaf has the same ``lead`` leading axes.
    lead: how many leading axes are stacking axes (1: the client axis).
  """
  leaves = jax.tree.leaves(tree)
  if not leaves:
    raise ValueError("pack: the tree has no leaves (nothing to pack)")
  batch = tuple(leaves[0].shape[:lead])
  for leaf in leaves:
    if tuple(leaf.shape[:lead]) != batch:
      raise ValueError(f"pack: leaves disagree on their {lead} leading axes: "
                       f"{tuple(leaf.shape[:lead])} vs {batch}")
  return pack_like(pack_spec(tree, lead), tree, lead)


def unpack(packed: Packed) -> PyTree:
  """The tree a ``Packed`` holds, every leaf ``[*leading axes of the buffers, *shape]``."""
  spec = packed.spec
  leaves = []
  for ls in spec.leaves:
    buf = packed.buffers[ls.dtype]
    lead = tuple(buf.shape[:-1])
    if isinstance(buf, jax.ShapeDtypeStruct):
      leaves.append(jax.ShapeDtypeStruct(lead + ls.shape, buf.dtype))
      continue
    part = jax.lax.slice_in_dim(buf, ls.offset, ls.offset + ls.size, axis=buf.ndim - 1)
    leaves.append(jnp.reshape(part, lead + ls.shape))
  return jax.tree.unflatten(spec.treedef, leaves)


def pack_like(spec: PackSpec, tree: PyTree, lead: int = 0) -> Packed:
  """``tree`` packed with a given ``spec`` (leaves cast to its dtypes).

  A client's step returns its new state as a tree whose leaves may have drifted in
  dtype (weak types); ``spec`` is the group's, so the result can be written back into
  the group's buffers. ``lead``: leading axes of ``tree``'s leaves (0: one client).
  """
  leaves, treedef = jax.tree.flatten(tree)
  if treedef != spec.treedef:
    raise ValueError(f"pack_like: the state's structure changed in a step: {treedef} "
                     f"vs {spec.treedef}")
  batch = tuple(leaves[0].shape[:lead]) if leaves else ()
  parts: dict[str, list] = {d: [] for d in spec.dtypes}
  for leaf, ls in zip(leaves, spec.leaves):
    parts[ls.dtype].append(jnp.reshape(jnp.asarray(leaf).astype(ls.dtype),
                                       batch + (ls.size,)))
  buffers = {d: p[0] if len(p) == 1 else jnp.concatenate(p, axis=-1)
             for d, p in parts.items()}
  return Packed(buffers, spec)


def is_packed(x) -> bool:
  """Whether ``x`` is a ``Packed``."""
  return isinstance(x, Packed)


def as_tree(x: PyTree) -> PyTree:
  """``x``'s stacked tree: ``unpack(x)`` for a ``Packed``, otherwise ``x`` itself
  (code that reads a group's client states leaf by leaf, whichever layout holds them)."""
  return unpack(x) if is_packed(x) else x


def unpack_all(tree: PyTree) -> PyTree:
  """``tree`` with every ``Packed`` in it replaced by its stacked tree (a whole
  ``State`` leaf by leaf, as it was before the packing)."""
  return jax.tree.map(as_tree, tree, is_leaf=is_packed)


def unpack_abstract(packed: Packed) -> PyTree:
  """The stacked tree of a ``Packed`` of ``jax.ShapeDtypeStruct`` buffers, with their
  shardings (restoring a checkpoint written before client states were packed)."""
  spec = packed.spec
  leaves = []
  for ls in spec.leaves:
    buf = packed.buffers[ls.dtype]
    leaves.append(jax.ShapeDtypeStruct(tuple(buf.shape[:-1]) + ls.shape, ls.dtype,
                                       sharding=getattr(buf, "sharding", None)))
  return jax.tree.unflatten(spec.treedef, leaves)


def on_client(fn, stacked, returns_state: bool = True):
  """``fn`` (first argument: one client's state as a tree) on a row of ``stacked``.

  Where ``stacked`` is a ``Packed``, the returned function takes the client's row
  (buffers ``[size]``), unpacks it for ``fn`` and, with ``returns_state``, packs the
  state ``fn`` returns first (``(state, rest) -> (Packed row, rest)``) with the group's
  spec. Otherwise ``fn`` itself.
  """
  if not is_packed(stacked):
    return fn
  spec = stacked.spec

  def on_row(row, *args):
    out = fn(unpack(row), *args)
    if not returns_state:
      return out
    new, rest = out
    return pack_like(spec, new), rest
  return on_row


# ---- the layout of a checkpointed state (``training.checkpoint`` records it) ----------

PACKED_LAYOUT = "packed-clients"  # a group's client state a ``Packed``: clients/<g>/<dtype>
TREE_LAYOUT = "tree-clients"  # a group's client state its stacked tree (before packing)
# the names a packed group's buffers are keyed by (``Packed.tree_flatten_with_keys``)
BUFFER_NAMES = frozenset(np.dtype(t).name for t in (
    "bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
    "float16", "float32", "float64", jnp.bfloat16))


def layout_of(state: PyTree) -> str:
  """``PACKED_LAYOUT`` when ``state`` holds a ``Packed`` anywhere, else ``TREE_LAYOUT``."""
  leaves = jax.tree.leaves(state, is_leaf=is_packed)
  return PACKED_LAYOUT if any(is_packed(x) for x in leaves) else TREE_LAYOUT


def stored_layout(clients: Any) -> str:
  """The layout of a state's ``clients`` as stored (a list of dicts, orbax's tree
  metadata of a step written before the layout was recorded): packed where a group's
  keys are all buffer names."""
  groups = clients if isinstance(clients, (list, tuple)) else []
  packed = any(isinstance(g, dict) and g and set(g) <= BUFFER_NAMES for g in groups)
  return PACKED_LAYOUT if packed else TREE_LAYOUT
