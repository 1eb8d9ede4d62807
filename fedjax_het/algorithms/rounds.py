"""How a round is run: the machinery behind ``api.Protocol`` (authors need not open it).

``from_protocol`` makes ``Algorithm(init, round, evaluate, protocol)`` of a protocol;
``protocol_round`` is the one round of every protocol: each group's sampled clients
download and train (``train_protocol_groups``), then ``finish_round``: the server
aggregates (``aggregate_groups``), the metrics count the losses and
``Protocol.communication``, and ``advance`` gives the next state. A custom round is
composed of the same public pieces (docs/extending.md). ``debug_round`` runs the same
round with the clients one by one, its errors naming the round, group and client.

What lies below them, and the rules it keeps:

- sampling: ``round_keys``, ``group_draw`` (pure in (seed, round): the simulator and a
  deployment draw the same clients with the same keys);
- a group's clients: ``train_group`` trains them in place one after another on one
  device, or gathers, maps and scatters them (``Runtime.in_place``);
- each group's work is a computation of its own (``own_computation``), a conditional
  whose predicate reads ``group_witness`` (batched by a ``vmap``: no conditional);
- client state is packed (``packing.Packed``) by ``init_clients`` and unpacked for one
  client inside its own step (``packing.on_client``).
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import clients as cl
from fedjax_het import packing
from fedjax_het.algorithms.api import Algorithm
from fedjax_het.algorithms.api import Protocol
from fedjax_het.algorithms.api import PyTree
from fedjax_het.algorithms.api import Runtime
from fedjax_het.algorithms.api import State
from fedjax_het.data.federated import ClientIndex
from fedjax_het.data.federated import FederatedData


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
  group's round alone (measured in docs/performance.md, "Program size and compile
  cost"). The other branch (never taken) returns ``stand_ins``: for each output, an
  operand of its shape and dtype where there is one. A branch of zeros would make XLA
  copy each group's state into the conditional's output buffer on every round instead of
  updating it in place (the temporaries it costs: the same section).

  A ``witness`` batched by a ``vmap`` (``batched``: the replicas of ``loop.run_seeds``
  with pools of their own, where a sweep holds out each seed's public set) would turn the
  conditional into a select that runs both branches; ``fn`` is then called as it is, with
  no conditional (the same values; its work is fused with the caller's). Where the
  replicas share the pool the witness is not batched and each replica keeps its
  conditional.

  ``fn`` is traced once: its output shapes and the branch share jit's trace of it
  (``jax.jit(fn, inline=True)``, inlined into the branch as if ``fn`` were called).
  """
  fn = jax.jit(fn, inline=True)
  if batched(witness):
    return fn(*operands)
  shapes = jax.eval_shape(fn, *operands)

  def never(*args):
    return stand_ins(shapes, args)
  return jax.lax.cond(witness >= 0, fn, never, *operands)


def batched(witness) -> bool:
  """Whether ``witness`` is batched by an enclosing ``vmap`` (a batch tracer with a
  mapped axis): a conditional on it would be a select of both branches."""
  dim = getattr(witness, "batch_dim", None)
  return (isinstance(witness, jax.core.Tracer) and type(witness).__name__ == "BatchTracer"
          and dim is not None and not (type(dim).__name__ == "NotMapped"))


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
        return client_step(proto, g, client, payload, data, idx, mask, key)

      def eval_fn(client, outputs, idx, mask):
        return trained_counts(rt, proto, g, client, payload, outputs[0], data, idx, mask)
      return train_group(rt, g, clients_g, data, sample_key, train_key, client_fn,
                         eval_fn if rt.eval_sampled else None)
    results.append(own_computation(
        group_round, (state.server, state.clients[g], data, sample_key, train_key),
        witness))
  return results


def client_step(proto: Protocol, g: int, client, payload, data: FederatedData, idx, mask,
                key) -> tuple:
  """One sampled client's ``proto.client_update``: ``(new state, (upload, aux))``."""
  new, upload, aux = proto.client_update(g, client, payload, data, idx, mask, key)
  return new, (upload, aux)


def trained_counts(rt: Runtime, proto: Protocol, g: int, client, payload, upload,
                   data: FederatedData, idx, mask) -> tuple:
  """``(correct, total)`` of a just-trained client on its test rows ``idx``, predicting
  with its own trained shared block (``Protocol.trained_payload``) where it has one."""
  own = proto.trained_payload(payload, upload) if proto.trained_payload else payload
  return cl.evaluate_client(proto.predict(g, client, own), data.x, data.y, idx, mask,
                            **rt.eval_options())


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
      return map_group(rt, one, clients_g, index.test_idx, index.test_mask)
    out.append(own_computation(group_eval, (state.server, state.clients[g], data), witness))
  return tuple(out)


