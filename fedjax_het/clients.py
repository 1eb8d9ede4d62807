"""Client-side runtime shared by every algorithm: sampling, batching, local SGD, evaluation.

A group holds the clients of one architecture with their state stacked on a leading
client axis. One round of a group is:

1. ``group_counts`` and ``sample_clients``: which clients of the group take part (pure
   in (key, round)); K = round(C * N) clients over all groups.
2. ``gather_clients``: their state and data index tables, ``[m, ...]``.
3. ``map_clients(local_train, ...)``: every sampled client runs ``local_epochs`` epochs of
   minibatch SGD, ``jax.vmap``-ed over clients (accelerators) or looped inside the
   compiled program (CPU, where a loop is faster); steps over padding are masked out.
4. ``scatter_clients``: the trained state goes back into the group's stacked state.

Looped on one device, 2-4 are one ``update_clients_in_place``: each sampled client's
row is read where the group's state lives, trained, and written back in place.

Padded client slots (to fill the device count) and padded examples carry masks, so the
compiled round has the same shapes every round.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from fedjax_het.data.augment import augment as augment_batch
from fedjax_het.models.preprocess import normalize

PyTree = Any
# 'debug' and 'debug_eager': the sampled clients one by one in Python, each jitted on its
# own or run op by op (``rounds.debug_round``); the rest of a run as 'sequential'
DEBUG = ("debug", "debug_eager")
PARALLELISM = ("auto", "vmap", "sequential") + DEBUG


class Batch(NamedTuple):
  """A minibatch of one client.

  Attributes:
    x: float32 [B, H, W, C] normalized images.
    y: int32 [B] labels.
    mask: bool [B], False on padding.
  """
  x: jax.Array
  y: jax.Array
  mask: jax.Array


# A local loss: (params, model_state, batch, rng) -> (loss, new_model_state).
# `model_state` holds non-trained variables (batch statistics) or None.
LossFn = Callable[[PyTree, PyTree, Batch, jax.Array], tuple[jax.Array, PyTree]]


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean of ``values`` over entries where ``mask`` is True (0 when none is)."""
  mask = mask.astype(values.dtype)
  return jnp.sum(values * mask) / jnp.maximum(jnp.sum(mask), 1.0)


def cross_entropy(logits: jax.Array, labels: jax.Array, mask: jax.Array) -> jax.Array:
  """Masked mean softmax cross-entropy; logits [B, C] (any float dtype), labels [B]."""
  losses = optax.softmax_cross_entropy_with_integer_labels(
      logits.astype(jnp.float32), labels)
  return masked_mean(losses, mask)


def num_sampled(num_clients: int, participation: float) -> int:
  """K = round(C * N) clients take part in a round (at least 1), as the papers sample."""
  return max(1, min(num_clients, int(round(participation * num_clients))))


def group_quotas(group_sizes: tuple[int, ...], participation: float
                 ) -> tuple[tuple[int, ...], tuple[float, ...]]:
  """Each group's sure share of the K clients and its fractional remainder.

  Group g's expected count is ``K * n_g / N``: its integer part is drawn every round,
  and the K - sum(floors) remaining clients go to groups drawn per round with
  probability equal to their fractional parts (``group_counts``), so every client is
  sampled with probability K / N and every round samples exactly K.

  Returns:
    (floors, fractions) per group.
  """
  n = sum(group_sizes)
  k = num_sampled(n, participation)
  expected = [k * s / n for s in group_sizes]
  floors = tuple(int(e + 1e-9) for e in expected)
  return floors, tuple(max(0.0, e - f) if e - f > 1e-9 else 0.0
                       for e, f in zip(expected, floors))


