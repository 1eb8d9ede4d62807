"""The compiled program of a run: init, the rounds of a dispatch, evaluation, accuracies.

``compile_fns`` gives the jitted ``Program(init, run_rounds, evaluate, abstract)`` of an
``Experiment``; ``compile_dispatch`` the program ``loop.run`` calls, several rounds and
their evaluations per call in one ``lax.while_loop`` (no host round trip per round);
``map_replicas`` maps either over the seeds of ``loop.run_seeds`` (a replica axis).
"""
from __future__ import annotations

import collections
import functools
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import clients as clients_lib
from fedjax_het import data as data_lib
from fedjax_het import distributed
from fedjax_het import packing
from fedjax_het import sharding
from fedjax_het.algorithms import Algorithm
from fedjax_het.algorithms import State
from fedjax_het.training import compile_options
from fedjax_het.training import host_memory
from fedjax_het.training.experiment import Experiment

MAX_DISPATCH = 1000  # most rounds in one dispatch (sizes the per-round metric buffers)


def dispatch_rows(num_rounds: int) -> int:
  """``compile_dispatch``'s ``max_rounds`` for a run of ``num_rounds`` rounds.

  The next power of two (at most ``MAX_DISPATCH``): the row buffers' size is part of the
  program, so runs that differ only in their number of rounds (a run resumed for more
  rounds, a shorter cut of a sweep) share one compiled program; the buffers hold a few
  scalars per round.
  """
  return min(1 << max(num_rounds - 1, 0).bit_length(), MAX_DISPATCH)


def jit_init(fn: Callable, platform: str | None = None, **jit_kwargs) -> Callable:
  """``jax.jit(fn, **jit_kwargs)`` for a state's init, compiled as ``compile_options`` says.

  On CPU at ``compile_options.INIT_OPTIMIZATION_LEVEL`` (or ``FEDJAX_HET_INIT_LEVEL``'s);
  on a GPU with jax's threefry kernel (``compile_options.use_threefry_kernel``, turned
  on for the process here).
  ``platform``: where it runs (default: JAX's default backend).
  """
  platform = platform or jax.default_backend()
  compile_options.use_threefry_kernel(platform)
  options = compile_options.init_compiler_options(platform)
  return jax.jit(fn, compiler_options=options, **jit_kwargs)


class Program(NamedTuple):
  """``compile_fns``' jitted functions of an experiment (fixed shardings).

  Attributes:
    init: ``(rng) -> State``, created already sharded.
    run_rounds: ``(state, data, num_rounds) -> (state, metrics)``: a ``lax.scan`` of a
      static number of rounds (one compile per ``num_rounds``); the state is donated.
    evaluate: ``(state, data) -> ((correct, total) per group)``.
    abstract: the state's ``jax.ShapeDtypeStruct`` tree with its shardings (restores).
  """
  init: Callable
  run_rounds: Callable
  evaluate: Callable
  abstract: State


def state_shardings(abstract: State, mesh, replicas: bool = False) -> State:
  """Client state sharded on its client axis; round, rng and server replicated.

  ``replicas``: every leaf has a leading replica axis (``loop.run_seeds``), kept whole.
  """
  rep, cli = sharding.replicated(mesh), sharding.client_sharding(mesh, replicas)
  return State(round=rep, rng=rep, clients=jax.tree.map(lambda _: cli, abstract.clients),
               server=jax.tree.map(lambda _: rep, abstract.server))


def replica_data(exps: list[Experiment]) -> tuple[data_lib.FederatedData, object]:
  """The data of seeds on a replica axis (``loop.run_seeds``), placed, and its vmap axes.

  ``exps`` differ only in ``seed`` and are prepared unplaced (``prepare(place=False)``):
  the pool is shared (replicated), each seed's client tables are stacked (padded to the
  widest) and sharded on their client axis.
  """
  data, axes = data_lib.stack_replicas([e.data for e in exps])
  mesh = exps[0].runtime.mesh
  return data.replace(x=sharding.place_replicated(jnp.asarray(data.x), mesh),
                      y=sharding.place_replicated(jnp.asarray(data.y), mesh),
                      groups=sharding.place_clients(data.groups, mesh, replicas=True)), axes