def map_group(rt: Runtime, fn: Callable, clients_g: PyTree, *args):
  """``fn(client, *row_args)`` on every client of a group, each as its plain tree.

  ``clients_g`` is a group's stacked state as ``State.clients[g]`` holds it (packed or
  not); ``args`` are stacked on the same client axis. For analysis code that reads every
  client (``fedmoe.test_gate_weights``) without knowing how the state is stored.
  """
  return rt.map(packing.on_client(fn, clients_g, returns_state=False), clients_g, *args)


def round_metrics(groups: list[GroupRound], uplink: int | jax.Array,
                  downlink: int | jax.Array) -> dict:
  """Standard round metrics of a protocol's groups (each slot's ``aux['loss']``).

  Returns:
    ``train_loss`` (mean over participating clients), ``group_train_loss`` [num_groups]
    (locates a numerical fault), ``uplink_params``/``downlink_params`` (parameters sent
    per participating client this round), and when the groups were evaluated after
    training (``eval_sampled``) ``sampled_test_acc``: the mean over the round's sampled
    clients of each one's test accuracy right after its local training.
  """
  def mean_loss(gr):
    active = (gr.weights > 0).astype(jnp.float32)
    return jnp.sum(gr.outputs[1]["loss"] * active), jnp.sum(active)

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
  same bits either way with jax's default threefry keys; the temporaries measured in
  docs/performance.md, "Program size and compile cost"). Row j is ``init_one`` of client j's key whatever the device count and
  the key implementation ('rbg' keys draw other bits under ``vmap``).
  """
  keys = client_init_keys(key, group, rt.layout.padded_sizes[group])
  return jax.lax.map(lambda k: packing.pack(init_one(k), lead=0), keys)


def client_init_keys(key: jax.Array, group: int, padded_size: int) -> jax.Array:
  """The init keys of a group's clients [padded_size, ...]; row j: position j."""
  return jax.random.split(jax.random.fold_in(key, group), padded_size)




def protocol_round(rt: Runtime, proto: Protocol) -> Callable:
  """``Algorithm.round`` of a protocol: the one round of every built-in algorithm.

  Every sampled client downloads ``proto.downlink(server, g)``, trains
  (``proto.client_update``) and uploads (``train_protocol_groups``); then
  ``finish_round``.
  """
  def round_fn(state, data):
    return finish_round(proto, state, data, train_protocol_groups(rt, proto, state, data))
  return round_fn


def finish_round(proto: Protocol, state: State, data: FederatedData,
                 results: list[GroupRound]) -> tuple[State, dict]:
  """The server's half of a round, after the groups' local work (``results``).

  The server aggregates the uploads with ``proto.server_data(data, rng)`` where the
  protocol has it. The metrics are ``round_metrics`` (the link sizes from
  ``proto.communication``, or from the aggregate's own ``uplink_params`` /
  ``downlink_params`` where it reports them) and the aggregate's metrics.

  Returns:
    (the state after the round, ``advance``; its metrics).
  """
  server_data = (proto.server_data(data, state.rng) if proto.server_data is not None
                 else None)
  server, server_metrics = aggregate_groups(proto, state, results, server_data)
  uploads, aux = zip(*(r.outputs for r in results))
  up, down = proto.communication(state.server, uploads, tuple(r.weights for r in results),
                                 aux)
  server_metrics = dict(server_metrics)
  up = server_metrics.pop("uplink_params", up)
  down = server_metrics.pop("downlink_params", down)
  metrics = round_metrics(results, up, down)
  metrics.update(server_metrics)
  return advance(state, results, server), metrics


def advance(state: State, results: list[GroupRound], server: PyTree) -> State:
  """The state after a round: its clients as ``results`` left them, the new server."""
  return state.replace(round=state.round + 1, clients=tuple(r.clients for r in results),
                       server=server)


def from_protocol(rt: Runtime, proto: Protocol, round_fn: Callable | None = None
                  ) -> Algorithm:
  """``Algorithm(init, round, evaluate, proto)`` of a protocol.

  Args:
    rt: the runtime.
    proto: the algorithm's protocol; ``init`` and ``evaluate`` come from it
      (``protocol_init``, ``protocol_evaluate``).
    round_fn: ``Algorithm.round``; None: ``protocol_round(rt, proto)``, or where
      ``rt.client_parallelism`` is a debug mode (``clients.DEBUG``) ``debug_round``:
      'debug' jits each client's step on its own, 'debug_eager' runs it op by op.
  """
  if round_fn is None and cl.is_debug(rt.client_parallelism):
    round_fn = debug_round(rt, proto, jit_clients=rt.client_parallelism == "debug")
  return Algorithm(protocol_init(rt, proto),
                   round_fn if round_fn is not None else protocol_round(rt, proto),
                   protocol_evaluate(rt, proto), proto)


