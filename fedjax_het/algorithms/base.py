"""What every algorithm is made of: its state, the static runtime, and the group round.

An algorithm is a factory closing over its hyper-parameters and returning
``Algorithm(init, round, evaluate, protocol)`` (see ``fedavg.py`` for the smallest one):

- ``init(rng) -> State``
- ``round(state, data) -> (state, metrics)``: pure and jittable; one communication round.
- ``evaluate(state, data) -> tuple[(correct [n_g], total [n_g]) per group]``: every client's
  personalized model on its own test split.
- ``protocol``: the same round cut at the wire (``Protocol``): one client's local step and
  the server's aggregation as separate pure functions. ``round`` is built from them
  (``train_protocol_groups``), and ``fedjax_het.deploy`` runs them in separate processes,
  so an algorithm exists once.

``State`` is one frozen pytree for all algorithms: what differs is what they put in
``clients`` (one entry per architecture group: a client's state tree, stacked on a
leading client axis and packed by the runtime into one buffer per dtype,
``packing.Packed``) and in ``server``.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, NamedTuple

import flax
import jax
import jax.numpy as jnp
import optax

from fedjax_het import clients as cl
from fedjax_het import packing
from fedjax_het import sharding
from fedjax_het.data.federated import ClientIndex
from fedjax_het.data.federated import FederatedData
from fedjax_het.data.federated import Layout

PyTree = Any


@flax.struct.dataclass
class ClientState:
  """State a client keeps between rounds (leaves stacked [n_g, ...] inside a group).

  Attributes:
    params: trainable parameters (private and local copies of shared parts).
    model_state: non-trained variables such as batch statistics, or None.
    opt_state: optimizer state.
  """
  params: PyTree
  model_state: PyTree
  opt_state: PyTree


@flax.struct.dataclass
class State:
  """The whole federation.

  Attributes:
    round: int32 scalar, rounds completed.
    rng: PRNG key from the seed; round ``r`` uses ``fold_in(rng, r)``.
    clients: tuple of per-group stacked client states (``ClientState`` or any pytree),
      leading axis = clients of that group padded to the device count; packed
      (``packing.Packed``) by ``init_clients``. ``state.clients[g].params`` reads the
      stacked params of a packed group as a tree.
    server: what the server holds between rounds (global model, prototypes, ...).
  """
  round: jax.Array
  rng: jax.Array
  clients: tuple
  server: PyTree


class Protocol(NamedTuple):
  """One client's and the server's halves of a round, and what crosses the wire.

  Every function is pure and works on ONE client (no client axis): the simulator maps
  ``client_update`` over the sampled clients of a group inside its compiled round, a
  deployment (``fedjax_het.deploy``) calls it in the client's own process.

  Attributes:
    init_client: ``(group, key) -> client`` state of one client of ``group``.
    init_server: ``(rng) -> server`` state (``rng``: the run's seed key).
    downlink: ``(server, group) -> payload``: what the server sends a client of ``group``
      before it trains or evaluates (FedMRL: theta; FD: the global logit table).
    client_update: ``(group, client, payload, data, idx, mask, key) -> (client, upload,
      aux)``: one client's local round. ``data`` has ``.x`` uint8 [P, H, W, C] and
      ``.y`` int32 [P] (the pooled data in the simulator, the client's own examples in a
      deployment); ``idx``/``mask`` int32/bool [n_max] its train table; ``upload`` is
      everything the client sends; ``aux`` a dict of scalars that stay on the client
      (at least ``'loss'``).
    aggregate: ``(server, uploads, weights, train_key, server_data) -> (server,
      metrics)``: ``uploads`` a tuple over groups of uploads stacked [m_g, ...],
      ``weights`` a tuple of float32 [m_g] train-example counts (0: no upload in that
      row); ``train_key`` this round's training key (``round_keys``); ``metrics`` the
      algorithm's own (e.g. Moss's fidelities).
    predict: ``(group, client, payload) -> (images -> logits)``: the client's
      personalized model.
    server_data: ``(data, rng) -> what aggregate needs beyond the uploads`` (Moss: its
      public images), or None when nothing.
    trained_payload: ``(payload, upload) -> payload`` of a client's model right after
      its local training, for the evaluation of the sampled clients (the FedMRL
      authors' protocol, ``eval_sampled``): the client's own trained copy of the shared
      block where it trains one (FedAvg, FedMRL: its upload), None where ``predict``
      does not use a block the client trains (the downloaded payload is used).
  """
  init_client: Callable[[int, jax.Array], PyTree]
  init_server: Callable[[jax.Array], PyTree]
  downlink: Callable[[PyTree, int], PyTree]
  client_update: Callable
  aggregate: Callable
  predict: Callable[[int, PyTree, PyTree], Callable]
  server_data: Callable | None = None
  trained_payload: Callable | None = None


def own_upload(payload: PyTree, upload: PyTree) -> PyTree:
  """``Protocol.trained_payload`` of algorithms whose upload is their trained payload."""
  del payload
  return upload


class Algorithm(NamedTuple):
  """The pure functions of an algorithm (see module docstring)."""
  init: Callable[[jax.Array], State]
  round: Callable[[State, FederatedData], tuple[State, dict]]
  evaluate: Callable[[State, FederatedData], tuple]
  protocol: Protocol | None = None


class Spec(NamedTuple):
  """How the experiment runner builds an algorithm from a config (``SPEC`` of a module).

  Attributes:
    build: ``(config, runtime) -> Algorithm``.
    hparams: the algorithm's own config keys (``config.algo``) with their defaults.
    choices: for string-valued ``hparams``, the valid values.
    homogeneous_only: True when all clients must share one architecture.
    check: optional ``(config) -> None`` raising ValueError for a config the algorithm
      cannot run (``fedjax_het.validation.validate`` calls it before any data is read).
  """
  build: Callable
  hparams: dict
  choices: dict = {}
  homogeneous_only: bool = False
  check: Callable | None = None


def sgd_args(config) -> dict:
  """The shared optimizer keys of a config as factory keyword arguments (``sgd``)."""
  return dict(learning_rate=config.learning_rate, momentum=config.momentum,
              weight_decay=config.weight_decay, grad_clip=config.grad_clip)


@dataclasses.dataclass(frozen=True)
class Runtime:
  """Static settings shared by the client side of every algorithm.

  Attributes:
    layout: groups of clients by architecture (from ``build_federated_data``).
    participation: fraction C of each group's clients that train per round.
    local_epochs: E.
    batch_size: B (the data tables are padded to a multiple of it).
    client_parallelism: 'auto', 'vmap' or 'sequential' (see ``clients.map_clients``).
    num_shards: devices the client axis is sharded over.
    mesh: the client mesh, or None for a single device.
    compute_dtype: dtype of activations (float32, or bfloat16 for mixed precision).
    augment: augmentation set of local training batches (``data.augment``).
    drop_last: skip each epoch's partial last batch (``drop_last``).
    reset_downloaded_momentum: zero the optimizer state of a block the server replaces
      at download (``download``).
    eval_sampled: evaluate the round's sampled clients right after local training
      (``eval_sampled``; the round metric ``sampled_test_acc``).
    normalization: the dataset's per-channel ``(mean, std)`` of pixels in [0, 1]
      (``preprocess.normalize``; None: CIFAR's), a static tuple of tuples.
  """
  layout: Layout
  participation: float = 1.0
  local_epochs: int = 1
  batch_size: int = 64
  client_parallelism: str = "auto"
  num_shards: int = 1
  mesh: Any = None
  compute_dtype: Any = jnp.float32
  augment: str = "none"
  drop_last: bool = False
  reset_downloaded_momentum: bool = True
  eval_sampled: bool = False
  normalization: tuple | None = None

  def train_options(self) -> dict:
    """The keyword arguments of ``clients.local_train`` this runtime fixes."""
    return dict(epochs=self.local_epochs, batch_size=self.batch_size,
                dtype=self.compute_dtype, augment=self.augment, drop_last=self.drop_last,
                normalization=self.normalization)

  def batch_options(self) -> dict:
    """The keyword arguments of ``clients.make_batch`` this runtime fixes."""
    return dict(dtype=self.compute_dtype, normalization=self.normalization)

  def eval_options(self) -> dict:
    """The keyword arguments of ``clients.evaluate_client`` this runtime fixes."""
    return dict(batch_size=self.batch_size, **self.batch_options())

  def dummy_input(self, batch: int = 1) -> jax.Array:
    """Zero images float32 [batch, H, W, C] of the data's shape, for ``Module.init``."""
    return jnp.zeros((batch,) + tuple(self.layout.image_shape), jnp.float32)

  def slots(self, group: int) -> tuple[int, int]:
    """(most clients a round draws, slots after padding to the shard count) of a group.

    K = round(C * N) clients are sampled over all groups (``clients.group_counts``);
    a group draws its floor of ``K * n_g / N`` or one more.
    """
    n = cl.group_slots(self.layout.group_sizes, self.participation)[group]
    return n, sharding.round_up(n, self.num_shards)

  def expected_sampled(self, group: int) -> float:
    """Clients of ``group`` sampled per round on average, ``K * n_g / N``."""
    floors, fractions = cl.group_quotas(self.layout.group_sizes, self.participation)
    return floors[group] + fractions[group]

  @property
  def in_place(self) -> bool:
    """Whether a group's sampled clients train in place, one after another
    (``clients.update_clients_in_place``): clients looped on one device."""
    return (cl.resolve_parallelism(self.client_parallelism) == "sequential"
            and self.num_shards <= 1)

  def map(self, fn, *args):
    """``clients.map_clients`` with this runtime's parallelism and shards."""
    args = sharding.constrain_clients(args, self.mesh)
    return cl.map_clients(fn, *args, parallelism=self.client_parallelism,
                          num_shards=self.num_shards)


def round_keys(state: State) -> tuple[jax.Array, jax.Array]:
  """(sampling key, training key) of the current round: pure in (seed, round)."""
  return keys_of_round(state.rng, state.round)


def keys_of_round(rng: jax.Array, round_: jax.Array | int) -> tuple[jax.Array, jax.Array]:
  """(sampling key, training key) of the round after ``round_`` completed rounds."""
  key = jax.random.fold_in(rng, round_)
  return jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)


def group_draw(rt: Runtime, group: int, sample_key: jax.Array, train_key: jax.Array
               ) -> tuple[jax.Array, jax.Array]:
  """Which clients of a group train this round and the PRNG key of each.

  Returns:
    (positions on the group's client axis int32 [slots] (padding slots out of range),
    keys [slots, ...]): the simulator and a deployment draw the same clients and give
    each the same key.
  """
  _, slots = rt.slots(group)
  # fold_in(.., 2**30) is no group's key: the per-round allocation of K over the groups
  counts = cl.group_counts(jax.random.fold_in(sample_key, 1 << 30), rt.layout.group_sizes,
                           rt.participation)
  idx = cl.sample_clients(jax.random.fold_in(sample_key, group),
                          rt.layout.group_sizes[group], counts[group], slots)
  return idx, jax.random.split(jax.random.fold_in(train_key, group), slots)


class GroupRound(NamedTuple):
  """Outcome of one group's local work in a round (leading axis = sampled slots)."""
  clients: PyTree  # the group's updated stacked client state (all clients)
  outputs: PyTree  # what ``client_fn`` returned per sampled slot
  weights: jax.Array  # float32 [slots]: train examples of each slot (0 on padding)
  # (correct, total) float32 [slots] of each trained client on its own test split, or
  # None (``eval_fn`` of ``train_group``)
  test_counts: tuple | None = None


def train_group(rt: Runtime, group: int, clients_g: PyTree, data: FederatedData,
                sample_key: jax.Array, train_key: jax.Array,
                client_fn: Callable, eval_fn: Callable | None = None) -> GroupRound:
  """Samples the clients of a group, runs ``client_fn`` on each, writes them back.

  Clients looped on one device (``Runtime.in_place``) are trained in place, one after
  another (``clients.update_clients_in_place``), each evaluated right after its
  training; otherwise the sampled clients' rows are gathered, mapped over
  (``Runtime.map``) and scattered back. A padding slot (a client drawn out of range) has
  no examples: it trains and counts nothing, and writes nothing back either way.

  Args:
    rt: the runtime.
    group: group number (static).
    clients_g: the group's stacked client state [n_g_padded, ...]: a ``packing.Packed``
      (as ``init_clients`` makes it: a row per client, one slice or gather and one
      write per buffer) or a tree.
    data: the federated data.
    sample_key, train_key: this round's keys (see ``round_keys``).
    client_fn: ``(client_state, train_idx [n], train_mask [n], key) -> (client_state,
      outputs)`` for one client, on the client's state as a tree; it closes over the
      pooled data and server payload.
    eval_fn: optional ``(trained client_state, outputs, test_idx, test_mask) ->
      (correct, total)``: each trained client on its own test split.

  Returns:
    ``GroupRound`` (its ``clients`` packed as ``clients_g`` was).
  """
  index: ClientIndex = data.groups[group]
  idx, keys = group_draw(rt, group, sample_key, train_key)
  tidx, tmask = cl.gather_clients((index.train_idx, index.train_mask), idx)
  weights = cl.gather_clients(index.num_train, idx).astype(jnp.float32)
  train = packing.on_client(client_fn, clients_g)
  evaluate = (None if eval_fn is None
              else packing.on_client(eval_fn, clients_g, returns_state=False))
  test = None if evaluate is None else cl.gather_clients(
      (index.test_idx, index.test_mask), idx)
  if rt.in_place:
    def slot(row, tidx, tmask, key, test):
      new, outputs = train(row, tidx, tmask, key)
      return new, (outputs, None if evaluate is None else evaluate(new, outputs, *test))
    clients_g, (outputs, counts) = cl.update_clients_in_place(
        slot, clients_g, idx, tidx, tmask, keys, test)
    return GroupRound(clients_g, outputs, weights, counts)
  new, outputs = rt.map(train, cl.gather_clients(clients_g, idx), tidx, tmask, keys)
  counts = None if evaluate is None else rt.map(evaluate, new, outputs, *test)
  return GroupRound(cl.scatter_clients(clients_g, idx, new), outputs, weights, counts)


def own_computation(fn: Callable, operands, witness: jax.Array):
  """``fn(*operands)`` as a computation of its own in the compiled program.

  A ``lax.cond`` on ``witness >= 0``, which XLA cannot fold (``witness`` is a runtime
  value: a label of the pooled data, never negative), so ``fn``'s ops stay in the
  conditional's branch and are fused there, apart from the loop body that calls it:
  XLA's fusion passes, whose cost grows faster than a computation's size, see each
  group's round alone (the GPU's ``priority-fusion`` did not finish on the five groups of
  FedMoE's claims cell in one body; docs/performance.md, "Program size and compile
  cost"). The other branch (never taken) returns ``stand_ins``: for each output, an
  operand of its shape and dtype where there is one. A branch of zeros would make XLA
  copy each group's state into the conditional's output buffer on every round instead of
  updating it in place (the P1 FedMoE dispatch's temporaries: 2.41 GB with zeros, 0.52
  GB with operands; docs/performance.md, "Program size and compile cost").

  ``witness`` must not be batched by a ``vmap`` (a batched predicate turns the
  conditional into a select of both branches): the pooled labels are shared by the
  replicas of ``loop.run_seeds``.

  ``fn`` is traced once: its output shapes and the branch share jit's trace of it
  (``jax.jit(fn, inline=True)``, inlined into the branch as if ``fn`` were called).
  """
  fn = jax.jit(fn, inline=True)
  shapes = jax.eval_shape(fn, *operands)

  def never(*args):
    return stand_ins(shapes, args)
  return jax.lax.cond(witness >= 0, fn, never, *operands)


def stand_ins(shapes, operands):
  """Values of ``shapes`` for a branch that is never taken.

  Each output, in ``shapes``' leaf order, takes the first leaf of ``operands`` of its
  shape and dtype not already taken, and zeros where none is left: the branch then
  forwards buffers instead of filling new ones, so XLA can give the conditional's output
  the operand's buffer (a group's stacked state in, the same state out).

  Args:
    shapes: a tree of ``jax.ShapeDtypeStruct`` (``jax.eval_shape`` of the taken branch).
    operands: the branch's operands (any tree of arrays).

  Returns:
    A tree of ``shapes``' structure.
  """
  free = {}
  for leaf in jax.tree.leaves(operands):
    free.setdefault((leaf.shape, jnp.dtype(leaf.dtype)), []).append(leaf)

  def one(s):
    same = free.get((s.shape, jnp.dtype(s.dtype)))
    return same.pop(0) if same else jnp.zeros(s.shape, s.dtype)
  return jax.tree.map(one, shapes)


def group_witness(data: FederatedData) -> jax.Array:
  """The runtime scalar ``own_computation``'s predicates read: the first pooled label."""
  return data.y[0]


def train_protocol_groups(rt: Runtime, proto: Protocol, state: State,
                          data: FederatedData) -> list[GroupRound]:
  """Every group's local work of a round through ``proto.client_update``.

  Each client downloads ``proto.downlink(state.server, g)`` and trains; the outputs of
  each ``GroupRound`` are ``(upload, aux)`` per sampled slot. With ``rt.eval_sampled``
  each trained client is also evaluated on its own test split, with its own trained
  shared block (``Protocol.trained_payload``), before the server aggregates. Each
  group's download, sampling, training and evaluation is a computation of its own
  (``own_computation``).
  """
  sample_key, train_key = round_keys(state)
  witness = group_witness(data)
  results = []
  for g in range(rt.layout.num_groups):
    def group_round(server, clients_g, data, sample_key, train_key, g=g):
      payload = proto.downlink(server, g)

      def client_fn(client, idx, mask, key):
        new, upload, aux = proto.client_update(g, client, payload, data, idx, mask, key)
        return new, (upload, aux)

      def eval_fn(client, outputs, idx, mask):
        own = (proto.trained_payload(payload, outputs[0]) if proto.trained_payload
               else payload)
        return cl.evaluate_client(proto.predict(g, client, own), data.x, data.y, idx,
                                  mask, **rt.eval_options())
      return train_group(rt, g, clients_g, data, sample_key, train_key, client_fn,
                         eval_fn if rt.eval_sampled else None)
    results.append(own_computation(
        group_round, (state.server, state.clients[g], data, sample_key, train_key),
        witness))
  return results


def aggregate_groups(proto: Protocol, state: State, results: list[GroupRound],
                     server_data=None) -> tuple[PyTree, dict]:
  """``proto.aggregate`` of a round's ``GroupRound``s (uploads and weights per group)."""
  _, train_key = round_keys(state)
  return proto.aggregate(state.server, tuple(r.outputs[0] for r in results),
                         tuple(r.weights for r in results), train_key, server_data)


def protocol_init(rt: Runtime, proto: Protocol) -> Callable[[jax.Array], State]:
  """``Algorithm.init`` from a protocol: every (padded) client and the server."""
  def init(rng):
    clients = tuple(init_clients(rt, g, functools.partial(proto.init_client, g), rng)
                    for g in range(rt.layout.num_groups))
    return State(jnp.zeros((), jnp.int32), rng, clients, proto.init_server(rng))
  return init


def protocol_evaluate(rt: Runtime, proto: Protocol) -> Callable:
  """``Algorithm.evaluate`` from a protocol: ``predict`` with each group's downlink."""
  def evaluate(state, data):
    return evaluate_groups(rt, state, data, lambda g, client, server: proto.predict(
        g, client, proto.downlink(server, g)))
  return evaluate


def evaluate_groups(rt: Runtime, state: State, data: FederatedData,
                    predict: Callable[[int, PyTree, PyTree], Callable]) -> tuple:
  """Test accuracy counts of every client of every group.

  Each group's evaluation is a computation of its own (``own_computation``).

  Args:
    predict: ``(group, client_state, server) -> (images -> logits)`` for one client
      (its state as a tree).

  Returns:
    tuple over groups of ``(correct [n_g_padded], total [n_g_padded])``.
  """
  witness = group_witness(data)
  out = []
  for g in range(len(data.groups)):
    def group_eval(server, clients_g, data, g=g):
      index = data.groups[g]

      def one(client, idx, mask):
        return cl.evaluate_client(predict(g, client, server), data.x, data.y, idx, mask,
                                  **rt.eval_options())
      return rt.map(packing.on_client(one, clients_g, returns_state=False), clients_g,
                    index.test_idx, index.test_mask)
    out.append(own_computation(group_eval, (state.server, state.clients[g], data), witness))
  return tuple(out)


def count_params(tree: PyTree) -> int:
  """Number of scalars in a pytree (communication is counted in parameters)."""
  return int(sum(x.size for x in jax.tree.leaves(tree)))


def round_metrics(groups: list[GroupRound], loss_of: Callable[[PyTree], jax.Array],
                  uplink: int | jax.Array, downlink: int | jax.Array) -> dict:
  """Standard round metrics.

  Returns:
    ``train_loss`` (mean over participating clients), ``group_train_loss`` [num_groups]
    (locates a numerical fault), ``uplink_params``/``downlink_params`` (parameters sent
    per participating client this round), and when the groups were evaluated after
    training (``eval_sampled``) ``sampled_test_acc``: the mean over the round's sampled
    clients of each one's test accuracy right after its local training.
  """
  def mean_loss(gr):
    active = (gr.weights > 0).astype(jnp.float32)
    return jnp.sum(loss_of(gr.outputs) * active), jnp.sum(active)

  sums, counts = (jnp.stack(v) for v in zip(*map(mean_loss, groups)))
  metrics = {
      "train_loss": jnp.sum(sums) / jnp.maximum(jnp.sum(counts), 1.0),
      "group_train_loss": sums / jnp.maximum(counts, 1.0),
      "uplink_params": jnp.asarray(uplink, jnp.float32),
      "downlink_params": jnp.asarray(downlink, jnp.float32),
  }
  if groups and groups[0].test_counts is not None:
    metrics["sampled_test_acc"] = sampled_accuracy(groups)
  return metrics


def sampled_accuracy(groups: list[GroupRound]) -> jax.Array:
  """Mean over the sampled clients (real slots with test data) of correct / total."""
  accs, real = [], []
  for gr in groups:
    correct, total = gr.test_counts
    accs.append(correct / jnp.maximum(total, 1.0))
    real.append((gr.weights > 0) & (total > 0))
  accs, real = jnp.concatenate(accs), jnp.concatenate(real).astype(jnp.float32)
  return jnp.sum(accs * real) / jnp.maximum(jnp.sum(real), 1.0)


def init_clients(rt: Runtime, group: int, init_one: Callable[[jax.Array], PyTree],
                 key: jax.Array) -> packing.Packed:
  """Initial state of a group's (padded) clients, one key per client, packed
  (``packing.Packed``: one buffer per dtype, ``[padded_size, size]``).

  The clients are drawn one at a time (``lax.map``), each client's tree packed into its
  row as it is drawn. Drawn all at once (``vmap``), every leaf of every client was a
  temporary beside the packed buffers, as much memory again as the group's state (the
  P1 FedMoE init's temporaries: 1.94 GB drawn at once, 0.11 GB one at a time, and the
  same bits with jax's default threefry keys; docs/performance.md, "Program size and
  compile cost"). Row j is ``init_one`` of client j's key whatever the device count and
  the key implementation ('rbg' keys draw other bits under ``vmap``).
  """
  keys = client_init_keys(key, group, rt.layout.padded_sizes[group])
  return jax.lax.map(lambda k: packing.pack(init_one(k), lead=0), keys)


def client_init_keys(key: jax.Array, group: int, padded_size: int) -> jax.Array:
  """The init keys of a group's clients [padded_size, ...]; row j: position j."""
  return jax.random.split(jax.random.fold_in(key, group), padded_size)


def download(rt: Runtime, params: dict, opt_state: PyTree, blocks: dict
             ) -> tuple[dict, PyTree]:
  """A client's params with server blocks put in, and its optimizer state to go with them.

  Momentum of a replaced block: the buffer a client kept for its own copy of theta last
  round describes another point than the theta it now downloads (the aggregate of other
  clients' models), so carrying it into the new theta is a stale step. With
  ``rt.reset_downloaded_momentum`` (the default) every leaf of the optimizer state under
  a replaced block's key (the momentum buffer) is zeroed, as a fresh
  ``torch.optim.SGD`` over the downloaded block would start; the client's private blocks
  keep theirs. False keeps every buffer (one optimizer over all of the client's params
  across rounds).

  Args:
    rt: the runtime.
    params: the client's params, a dict of blocks (``{'global', 'local', 'proj'}``...).
    opt_state: its optimizer state (any optax state whose param-shaped parts are keyed
      like ``params``: ``base.sgd``, chains and ``optax.multi_transform`` of them).
    blocks: ``{block name: downloaded value}``.

  Returns:
    (params with ``blocks`` in place, optimizer state).
  """
  params = dict(params, **blocks)
  if not rt.reset_downloaded_momentum:
    return params, opt_state

  def reset(path, leaf):
    replaced = any(isinstance(k, jax.tree_util.DictKey) and k.key in blocks for k in path)
    return jnp.zeros_like(leaf) if replaced else leaf
  return params, jax.tree_util.tree_map_with_path(reset, opt_state)


def clip(grad_clip: float) -> optax.GradientTransformation:
  """Clips the global gradient norm to ``grad_clip`` (0: no clipping).

  As PyTorch's ``clip_grad_norm_(parameters, grad_clip)`` before ``optimizer.step()``
  (the FedMRL authors' code clips at 50).
  """
  return optax.clip_by_global_norm(grad_clip) if grad_clip > 0 else optax.identity()


def sgd(learning_rate: float, momentum: float = 0.0, weight_decay: float = 0.0,
        grad_clip: float = 0.0) -> optax.GradientTransformation:
  """The papers' local optimizer, as PyTorch's ``torch.optim.SGD`` runs it.

  In order: the global gradient norm clipped to ``grad_clip`` (0: off), coupled L2
  weight decay ``g + weight_decay * w`` (PyTorch's ``weight_decay``, not AdamW's
  decoupled decay), heavy-ball momentum ``b <- momentum * b + g`` (no dampening, no
  Nesterov), and the step ``w <- w - learning_rate * b``. The FedMRL authors' code uses
  lr 0.01, momentum 0.9, weight decay 1e-3, clip 50.

  Args:
    learning_rate: eta.
    momentum: 0 for plain SGD (no momentum buffer in the state).
    weight_decay: coupled L2 coefficient (0: off).
    grad_clip: maximum global gradient norm (0: off).
  """
  return optax.chain(
      clip(grad_clip),
      optax.add_decayed_weights(weight_decay) if weight_decay > 0 else optax.identity(),
      optax.sgd(learning_rate, momentum=momentum or None))