def replica_state(states: list[State], mesh) -> State:
  """The seeds' states stacked on a leading replica axis and placed as the program wants.

  Consumes ``states``: each leaf's buffers are freed once it is stacked, so the seeds'
  states and their stack are never all held at once (at N = 100 the two would be twice
  the S states: 9.4 GiB for a FedMRL pair). The caller must not use them afterwards.
  """
  left = collections.Counter(id(a) for s in states for a in jax.tree.leaves(s))

  def stack(placement, *leaves):
    out = jax.device_put(jnp.stack(leaves), placement).block_until_ready()
    for a in leaves:
      left[id(a)] -= 1
      if not left[id(a)] and isinstance(a, jax.Array):  # its last use among the leaves
        a.delete()
    return out
  return jax.tree.map(stack, state_shardings(states[0], mesh, True), *states)


def traced_once(fn: Callable) -> Callable:
  """``fn`` whose traces are cached by jit and inlined where it is called.

  ``jax.eval_shape`` of it and the programs that call it (with the same argument shapes)
  share one trace; a program calling it compiles as if it called ``fn`` itself.
  """
  return jax.jit(fn, inline=True)


def round_with_checks(alg: Algorithm) -> Callable:
  """``alg.round`` whose metrics also say which groups' parameters are finite."""
  def one_round(state, data):
    state, metrics = alg.round(state, data)
    return state, dict(metrics, group_finite=finite_groups(state))
  return one_round


def compile_fns(exp: Experiment) -> Program:
  """Jitted ``Program(init, run_rounds, evaluate, abstract)``: fixed shardings, donated state.

  ``run_rounds(state, data, num_rounds)`` scans a static number of rounds (one compile
  per ``num_rounds``); ``loop.run`` uses ``compile_dispatch`` instead.
  """
  alg, mesh = exp.algorithm, exp.runtime.mesh
  abstract = jax.eval_shape(alg.init, jax.random.PRNGKey(0))
  shards = state_shardings(abstract, mesh)
  init = jit_init(alg.init, mesh.devices.flat[0].platform, out_shardings=shards)
  one_round = round_with_checks(alg)

  @functools.partial(jax.jit, static_argnums=2, donate_argnums=0,
                     out_shardings=(shards, None))
  def run_rounds(state, data, num_rounds):
    return jax.lax.scan(lambda s, _: one_round(s, data), state, None, length=num_rounds)

  evaluate = jax.jit(alg.evaluate)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, shards)
  return Program(init, run_rounds, evaluate, abstract)


LEGACY_NOTE = ("written before client states were packed (one buffer per dtype, "
               "fedjax_het.packing): restored as trees and packed")


def readers(abstract: State) -> dict:
  """``Checkpointer.restore_latest``'s ``readers`` for a state with packed client groups:
  ``{packing.TREE_LAYOUT: (abstract, convert, note)}``, or {} when nothing is packed.

  A checkpoint written before the packing holds each group's client state as a tree of
  stacked leaves: it restores into the abstract trees ``packing.unpack_abstract`` gives
  (same shardings), and is packed on the device after.
  """
  if not any(packing.is_packed(c) for c in abstract.clients):
    return {}
  trees = tuple(packing.unpack_abstract(c) if packing.is_packed(c) else c
                for c in abstract.clients)
  shards = tuple(jax.tree.map(lambda a: a.sharding, c) for c in abstract.clients)

  def convert(state: State) -> State:
    def one(tree, target, shard):
      if not packing.is_packed(target):
        return tree
      lead = len(target.buffers[target.spec.dtypes[0]].shape) - 1
      return jax.jit(lambda t: packing.pack(t, lead), out_shardings=shard)(tree)
    return state.replace(clients=tuple(map(one, state.clients, abstract.clients, shards)))
  return {packing.TREE_LAYOUT: (abstract.replace(clients=trees), convert, LEGACY_NOTE)}


def client_accuracies(counts) -> tuple:
  """``evaluate``'s ``(correct, total)`` per group -> accuracy per group ``[..., n_g]``."""
  return tuple(c / jnp.maximum(t, 1.0) for c, t in counts)


def mean_accuracy(accuracies: tuple, layout) -> jax.Array:
  """Mean over the real clients (not the padding slots) of per-group accuracies."""
  total = sum(jnp.sum(a[..., :n], axis=-1) for a, n in zip(accuracies, layout.group_sizes))
  return total / layout.num_clients