def group_counts(key: jax.Array, group_sizes: tuple[int, ...],
                 participation: float) -> jax.Array:
  """Clients each group sends this round: int32 [G], summing to K = round(C * N).

  Systematic sampling of the remainders: one uniform offset u, and group g gets an
  extra client when an integer + u falls in its slice of the cumulative fractional
  parts. Each group gets its floor plus 0 or 1 extra, with probability its fraction.
  """
  floors, fractions = group_quotas(group_sizes, participation)
  if not any(fractions):
    return jnp.asarray(floors, jnp.int32)
  cum = jnp.cumsum(jnp.asarray((0.0,) + fractions, jnp.float32))
  u = jax.random.uniform(key, ())
  extra = jnp.floor(cum[1:] - u + 1.0) - jnp.floor(cum[:-1] - u + 1.0)
  return jnp.asarray(floors, jnp.int32) + extra.astype(jnp.int32)


def group_slots(group_sizes: tuple[int, ...], participation: float) -> tuple[int, ...]:
  """Static slots per group: its floor, plus one when it has a fractional remainder."""
  floors, fractions = group_quotas(group_sizes, participation)
  return tuple(min(s, f + (1 if r else 0))
               for s, f, r in zip(group_sizes, floors, fractions))


def sample_clients(key: jax.Array, group_size: int, num: jax.Array | int,
                   num_slots: int) -> jax.Array:
  """Indices of the sampled clients of a group, padded with out-of-range slots.

  Sampling is without replacement within the group; ``num`` (this round's count from
  ``group_counts``, possibly traced) real clients fill the first slots.

  Args:
    key: PRNG key, a pure function of (seed, round, group).
    group_size: real clients in the group (padding clients are never drawn).
    num: clients to draw, at most ``num_slots``.
    num_slots: static slots (``group_slots`` rounded up to the device count); slots
      from ``num`` on get an index beyond any client, so gathers fill them with zeros
      (no data: they do no step and weigh 0) and scatters drop them.

  Returns:
    int32 [num_slots].
  """
  perm = jax.random.permutation(key, group_size).astype(jnp.int32)
  take = min(group_size, num_slots)
  idx = jnp.full((num_slots,), jnp.iinfo(jnp.int32).max, jnp.int32)
  idx = idx.at[:take].set(perm[:take])
  return jnp.where(jnp.arange(num_slots) < num, idx, jnp.iinfo(jnp.int32).max)


def gather_clients(tree: PyTree, idx: jax.Array) -> PyTree:
  """Rows ``idx`` of every leaf; out-of-range rows are zeros / False."""
  return jax.tree.map(lambda a: a.at[idx].get(mode="fill", fill_value=0), tree)


def scatter_clients(tree: PyTree, idx: jax.Array, rows: PyTree) -> PyTree:
  """Writes ``rows`` at ``idx`` into every leaf; out-of-range rows are dropped."""
  return jax.tree.map(lambda a, r: a.at[idx].set(r.astype(a.dtype), mode="drop"), tree, rows)


def row(tree: PyTree, i: jax.Array) -> PyTree:
  """Slot ``i`` of every leaf's leading axis (``i`` in range: no negative indices)."""
  return jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(
      a, i, keepdims=False, allow_negative_indices=False), tree)


def set_row(tree: PyTree, i: jax.Array, value: PyTree) -> PyTree:
  """``tree`` with slot ``i`` of every leaf's leading axis set to ``value``'s leaf, which
  XLA writes in place where ``tree`` is a loop's carry."""
  return jax.tree.map(lambda a, v: jax.lax.dynamic_update_index_in_dim(
      a, v, i, 0, allow_negative_indices=False), tree, value)