# ---- debugging: clients one by one ------------------------------------------------------


def eager(fn: Callable) -> Callable:
  """``fn`` run op by op: under ``jax.disable_jit`` its loops (``lax.scan``) run in
  Python, so ``print`` shows values and a breakpoint stops in them."""
  @functools.wraps(fn)
  def run(*args):
    with jax.disable_jit():
      return fn(*args)
  return run


class ClientError(RuntimeError):
  """A client's step (or the server's aggregate) raised in ``debug_round``; the message
  names the round, the group and the client."""


def debug_round(rt: Runtime, proto: Protocol, *, jit_clients: bool = True) -> Callable:
  """``Algorithm.round`` that runs the sampled clients one by one, for debugging.

  The same clients, keys, data and aggregation as ``protocol_round`` (so the same
  state and metrics, to float rounding), but a Python loop: each client's
  ``client_update`` is jitted on its own (``jit_clients``) or run uncompiled, op by op
  under ``jax.disable_jit`` (``jit_clients=False``: ``print`` and breakpoints work inside
  it, loops included, and its arrays are concrete). An exception is re-raised as a
  ``ClientError`` naming the round, the group and the client (its position in the group
  and its client id). Not jittable itself (a trace is refused in one line): call it as
  ``state, metrics = debug_round(rt, proto)(state, data)``, or run a config with
  ``runtime.client_parallelism='debug'`` (or 'debug_eager'), which ``from_protocol``
  and the training loop turn into this round.
  """
  compiled = jax.jit if jit_clients else eager
  made = {}  # (kind, group) -> its function, made (and compiled) once for the run

  def step_fn(g, clients_g):
    def step(client, payload, data, idx, mask, key):
      return client_step(proto, g, client, payload, data, idx, mask, key)
    if ("step", g) not in made:
      made["step", g] = compiled(packing.on_client(step, clients_g))
    return made["step", g]

  def eval_fn(g, clients_g):
    def count(client, payload, upload, data, idx, mask):
      return trained_counts(rt, proto, g, client, payload, upload, data, idx, mask)
    if ("count", g) not in made:
      made["count", g] = compiled(packing.on_client(count, clients_g, returns_state=False))
    return made["count", g]

  finish = compiled(functools.partial(finish_round, proto))

  def group(state, data, g, sample_key, train_key):
    index, clients_g = data.groups[g], state.clients[g]
    payload = proto.downlink(state.server, g)
    positions, keys = group_draw(rt, g, sample_key, train_key)
    step, count = step_fn(g, clients_g), eval_fn(g, clients_g)
    outs, weights, counts = [], [], []
    for slot, pos in enumerate(np.asarray(positions).tolist()):
      if pos >= rt.layout.group_sizes[g]:
        continue  # a padding slot: no client
      args = (index.train_idx[pos], index.train_mask[pos], keys[slot])
      where = (f"round {int(state.round) + 1}, group {g} ({rt.layout.archs[g]}), client "
               f"{pos} of the group (client id {rt.layout.client_ids[g][pos]})")
      try:
        new, out = step(cl.row(clients_g, pos), payload, data, *args)
        if rt.eval_sampled:
          counts.append(count(new, payload, out[0], data, index.test_idx[pos],
                              index.test_mask[pos]))
      except Exception as err:
        raise ClientError(f"{where}: {type(err).__name__}: {err}") from err
      clients_g = cl.set_row(clients_g, pos, new)
      outs.append(out)
      weights.append(index.num_train[pos])
    if not outs:  # nobody of this group drew: one row that weighs nothing
      shapes = jax.eval_shape(step, cl.row(clients_g, 0), payload, data,
                              index.train_idx[0], index.train_mask[0], keys[0])[1]
      outs, weights = [jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)], [0]
      counts = [(jnp.zeros(()), jnp.zeros(()))] if rt.eval_sampled else []
    stack = lambda rows: jax.tree.map(lambda *a: jnp.stack(a), *rows)  # noqa: E731
    return GroupRound(clients_g, stack(outs), jnp.asarray(weights, jnp.float32),
                      stack(counts) if counts else None)

  def round_fn(state, data):
    if isinstance(state.round, jax.core.Tracer):
      raise TypeError("debug_round runs the clients one by one in Python and cannot be "
                      "traced (jit, vmap, scan): call it on concrete arrays, or use "
                      "protocol_round")
    sample_key, train_key = round_keys(state)
    results = [group(state, data, g, sample_key, train_key)
               for g in range(rt.layout.num_groups)]
    try:
      return finish(state, data, results)
    except Exception as err:
      raise ClientError(f"round {int(state.round) + 1}, the server's aggregate: "
                        f"{type(err).__name__}: {err}") from err
  return round_fn