def compile_dispatch(exp: Experiment, max_rounds: int, data_axes=None) -> Callable:
  """``(state, data, n) -> (state, rows, accuracies)``: ``n <= max_rounds`` rounds, compiled.

  ``n`` is a traced argument (a ``lax.while_loop``), so the run compiles once whatever
  the number of rounds per dispatch; round ``i`` of the dispatch writes row ``i`` of
  every metric ``[max_rounds, ...]`` (rows from ``n`` on are zeros). ``config.eval_every``
  and ``config.num_rounds`` are traced arguments too (passed by the returned function),
  so configs that differ only in them compile one program (``dispatch_rows``). After
  each round that ``config.eval_every`` asks for (and the last), every client is
  evaluated on its own test split with the server's latest shared parameters inside the
  program (the papers' protocol): rows ``evaluated`` (bool) and ``mean_test_acc`` (the
  mean over clients, reduced on the device) and the latest evaluation's per-group
  accuracies come back with the dispatch, so evaluating every round costs no host round
  trip. The state buffers are donated. It compiles at its first call, ahead of running
  (``lower(...).compile()``, once per argument types), and gives the heap the compiler
  freed back before the rounds run. It compiles with the XLA options of its platform
  (``compile_options.dispatch_compiler_options``: on a GPU, no Triton GEMM fusions).

  Args:
    exp: the experiment (``config.eval_every``, ``config.num_rounds`` are read).
    max_rounds: most rounds of a dispatch (sizes the row buffers).
    data_axes: None for one run. For runs stacked on a leading replica axis
      (``loop.run_seeds``) the ``vmap`` axes of the data (``federated.stack_replicas``); every
      row then has the replica axis second (``[max_rounds, S, ...]``) and every
      accuracy first.
  """
  if clients_lib.is_debug(exp.runtime.client_parallelism):
    return debug_dispatch(exp, max_rounds, data_axes)
  alg, layout, config = exp.algorithm, exp.runtime.layout, exp.config
  replicas = data_axes is not None
  shards = state_shardings(jax.eval_shape(alg.init, jax.random.PRNGKey(0)),
                           exp.runtime.mesh, replicas)
  one_round, evaluate = round_with_checks(alg), alg.evaluate
  if replicas:
    parallelism = exp.runtime.client_parallelism
    one_round = map_replicas(one_round, data_axes, parallelism)
    evaluate = map_replicas(evaluate, data_axes, parallelism)
  # the row buffers' shapes and the loop body share one trace of each
  one_round, evaluate = traced_once(one_round), traced_once(evaluate)

  def zeros(tree, lead=()):
    return jax.tree.map(lambda a: jnp.zeros(lead + a.shape, a.dtype), tree)

  options = compile_options.dispatch_compiler_options(
      exp.runtime.mesh.devices.flat[0].platform)
  @functools.partial(jax.jit, donate_argnums=0, out_shardings=(shards, None, None),
                     compiler_options=options)
  def dispatch(state, data, n, schedule):
    eval_every, num_rounds = schedule[0], schedule[1]
    accuracies = zeros(jax.eval_shape(lambda: client_accuracies(evaluate(state, data))))
    metrics = jax.eval_shape(one_round, state, data)[1]
    rows = zeros(dict(metrics, evaluated=jax.ShapeDtypeStruct(state.round.shape, jnp.bool_),
                      mean_test_acc=jax.eval_shape(lambda: mean_accuracy(accuracies, layout))),
                 (max_rounds,))

    def body(carry):
      i, state, rows, accuracies = carry
      state, metrics = one_round(state, data)
      # the round's state in the carry's shardings: the per-group conditionals
      # (base.own_computation) drop them from their outputs' types, and ``evaluate``
      # must see the state's types it was traced with (one trace)
      state = jax.lax.with_sharding_constraint(state, shards)
      r = state.round[0] if replicas else state.round
      due = (r % eval_every == 0) | (r == num_rounds)
      accuracies = jax.lax.cond(due, lambda: client_accuracies(evaluate(state, data)),
                                lambda: accuracies)
      metrics = dict(metrics, evaluated=jnp.broadcast_to(due, state.round.shape),
                     mean_test_acc=mean_accuracy(accuracies, layout))
      rows = jax.tree.map(lambda r, v: r.at[i].set(v), rows, metrics)
      return i + 1, state, rows, accuracies

    _, state, rows, accuracies = jax.lax.while_loop(
        lambda c: c[0] < n, body, (jnp.zeros((), jnp.int32), state, rows, accuracies))
    return state, rows, accuracies

  schedule = np.array([config.eval_every, config.num_rounds], np.int32)  # numpy: replicated
  compiled = {}  # argument types -> the program compiled for them (as jit's own cache)

  def dispatch_rounds(state, data, n):
    # compiled ahead of its first run, and the heap the compiler freed given back
    # (host_memory) before the rounds allocate theirs: a lower peak resident memory
    # (docs/performance.md, "Program size and compile cost")
    key = argument_types((state, data))
    if key not in compiled:
      compiled[key] = dispatch.lower(state, data, n, schedule).compile()
      host_memory.release_freed()
    return compiled[key](state, data, n, schedule)
  # the jitted program and its last argument, to stage by hand (benchmarks/compile_time.py)
  dispatch_rounds.jitted, dispatch_rounds.schedule = dispatch, schedule
  return dispatch_rounds