def update_clients_in_place(fn: Callable, tree: PyTree, idx: jax.Array, *args):
  """``fn`` on rows ``idx`` of ``tree`` one after another, each written back in place.

  The looped form of ``gather_clients``, ``map_clients`` and ``scatter_clients``: a
  ``lax.scan`` over the slots whose carry is the stacked state itself, so XLA reads each
  client's row where it lives and updates it in place, instead of copying the sampled
  clients' rows out and scattering their results back. The carry also holds the row's
  index, set by the slot before: each leaf's slice of a row then reads a plain index,
  as a ``lax.map`` over the group's own clients (the evaluation's) does, and XLA makes
  one kernel of the two (docs/performance.md, "Program size and compile cost").

  An out-of-range slot (padding: ``idx >= n``, or negative) reads a clamped row (a
  client's own; ``fn`` must not let a slot with no examples change anything that
  counts, as the masks do) and writes nothing.

  Args:
    fn: ``(row, *slot_args) -> (new_row, outputs)`` for one client.
    tree: the stacked state ``[n, ...]`` (a ``packing.Packed`` or a tree).
    idx: int32 ``[m]`` rows to run, without repeats (out of range: a padding slot).
    *args: per-slot arguments, leading axis ``m``.

  Returns:
    ``(tree with the rows updated, outputs stacked over the m slots)``.
  """
  n = jax.tree.leaves(tree)[0].shape[0]
  # clamped here, outside the loop, as are `valid` and `nxt`
  at = jnp.clip(idx, 0, n - 1)
  valid = (idx >= 0) & (idx < n)

  def slot(carry, inputs):
    i, stacked = carry
    nxt, valid, slot_args = inputs
    old = row(stacked, i)
    new, outputs = fn(old, *slot_args)
    new = jax.tree.map(lambda a, b: jnp.where(valid, a.astype(b.dtype), b), new, old)
    return (nxt, set_row(stacked, i, new)), outputs
  first = at[0] if idx.shape[0] else jnp.zeros((), at.dtype)
  (_, tree), outputs = jax.lax.scan(slot, (first, tree), (jnp.roll(at, -1), valid, args))
  return tree, outputs


def resolve_parallelism(parallelism: str) -> str:
  """How compiled code maps clients: 'vmap' or 'sequential'.

  'auto' -> 'vmap' on accelerators, 'sequential' on CPU (measured faster there); the
  debug modes (``DEBUG``) -> 'sequential' (what of a debug run is compiled: evaluation).
  """
  if parallelism not in PARALLELISM:
    raise ValueError(f"runtime.client_parallelism={parallelism!r}; valid: {PARALLELISM}")
  if parallelism == "auto":
    return "sequential" if jax.default_backend() == "cpu" else "vmap"
  return "sequential" if parallelism in DEBUG else parallelism


def is_debug(parallelism: str) -> bool:
  """Whether ``runtime.client_parallelism`` asks for a debug run (``rounds.debug_round``)."""
  return parallelism in DEBUG


def map_clients(fn: Callable, *args, parallelism: str, num_shards: int = 1):
  """Applies ``fn`` to every client (leading axis of each arg) inside a compiled program.

  ``vmap`` batches all clients into one computation. ``sequential`` splits the client
  axis into ``num_shards`` blocks (one per device, so sharding is kept) and loops over
  the clients of a block with ``lax.map``.
  """
  mode = resolve_parallelism(parallelism)
  if mode == "vmap":
    return jax.vmap(fn)(*args)
  m = jax.tree.leaves(args)[0].shape[0]
  if num_shards <= 1 or m % num_shards:
    return jax.lax.map(lambda a: fn(*a), args)
  split = lambda a: a.reshape((num_shards, m // num_shards) + a.shape[1:])
  merge = lambda a: a.reshape((m,) + a.shape[2:])
  out = jax.vmap(lambda blk: jax.lax.map(lambda a: fn(*a), blk))(jax.tree.map(split, args))
  return jax.tree.map(merge, out)


def select_tree(pred: jax.Array, new: PyTree, old: PyTree) -> PyTree:
  """``new`` where the scalar ``pred`` holds, else ``old`` (leaf by leaf)."""
  return jax.tree.map(lambda n, o: jnp.where(pred, n, o), new, old)


def make_batch(x_pool: jax.Array, y_pool: jax.Array, idx: jax.Array, mask: jax.Array,
               *, dtype=jnp.float32, normalization=None) -> Batch:
  """Gathers and normalizes the examples ``idx`` of the pooled data.

  ``normalization``: the dataset's ``(mean [C], std [C])`` (``preprocess.normalize``;
  None: CIFAR's).
  """
  return Batch(normalize(x_pool[idx], normalization).astype(dtype), y_pool[idx], mask)


def epoch_batches(key: jax.Array, idx: jax.Array, mask: jax.Array, batch_size: int,
                  drop_last: bool = False):
  """Shuffles a client's real examples and cuts them into ``[steps, batch_size]``.

  Real examples come first in random order, padding last, so every step but the last
  non-empty one is full. ``len(idx)`` must be a multiple of ``batch_size``.

  Args:
    drop_last: mask out the partial last batch (PyTorch's ``DataLoader(drop_last=True)``,
      HtFLlib's policy), so it is no step; a client with fewer than ``batch_size``
      examples then takes no step. False (the FedMRL authors' ``DataLoader``) keeps it as
      a step over its few examples.
  """
  order = jnp.argsort(jnp.where(mask, jax.random.uniform(key, mask.shape), 2.0))
  shape = (idx.shape[0] // batch_size, batch_size)
  mask = mask[order]
  if drop_last:
    full = jnp.sum(mask) // batch_size * batch_size
    mask = mask & (jnp.arange(mask.shape[0]) < full)
  return idx[order].reshape(shape), mask.reshape(shape)


class LocalResult(NamedTuple):
  """What local training returns for one client."""
  params: PyTree
  model_state: PyTree
  opt_state: PyTree
  loss: jax.Array  # mean training loss over the steps taken
  steps: jax.Array  # number of real SGD steps


def local_train(loss_fn: LossFn, optimizer: optax.GradientTransformation,
                params: PyTree, model_state: PyTree, opt_state: PyTree,
                x_pool: jax.Array, y_pool: jax.Array, idx: jax.Array, mask: jax.Array,
                key: jax.Array, *, epochs: int, batch_size: int,
                dtype=jnp.float32, augment: str = "none",
                drop_last: bool = False, normalization=None) -> LocalResult:
  """Minibatch SGD of one client: ``lax.scan`` over epochs and steps.

  Args:
    loss_fn: ``(params, model_state, batch, rng) -> (loss, model_state)``.
    optimizer: optax transform (SGD in the papers).
    params, model_state, opt_state: the client's trainable params, non-trained
      variables (or None) and optimizer state.
    x_pool, y_pool: pooled images uint8 [P, H, W, C] and labels int32 [P].
    idx, mask: the client's example indices int32 [n_max] and mask bool [n_max];
      ``n_max`` is a multiple of ``batch_size``.
    key: PRNG key of this client and round.
    epochs, batch_size: local epochs E and batch size B.
    dtype: compute dtype of the images (bf16 for mixed precision).
    augment: augmentation set of the training batches (``data.augment``), keyed by
      ``fold_in(step key, 1)``; the loss still gets the step key itself.
    drop_last: skip each epoch's partial last batch (``epoch_batches``).
    normalization: the dataset's ``(mean, std)`` (``make_batch``; None: CIFAR's).

  Returns:
    ``LocalResult``; a step whose batch is all padding leaves everything unchanged.
  """
  grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

  def sgd_step(carry, bidx, bmask, skey):
    params, model_state, opt_state = carry
    batch = make_batch(x_pool, y_pool, bidx, bmask, dtype=dtype, normalization=normalization)
    batch = batch._replace(x=augment_batch(jax.random.fold_in(skey, 1), batch.x, augment))
    (loss, new_model_state), grads = grad_fn(params, model_state, batch, skey)
    updates, new_opt_state = optimizer.update(grads, opt_state, params)
    new = (optax.apply_updates(params, updates), new_model_state, new_opt_state)
    return new, loss.astype(jnp.float32)

  def step(carry, inputs):
    bidx, bmask, skey = inputs
    valid = jnp.any(bmask)
    # A step over padding only (a client with fewer steps than the group's longest) is
    # skipped: `cond` runs one branch in a loop (CPU's lax.map over clients); under vmap
    # it becomes a select of both, as before.
    carry, loss = jax.lax.cond(valid, sgd_step,
                               lambda c, *_: (c, jnp.zeros((), jnp.float32)),
                               carry, bidx, bmask, skey)
    return carry, (loss, valid)

  def epoch(carry, ekey):
    shuffle_key, step_key = jax.random.split(ekey)
    bidx, bmask = epoch_batches(shuffle_key, idx, mask, batch_size, drop_last)
    skeys = jax.random.split(step_key, bidx.shape[0])
    return jax.lax.scan(step, carry, (bidx, bmask, skeys))

  carry, (losses, valid) = jax.lax.scan(
      epoch, (params, model_state, opt_state), jax.random.split(key, epochs))
  steps = jnp.sum(valid)
  loss = jnp.sum(losses) / jnp.maximum(steps, 1)
  return LocalResult(*carry, loss=loss, steps=steps)


def evaluate_client(predict_fn: Callable[[jax.Array], jax.Array],
                    x_pool: jax.Array, y_pool: jax.Array, idx: jax.Array, mask: jax.Array,
                    *, batch_size: int, dtype=jnp.float32,
                    normalization=None) -> tuple[jax.Array, jax.Array]:
  """Counts correct predictions of one client on its examples ``idx``.

  Args:
    predict_fn: normalized images [B, ...] -> logits [B, C].
    idx, mask: int32 / bool [n_max], ``n_max`` a multiple of ``batch_size``.
    normalization: the dataset's ``(mean, std)`` (``make_batch``; None: CIFAR's).

  Returns:
    (correct, total) as float32 scalars.
  """
  chunks = (idx.reshape(-1, batch_size), mask.reshape(-1, batch_size))

  def count(bidx, bmask):
    batch = make_batch(x_pool, y_pool, bidx, bmask, dtype=dtype, normalization=normalization)
    pred = jnp.argmax(predict_fn(batch.x), axis=-1)
    return jnp.sum((pred == batch.y) & bmask).astype(jnp.int32)

  def chunk(args):  # a chunk of padding only is skipped (see local_train's step)
    return jax.lax.cond(jnp.any(args[1]), count, lambda *_: jnp.zeros((), jnp.int32),
                        *args)

  correct = jnp.sum(jax.lax.map(chunk, chunks))
  return correct.astype(jnp.float32), jnp.sum(mask).astype(jnp.float32)


def weighted_mean(stacked: PyTree, weights: jax.Array) -> PyTree:
  """Average over the leading (client) axis weighted by ``weights`` [m].

  Used for every aggregation rule weighted by example counts; zero-weight rows (padding,
  clients without data) do not count. A contraction over the client axis: on XLA:CPU the
  broadcast-multiply-then-sum form took 10.7 s for 10 stacked CNN-1 models against 7 ms
  for this one (benchmarks/compare.py, docs/performance.md). The client mesh uses
  ``AxisType.Auto``, so the contraction over a sharded axis needs no ``out_sharding``.
  """
  w = weights.astype(jnp.float32)
  w = w / jnp.maximum(jnp.sum(w), 1e-12)

  def avg(a):
    return jnp.tensordot(w, a.astype(jnp.float32), axes=1).astype(a.dtype)

  return jax.tree.map(avg, stacked)


def broadcast_clients(tree: PyTree, num: int) -> PyTree:
  """Stacks ``num`` copies of ``tree`` on a new leading client axis."""
  return jax.tree.map(lambda a: jnp.broadcast_to(a, (num,) + a.shape), tree)