def debug_dispatch(exp: Experiment, max_rounds: int, data_axes=None) -> Callable:
  """``compile_dispatch`` of a debug run (``runtime.client_parallelism`` 'debug' or
  'debug_eager'): the same ``(state, data, n) -> (state, rows, accuracies)``, its rounds
  a Python loop of ``alg.round`` (``rounds.debug_round``: clients one by one, an error
  naming its round, group and client) and its evaluations jitted, as due by
  ``config.eval_every``; ``n >= 1``. One run in one process only: seeds on a replica
  axis (``data_axes``) and a run over several processes are refused, before any round.
  """
  mode = exp.runtime.client_parallelism
  if data_axes is not None:
    raise ValueError(f"runtime.client_parallelism={mode!r} runs one seed at a time; run "
                     "the seeds one by one")
  if jax.process_count() > 1:
    raise ValueError(f"runtime.client_parallelism={mode!r} runs in one process; run it "
                     "without --num_processes")
  layout, config = exp.runtime.layout, exp.config
  one_round, evaluate = round_with_checks(exp.algorithm), jax.jit(exp.algorithm.evaluate)

  def dispatch_rounds(state, data, n):
    accuracies = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), jax.eval_shape(
        lambda: client_accuracies(evaluate(state, data))))
    rows = []
    for _ in range(int(n)):
      state, metrics = one_round(state, data)
      r = int(state.round)
      due = r % config.eval_every == 0 or r == config.num_rounds
      if due:
        accuracies = client_accuracies(evaluate(state, data))
      rows.append(dict(metrics, evaluated=jnp.asarray(due),
                       mean_test_acc=mean_accuracy(accuracies, layout)))
    rows = jax.tree.map(lambda *a: jnp.stack(a), *rows)
    rows = jax.tree.map(  # zero rows from n on, as the compiled dispatch's buffers
        lambda a: jnp.zeros((max_rounds,) + a.shape[1:], a.dtype).at[:len(a)].set(a), rows)
    return state, rows, accuracies
  return dispatch_rounds


def argument_types(tree) -> tuple:
  """What a compiled program is specialised to: ``tree``'s structure, and each leaf's
  shape, dtype, weak type and sharding (None for a numpy array)."""
  return jax.tree.structure(tree), tuple(
      (np.shape(a), np.dtype(getattr(a, "dtype", type(a))), getattr(a, "weak_type", False),
       getattr(a, "sharding", None)) for a in jax.tree.leaves(tree))


def map_replicas(fn: Callable, data_axes, parallelism: str) -> Callable:
  """``fn(state, data)`` over a leading replica axis (``loop.run_seeds``), as clients are mapped.

  ``parallelism`` as ``runtime.client_parallelism`` (``clients.resolve_parallelism``):
  ``vmap`` batches the replicas into one computation (accelerators: small runs fill the
  device); ``sequential`` (XLA:CPU's 'auto', where a vmapped conv net ran slower than
  a loop) runs them one after the other inside the one program, so S seeds still
  compile, load their data and dispatch once. Where ``fn`` returns ``(new state, rest)``
  (a round) each replica's new state overwrites its slot of the stacked state in place
  (a ``fori_loop``; otherwise a ``lax.map``): the program holds the S states and one
  replica's working set, not a second stacked state for the outputs.

  Args:
    fn: ``(state, data) -> out`` of one run.
    data_axes: the replica axis of each data leaf (0 or None: shared), a prefix tree of
      the data (``federated.stack_replicas``).
    parallelism: 'auto', 'vmap' or 'sequential'.

  Returns:
    ``(stacked state, stacked data) -> out`` with the replica axis leading every output.
  """
  if clients_lib.resolve_parallelism(parallelism) == "vmap":
    return jax.vmap(fn, in_axes=(0, data_axes))
  fn = traced_once(fn)  # its shapes below and the loop body share one trace
  is_axis = lambda a: a is None or isinstance(a, int)  # noqa: E731

  def mapped(state, data):
    stacked = jax.tree.map(lambda ax, d: d if ax == 0 else None, data_axes, data,
                           is_leaf=is_axis)

    def one(replica_state, replica_part):
      replica_data = jax.tree.map(lambda ax, part, d: part if ax == 0 else d,
                                  data_axes, replica_part, data, is_leaf=is_axis)
      return fn(replica_state, replica_data)

    first = lambda tree: jax.tree.map(lambda x: x[0], tree)  # noqa: E731
    out = jax.eval_shape(one, first(state), first(stacked))
    if not _returns_state(out, jax.eval_shape(first, state)):
      return jax.lax.map(lambda args: one(*args), (state, stacked))
    # (state, rest): each replica's new state overwrites its slot of the stacked state,
    # which XLA updates in place; a lax.map would allocate a second stacked state for
    # its outputs every call (more than twice the temporaries, and the page faults of
    # fresh buffers every round; docs/performance.md)
    num = jax.tree.leaves(state)[0].shape[0]
    rest = jax.tree.map(lambda a: jnp.zeros((num,) + a.shape, a.dtype), out[1])

    def body(i, carry):
      new_state, new_rest = one(clients_lib.row(carry[0], i), clients_lib.row(stacked, i))
      return (clients_lib.set_row(carry[0], i, new_state),
              clients_lib.set_row(carry[1], i, new_rest))
    return jax.lax.fori_loop(0, num, body, (state, rest))
  return mapped


def _returns_state(out, state) -> bool:
  """Whether ``out`` is ``(new state, rest)`` with the new state shaped as ``state``."""
  if not (isinstance(out, tuple) and len(out) == 2):
    return False
  same = jax.tree.structure(out[0]) == jax.tree.structure(state)
  return same and all(a.shape == b.shape and a.dtype == b.dtype for a, b in
                      zip(jax.tree.leaves(out[0]), jax.tree.leaves(state)))


def finite_groups(state: State) -> jax.Array:
  """bool [num_groups + 1]: every float leaf of each client group, then of the server, finite.

  A leaf is finite when ``sum(x * 0)`` is: a NaN or an infinity makes the product, and
  so the sum, NaN (XLA keeps ``x * 0`` for floats). It is one fused reduction over the
  leaf. ``all(isfinite(x))`` made XLA:CPU allocate a bool array the size of each packed
  group buffer, most of a dispatch's temporaries (docs/performance.md, "Program size and
  compile cost").
  """
  def finite(tree):
    leaves = [jnp.isfinite(jnp.sum(x * 0)) for x in jax.tree.leaves(tree)
              if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(leaves)) if leaves else jnp.array(True)
  return jnp.stack([finite(c) for c in state.clients] + [finite(state.server)])


def per_client_accuracy(exp: Experiment, counts) -> np.ndarray:
  """Test accuracy of every client (ordered by client id) from ``evaluate``'s counts.

  The counts are gathered from every process first, so all processes of a multi-process
  run get the same whole array.
  """
  counts = distributed.to_host(counts)
  correct = data_lib.unpad_clients([np.asarray(c) for c, _ in counts], exp.runtime.layout)
  total = data_lib.unpad_clients([np.asarray(t) for _, t in counts], exp.runtime.layout)
  return correct / np.maximum(total, 1)
