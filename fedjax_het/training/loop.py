"""The experiment runner: config -> data -> algorithm -> rounds -> metrics and checkpoints.

``run(config, workdir)`` is what ``experiments/main.py`` calls. It validates the config
and reads the data before anything is compiled or written, resumes from the newest
checkpoint in ``workdir/checkpoints``, and runs the rounds between two evaluations or
checkpoints as one compiled ``lax.scan`` (no host round-trip per round).
"""
from __future__ import annotations

import dataclasses
import functools
import os
import shutil
import time
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_het import clients as clients_lib
from fedjax_het import config as config_lib
from fedjax_het import data as data_lib
from fedjax_het import distributed, models, sharding
from fedjax_het.algorithms import Algorithm, Runtime, State, get_spec
from fedjax_het.data import partition_file
from fedjax_het.data.pool import (load_clients, load_pool,  # noqa: F401 (re-exported)
                                  partition_clients)
from fedjax_het.training import checkpoint as ckpt_lib
from fedjax_het.training import metrics as metrics_lib

# Keys that may change when a run is resumed (they do not change what is computed).
RESUMABLE_KEYS = ("num_rounds", "eval_every", "log_every", "checkpoint_every",
                  "keep_checkpoints", "runtime.client_parallelism", "runtime.num_devices")


@dataclasses.dataclass(frozen=True)
class Experiment:
  """Everything a run needs, built from a config before any compute.

  Attributes:
    config: the resolved config (algorithm defaults filled in).
    runtime: static client-side settings (layout, devices, ...).
    algorithm: the algorithm's pure functions.
    data: ``FederatedData`` placed on the devices.
    class_counts: int [num_clients, 2, num_classes], train and test class counts.
    client_archs: architecture name of each client.
    data_source: {'source', 'fingerprint', 'examples', 'image_shape', 'num_classes',
      'normalization'}: where the data was read, a hash of the dataset, the pool size,
      the images' shape, the classes and the per-channel (mean, std) used (recorded in
      ``summary.json``).
    tables: every client's train and test indices into the pool
      (``partition_file.ClientTables``; a run writes them to ``partition_indices.npz``).
  """
  config: ml_collections.ConfigDict
  runtime: Runtime
  algorithm: Algorithm
  data: data_lib.FederatedData
  class_counts: np.ndarray
  client_archs: tuple
  data_source: dict = dataclasses.field(default_factory=dict)
  tables: partition_file.ClientTables | None = None


def place_data(fed: data_lib.FederatedData, mesh) -> data_lib.FederatedData:
  """Pooled arrays replicated, client index tables sharded over the client axis."""
  return fed.replace(x=sharding.place_replicated(jnp.asarray(fed.x), mesh),
                     y=sharding.place_replicated(jnp.asarray(fed.y), mesh),
                     groups=sharding.place_clients(fed.groups, mesh))


def make_runtime(config, layout, mesh, normalization=None) -> Runtime:
  """The ``Runtime`` of a config (``mesh=None``: one device, as a deployment's processes).

  ``normalization``: the dataset's ``(mean, std)`` (``Pool.normalization``).
  """
  return Runtime(layout=layout, participation=config.participation,
                 local_epochs=config.local_epochs, batch_size=config.batch_size,
                 client_parallelism=config.runtime.client_parallelism,
                 num_shards=mesh.size if mesh is not None else 1, mesh=mesh,
                 compute_dtype=jnp.dtype(config.runtime.compute_dtype),
                 augment=config.data.augment, drop_last=config.drop_last,
                 reset_downloaded_momentum=config.reset_downloaded_momentum,
                 eval_sampled=config.eval_sampled, normalization=normalization)


def prepare(config: ml_collections.ConfigDict,
            build: Callable[[Any, Runtime], Algorithm] | None = None, *,
            place: bool = True) -> Experiment:
  """Validates the config, loads and partitions the data, builds the algorithm.

  Args:
    config: experiment config (see ``fedjax_het.config.base_config``).
    build: optional ``(config, runtime) -> Algorithm`` overriding the config's algorithm
      (``algorithms.get_spec``), for research code plugging in its own algorithm.
    place: put the data on the devices (False keeps numpy arrays: ``run_seeds`` stacks
      the data of several seeds first).
  """
  config_lib.validate(config)
  config = config_lib.with_algo_defaults(config)
  archs = tuple(models.client_archs(config.models, config.num_clients))
  pool, train, test, counts = load_clients(config)
  check_models(config, archs, pool)
  mesh = sharding.client_mesh(config.runtime.num_devices)
  fed, layout = data_lib.build_federated_data(
      pool.x, pool.y, train, test, archs, num_classes=pool.num_classes,
      pad_clients_to=mesh.size, pad_examples_to=config.batch_size)
  rt = make_runtime(config, layout, mesh, pool.normalization)
  algorithm = (build or get_spec(config.algorithm).build)(config, rt)
  return Experiment(config, rt, algorithm, place_data(fed, mesh) if place else fed, counts,
                    archs, pool.summary(), pool.tables(train, test))


def check_models(config, archs, pool) -> None:
  """Every architecture of the run (clients' and ``algo`` ones) takes the pool's images.

  Shapes only (``models.check_architectures``), before anything is compiled.
  """
  spec = get_spec(config.algorithm)
  extra = [v for k, v in config.algo.items()
           if isinstance(spec.choices.get(k), models.ArchitectureChoices)
           and v not in spec.choices[k].extra]
  models.check_architectures(tuple(archs) + tuple(extra), pool.image_shape,
                             pool.num_classes)



def state_shardings(abstract: State, mesh, replicas: bool = False) -> State:
  """Client state sharded on its client axis; round, rng and server replicated.

  ``replicas``: every leaf has a leading replica axis (``run_seeds``), kept whole.
  """
  rep, cli = sharding.replicated(mesh), sharding.client_sharding(mesh, replicas)
  return State(round=rep, rng=rep, clients=jax.tree.map(lambda _: cli, abstract.clients),
               server=jax.tree.map(lambda _: rep, abstract.server))


def round_with_checks(alg: Algorithm) -> Callable:
  """``alg.round`` whose metrics also say which groups' parameters are finite."""
  def one_round(state, data):
    state, metrics = alg.round(state, data)
    return state, dict(metrics, group_finite=finite_groups(state))
  return one_round


def compile_fns(exp: Experiment):
  """Jitted (init, run_rounds, evaluate) with fixed shardings; donated state buffers.

  ``run_rounds(state, data, num_rounds)`` scans a static number of rounds (one compile
  per ``num_rounds``); ``run`` uses ``compile_dispatch`` instead.
  """
  alg, mesh = exp.algorithm, exp.runtime.mesh
  abstract = jax.eval_shape(alg.init, jax.random.PRNGKey(0))
  shards = state_shardings(abstract, mesh)
  init = jax.jit(alg.init, out_shardings=shards)
  one_round = round_with_checks(alg)

  @functools.partial(jax.jit, static_argnums=2, donate_argnums=0,
                     out_shardings=(shards, None))
  def run_rounds(state, data, num_rounds):
    return jax.lax.scan(lambda s, _: one_round(s, data), state, None, length=num_rounds)

  evaluate = jax.jit(alg.evaluate)
  abstract = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                          abstract, shards)
  return init, run_rounds, evaluate, abstract


def client_accuracies(counts) -> tuple:
  """``evaluate``'s ``(correct, total)`` per group -> accuracy per group ``[..., n_g]``."""
  return tuple(c / jnp.maximum(t, 1.0) for c, t in counts)


def mean_accuracy(accuracies: tuple, layout) -> jax.Array:
  """Mean over the real clients (not the padding slots) of per-group accuracies."""
  total = sum(jnp.sum(a[..., :n], axis=-1) for a, n in zip(accuracies, layout.group_sizes))
  return total / layout.num_clients


def compile_dispatch(exp: Experiment, max_rounds: int, data_axes=None) -> Callable:
  """Jitted ``(state, data, n) -> (state, rows, accuracies)`` running ``n <= max_rounds`` rounds.

  ``n`` is a traced argument (a ``lax.while_loop``), so the run compiles once whatever
  the number of rounds per dispatch; round ``i`` of the dispatch writes row ``i`` of
  every metric ``[max_rounds, ...]`` (rows from ``n`` on are zeros). After each round
  that ``config.eval_every`` asks for (and the last), every client is evaluated on its own
  test split with the server's latest shared parameters inside the program (the papers'
  protocol): rows ``evaluated`` (bool) and ``mean_test_acc`` (the mean over clients,
  reduced on the device) and the latest evaluation's per-group accuracies come back with
  the dispatch, so evaluating every round costs no host round trip. The state buffers
  are donated.

  Args:
    exp: the experiment (``config.eval_every``, ``config.num_rounds`` are read).
    max_rounds: most rounds of a dispatch (sizes the row buffers).
    data_axes: None for one run. For runs stacked on a leading replica axis
      (``run_seeds``) the ``vmap`` axes of the data (``federated.stack_replicas``); every
      row then has the replica axis second (``[max_rounds, S, ...]``) and every
      accuracy first.
  """
  alg, layout, config = exp.algorithm, exp.runtime.layout, exp.config
  replicas = data_axes is not None
  shards = state_shardings(jax.eval_shape(alg.init, jax.random.PRNGKey(0)),
                           exp.runtime.mesh, replicas)
  one_round, evaluate = round_with_checks(alg), alg.evaluate
  if replicas:
    parallelism = exp.runtime.client_parallelism
    one_round = map_replicas(one_round, data_axes, parallelism)
    evaluate = map_replicas(evaluate, data_axes, parallelism)

  def zeros(tree, lead=()):
    return jax.tree.map(lambda a: jnp.zeros(lead + a.shape, a.dtype), tree)

  @functools.partial(jax.jit, donate_argnums=0, out_shardings=(shards, None, None))
  def dispatch(state, data, n):
    accuracies = zeros(jax.eval_shape(lambda: client_accuracies(evaluate(state, data))))
    metrics = jax.eval_shape(one_round, state, data)[1]
    rows = zeros(dict(metrics, evaluated=jax.ShapeDtypeStruct(state.round.shape, jnp.bool_),
                      mean_test_acc=jax.eval_shape(lambda: mean_accuracy(accuracies, layout))),
                 (max_rounds,))

    def body(carry):
      i, state, rows, accuracies = carry
      state, metrics = one_round(state, data)
      r = state.round[0] if replicas else state.round
      due = (r % config.eval_every == 0) | (r == config.num_rounds)
      accuracies = jax.lax.cond(due, lambda: client_accuracies(evaluate(state, data)),
                                lambda: accuracies)
      metrics = dict(metrics, evaluated=jnp.broadcast_to(due, state.round.shape),
                     mean_test_acc=mean_accuracy(accuracies, layout))
      rows = jax.tree.map(lambda r, v: r.at[i].set(v), rows, metrics)
      return i + 1, state, rows, accuracies

    _, state, rows, accuracies = jax.lax.while_loop(
        lambda c: c[0] < n, body, (jnp.zeros((), jnp.int32), state, rows, accuracies))
    return state, rows, accuracies
  return dispatch


def map_replicas(fn: Callable, data_axes, parallelism: str) -> Callable:
  """``fn(state, data)`` over a leading replica axis (``run_seeds``), as clients are mapped.

  ``parallelism`` as ``runtime.client_parallelism`` (``clients.resolve_parallelism``):
  ``vmap`` batches the replicas into one computation (accelerators: small runs fill the
  device); ``sequential`` (XLA:CPU's 'auto', where a vmapped conv net ran 2x slower than
  a loop) runs them one after the other with ``lax.map`` inside the one program, so S
  seeds still compile, load their data and dispatch once.

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
  is_axis = lambda a: a is None or isinstance(a, int)  # noqa: E731

  def mapped(state, data):
    stacked = jax.tree.map(lambda ax, d: d if ax == 0 else None, data_axes, data,
                           is_leaf=is_axis)

    def one(args):
      replica_state, replica_part = args
      replica_data = jax.tree.map(lambda ax, part, d: part if ax == 0 else d,
                                  data_axes, replica_part, data, is_leaf=is_axis)
      return fn(replica_state, replica_data)
    return jax.lax.map(one, (state, stacked))
  return mapped


def finite_groups(state: State) -> jax.Array:
  """bool [num_groups + 1]: every float leaf of each client group, then of the server, finite."""
  def finite(tree):
    leaves = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree)
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


def fingerprint(exp: Experiment) -> dict:
  """Flat dict of the config values that define what a run computes."""
  flat = {}

  def walk(prefix, d):
    for k, v in d.items():
      if isinstance(v, dict):
        walk(f"{prefix}{k}.", v)
      elif f"{prefix}{k}" not in RESUMABLE_KEYS:
        flat[f"{prefix}{k}"] = v

  walk("", exp.config.to_dict())
  flat["runtime.devices"] = exp.runtime.num_shards
  return flat


def describe(exp: Experiment, start: int) -> str:
  """One line on what will run: algorithm, data, clients, architectures, devices, rounds."""
  c = exp.config
  archs = ", ".join(f"{a} x{n}" for a, n in zip(exp.runtime.layout.archs,
                                               exp.runtime.layout.group_sizes))
  k = sum(exp.runtime.expected_sampled(g) for g in range(exp.runtime.layout.num_groups))
  devices = f"{exp.runtime.num_shards} {jax.default_backend()} device" + (
      "s" if exp.runtime.num_shards > 1 else "")
  src = exp.data_source
  shape = ("" if c.data.name in data_lib.DATASETS else " of " + "x".join(
      map(str, exp.runtime.layout.image_shape)) + f", {exp.runtime.layout.num_classes} "
      "classes")
  return (f"{c.algorithm} | {c.data.name} ({len(exp.data.y)} examples{shape}, pool "
          f"{c.data.pool}; {src.get('source', '?')}, fingerprint "
          f"{src.get('fingerprint', '?')}) | {c.num_clients} clients ({archs}), "
          f"{k:g} per round | "
          f"{devices} | rounds {start + 1}..{c.num_rounds}, E={c.local_epochs}, "
          f"B={c.batch_size}")


def next_stop(round_: int, config) -> int:
  """The next round after ``round_`` that checkpoints, ends the run or must log.

  Evaluation is no stop: it runs inside the compiled dispatch (``compile_dispatch``).
  ``log_every`` (0: off) bounds the rounds between two progress lines.
  """
  stops = [config.num_rounds]
  for every in (config.checkpoint_every, config.log_every):
    if every:
      stops.append((round_ // every + 1) * every)
  return min(stops)


def check_finite(metrics: dict, first_round: int, archs, where_prefix: str = "") -> None:
  """Raises FloatingPointError at the first non-finite loss or parameter of a chunk.

  Args:
    metrics: the stacked metrics of rounds ``first_round + 1 ..``: ``group_train_loss``
      [rounds, groups] and ``group_finite`` [rounds, groups + 1] (last column: server).
    first_round: rounds completed before the chunk.
    archs: architecture of each group, for the message.
    where_prefix: names the run in the message (``'seed 1: '`` in ``run_seeds``).
  """
  losses = np.asarray(metrics["group_train_loss"])
  finite = np.asarray(metrics["group_finite"])
  bad_loss = ~np.isfinite(losses)
  bad_params = ~finite[:, :-1]
  for r in range(len(losses)):
    groups = np.flatnonzero(bad_loss[r] | bad_params[r])
    if len(groups) or not finite[r, -1]:
      where = (f"client group {groups[0]} ({archs[groups[0]]})" if len(groups)
               else "the server state")
      what = "train loss" if len(groups) and bad_loss[r, groups[0]] else "parameter"
      raise FloatingPointError(
          f"{where_prefix}non-finite {what} at round {first_round + r + 1} in {where}; "
          f"rounds {first_round + 1}-{first_round + len(losses)} were not saved; the last "
          f"good checkpoint (round {first_round} or earlier) is kept")


STANDARD_METRICS = ("train_loss", "group_train_loss", "uplink_params", "downlink_params",
                    "group_finite", "sampled_test_acc", "evaluated", "mean_test_acc")
PROGRESS_S = 20.0  # aim for a progress line about this often (seconds)
MAX_DISPATCH = 1000  # most rounds in one dispatch (sizes the per-round metric buffers)


def extra_metrics(metrics: dict, row: int = -1) -> dict:
  """An algorithm's own metrics (e.g. Moss's ``fidelity``) at row ``row`` of a chunk."""
  return {k: np.asarray(v[row]).tolist() for k, v in sorted(metrics.items())
          if k not in STANDARD_METRICS}


def write_partition(workdir: str, exp: Experiment) -> None:
  """``partition.json``: every client's architecture and train/test class counts; and
  ``partition_indices.npz``: their exact train/test indices into the pool
  (``partition_file``; ``partition.kind='file'`` runs from it)."""
  metrics_lib.write_json(os.path.join(workdir, "partition.json"), {
      "clients": [{"client": k, "arch": exp.client_archs[k],
                   "train_class_counts": exp.class_counts[k, 0].tolist(),
                   "test_class_counts": exp.class_counts[k, 1].tolist()}
                  for k in range(len(exp.client_archs))]})
  if exp.tables is not None:
    partition_file.save(os.path.join(workdir, partition_file.INDICES_FILE), exp.tables)


def clear_outputs(workdir: str) -> None:
  """Removes the checkpoints and metrics of a previous run in ``workdir`` (fresh start)."""
  for name in ("checkpoints", "metrics.jsonl", "summary.json"):
    path = os.path.join(workdir, name)
    shutil.rmtree(path) if os.path.isdir(path) else (
        os.path.exists(path) and os.remove(path))


class RunFiles:
  """One run's outputs and running totals: its checkpoints, ``metrics.jsonl``, summary.

  ``run`` keeps one, ``run_seeds`` one per seed; the files are those of a separate run
  of that seed, so either resumes the other's.

  Args:
    exp: the run's experiment.
    workdir: its (absolute) output directory, already created.
    init, abstract: ``compile_fns``' jitted init and abstract state (for the restore).
    primary: whether this process writes files (process 0 of a multi-process run).
    log: progress lines.
    label: how messages name the run (``'seed 1: '`` in ``run_seeds``).
  """

  def __init__(self, exp: Experiment, workdir: str, init, abstract, *, primary: bool,
               log: Callable[[str], None], label: str = ""):
    config = exp.config
    self.exp, self.workdir, self.primary, self.label = exp, workdir, primary, label
    self.ckpt = ckpt_lib.Checkpointer(
        os.path.join(workdir, "checkpoints"), max_to_keep=config.keep_checkpoints,
        fingerprint=fingerprint(exp), defaults=config_lib.flat_defaults(config.algorithm))
    restored = self.ckpt.restore_latest(abstract)
    if restored is None:
      self.state = init(jax.random.PRNGKey(config.seed))
      meta = {"uplink_params": 0.0, "downlink_params": 0.0, "wall_s": 0.0}
    else:
      self.state, meta = restored
      log(f"{label}resumed from round {int(self.state.round)} in {workdir}")
    self.start = int(self.state.round)
    self.up, self.down, self.wall0 = (meta["uplink_params"], meta["downlink_params"],
                                      meta["wall_s"])
    # the best sampled-client accuracy of every round so far (rounds between a logged
    # row and the checkpoint included: the checkpoint's meta carries it)
    self.best_sampled = meta.get("best_sampled_test_acc")
    self.sampled, self.loss, self.acc, self.mean_acc = None, float("nan"), None, None
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    if primary:
      metrics_lib.write_json(os.path.join(workdir, "config.json"), config.to_dict())
      write_partition(workdir, exp)
      self.log_rows = metrics_lib.MetricsLog(metrics_path, self.start)

  def open_rows(self) -> None:
    """The non-primary processes read ``metrics.jsonl`` once process 0 rewrote it."""
    if not self.primary:
      self.log_rows = metrics_lib.MetricsLog(os.path.join(self.workdir, "metrics.jsonl"),
                                             self.start, write=False)

  def record(self, m: dict, first_round: int, accuracies, wall_s: float,
             took_s: float) -> None:
    """The rows of one dispatch: totals, and a ``metrics.jsonl`` row per evaluated round.

    Args:
      m: this run's rows of the dispatch, every leaf ``[n, ...]`` on the host.
      first_round: rounds completed before the dispatch.
      accuracies: per-group accuracies of the dispatch's last evaluation, or None.
      wall_s, took_s: the run's wall time before the dispatch, and the dispatch's; a row
        gets its share (the rounds of one dispatch are timed together).
    """
    check_finite(m, first_round, self.exp.runtime.layout.archs, self.label)
    n = len(m["train_loss"])
    ups = self.up + np.cumsum(m["uplink_params"], dtype=np.float64)
    downs = self.down + np.cumsum(m["downlink_params"], dtype=np.float64)
    for j in range(n):
      if "sampled_test_acc" in m:
        self.sampled = float(m["sampled_test_acc"][j])
        self.best_sampled = (self.sampled if self.best_sampled is None
                             else max(self.best_sampled, self.sampled))
      if not m["evaluated"][j]:
        continue
      self.mean_acc = float(m["mean_test_acc"][j])
      row = {"round": first_round + j + 1, "mean_test_acc": self.mean_acc,
             "train_loss": float(m["train_loss"][j]), "uplink_params": float(ups[j]),
             "downlink_params": float(downs[j])}
      if self.sampled is not None:
        row.update(sampled_test_acc=self.sampled, best_sampled_test_acc=self.best_sampled)
      self.log_rows.append({**row, **extra_metrics(m, j),
                            "wall_s": self.wall0 + wall_s + took_s * (j + 1) / n})
    self.up, self.down = float(ups[-1]), float(downs[-1])
    self.loss = float(m["train_loss"][-1])
    if accuracies is not None:
      self.acc = data_lib.unpad_clients([np.asarray(a) for a in accuracies],
                                        self.exp.runtime.layout)

  def save(self, round_: int, state: State, wall_s: float) -> None:
    """Checkpoints this run's ``state`` after ``round_`` rounds."""
    self.ckpt.save(round_, state, {
        "round": round_, "uplink_params": self.up, "downlink_params": self.down,
        "wall_s": self.wall0 + wall_s, "best_sampled_test_acc": self.best_sampled})

  def summary(self, rounds: int, timing: dict) -> dict:
    """``summary.json`` (written by the primary process) from the logged rows."""
    self.ckpt.close()
    rows = self.log_rows.rows
    summary = {
        "final_mean_test_acc": rows[-1]["mean_test_acc"],
        "best_mean_test_acc": max(row["mean_test_acc"] for row in rows),
        "per_client_test_acc": self.acc.tolist(),
        "rounds_completed": rounds,
        "data": self.exp.data_source,
        "uplink_params": rows[-1]["uplink_params"],
        "downlink_params": rows[-1]["downlink_params"],
        # wall-clock figures (they differ between identical runs; comparisons drop them)
        "timing": {"wall_s": rows[-1]["wall_s"], **timing},
        "config": self.exp.config.to_dict(),
    }
    if "sampled_test_acc" in rows[-1]:
      summary.update(final_sampled_test_acc=rows[-1]["sampled_test_acc"],
                     best_sampled_test_acc=rows[-1]["best_sampled_test_acc"])
    if self.primary:
      metrics_lib.write_json(os.path.join(self.workdir, "summary.json"), summary)
    return summary


class SeedsNotAligned(ValueError):
  """``run_seeds``: the seeds' checkpoints are at different rounds (run them separately)."""


class DeadlineReached(Exception):
  """A run passed its ``deadline``: it checkpointed round ``round`` and stopped.

  Calling ``run`` (or ``run_seeds``) again with the same arguments resumes it there.
  """

  def __init__(self, round_: int, num_rounds: int):
    super().__init__(f"deadline reached after round {round_} of {num_rounds}; "
                     "checkpointed, rerun to continue")
    self.round = round_


def run(config: ml_collections.ConfigDict, workdir: str, *, fresh_start: bool = False,
        log: Callable[[str], None] = print, build=None,
        deadline: float | None = None) -> dict:
  """Runs (or resumes) an experiment and returns its summary.

  In a multi-process run (``jax.distributed`` initialized first, see
  ``fedjax_het.distributed``) every process calls this with the same arguments and a
  shared ``workdir``; all take part in the rounds and in checkpoint saves and restores,
  process 0 alone writes the JSON outputs and calls ``log``, and all return the summary.

  Args:
    config: experiment config.
    workdir: output directory: ``metrics.jsonl``, ``summary.json``, ``partition.json``,
      ``config.json``, ``checkpoints/``.
    fresh_start: discard checkpoints and metrics of a previous run in ``workdir``.
    log: where progress lines go.
    build: optional algorithm builder (see ``prepare``).
    deadline: a ``time.time()`` after which the run checkpoints the round it reached
      and raises ``DeadlineReached`` (dispatches are sized not to overrun it by more
      than about one round); None: no limit.

  Returns:
    The summary dict also written to ``summary.json``.
  """
  exp = prepare(config, build)  # all validation and data errors happen here
  return _run_program([exp], [workdir], exp.data, None, fresh_start=fresh_start,
                      log=log, deadline=deadline)[0]


def run_seeds(configs, workdirs, *, fresh_start: bool = False,
              log: Callable[[str], None] = print, build=None,
              deadline: float | None = None) -> list[dict]:
  """Runs S configs that differ only in ``seed`` as ONE compiled program.

  Every seed has its own partition, initialisation, client sampling and augmentation
  keys, as in S separate ``run`` calls; the rounds of all seeds run on a leading replica
  axis (each seed's client tables padded to the widest, which changes no step):
  ``jax.vmap``-ed where clients are (accelerators: small runs fill the device), a
  ``lax.map`` on XLA:CPU (``map_replicas``); the program compiles once and the data is
  read once. Each seed
  writes the files of a separate run into its own workdir (``run`` with that seed's
  config resumes them, and the other way round); the per-seed metrics equal separate
  runs' to float tolerance (tests/test_replicas.py).

  The seeds must start from the same round (all fresh, or all checkpointed at the same
  round); otherwise ``SeedsNotAligned`` (a ValueError), and the caller runs them
  separately (the sweep does).

  Args:
    configs: S configs, equal but for ``seed``.
    workdirs: S distinct output directories.
    fresh_start, log, build, deadline: as ``run``.

  Returns:
    The S summaries, in the order of ``configs``.
  """
  if len(configs) != len(workdirs) or not configs:
    raise ValueError(f"run_seeds: {len(configs)} configs and {len(workdirs)} workdirs; "
                     "expected one workdir per config")
  if len(configs) == 1:
    return [run(configs[0], workdirs[0], fresh_start=fresh_start, log=log, build=build,
                deadline=deadline)]
  if len({os.path.abspath(w) for w in workdirs}) < len(workdirs):
    raise ValueError(f"run_seeds: the workdirs must differ; got {list(workdirs)}")
  if jax.process_count() > 1:
    raise ValueError("run_seeds runs in one process; run the seeds of a multi-process "
                     "run one at a time")
  exps = [prepare(c, build, place=False) for c in configs]
  check_replicas(exps)
  data, axes = data_lib.stack_replicas([e.data for e in exps])
  mesh = exps[0].runtime.mesh
  data = data.replace(x=sharding.place_replicated(jnp.asarray(data.x), mesh),
                      y=sharding.place_replicated(jnp.asarray(data.y), mesh),
                      groups=sharding.place_clients(data.groups, mesh, replicas=True))
  return _run_program(exps, workdirs, data, axes, fresh_start=fresh_start, log=log,
                      deadline=deadline)


def check_replicas(exps: list[Experiment]) -> None:
  """ValueError unless the experiments differ in ``seed`` alone (one program runs them)."""
  first = fingerprint(exps[0])
  for e in exps[1:]:
    diff = [k for k in sorted(set(first) | set(fingerprint(e)))
            if k != "seed" and first.get(k) != fingerprint(e).get(k)]
    if diff:
      raise ValueError(f"run_seeds: the configs must differ only in `seed`; they also "
                       f"differ in {diff}")
    if e.runtime.layout != exps[0].runtime.layout:
      raise ValueError("run_seeds: the seeds give other client groups; run them separately")


def _run_program(exps: list[Experiment], workdirs, data, data_axes, *, fresh_start: bool,
                 log: Callable[[str], None], deadline: float | None = None) -> list[dict]:
  """The loop of ``run`` (one experiment, ``data_axes`` None) and ``run_seeds`` (several).

  Trains in dispatches of several rounds (one round first: progress from round one,
  and it times the compilation; then about ``PROGRESS_S`` of rounds, at most up to the
  next checkpoint or ``log_every``, or the ``deadline``), records every run's rows,
  prints a progress line per dispatch and checkpoints every run.
  """
  exp, batched = exps[0], data_axes is not None
  config = exp.config
  workdirs = [os.path.abspath(w) for w in workdirs]  # orbax needs absolute paths
  primary = distributed.is_primary()
  log = log if primary else (lambda line: None)
  for w in workdirs:
    if fresh_start and primary:
      clear_outputs(w)
    os.makedirs(w, exist_ok=True)
  distributed.sync("fedjax_het:workdir_ready")
  init, _, evaluate, abstract = compile_fns(exp)
  max_rounds = min(config.num_rounds, MAX_DISPATCH)
  dispatch = compile_dispatch(exp, max_rounds, data_axes)
  labels = [f"seed {e.config.seed}: " if batched else "" for e in exps]
  runs = [RunFiles(e, w, init, abstract, primary=primary, log=log, label=label)
          for e, w, label in zip(exps, workdirs, labels)]
  distributed.sync("fedjax_het:outputs_ready")  # others read metrics.jsonl once rewritten
  for f in runs:
    f.open_rows()
  if len({f.start for f in runs}) > 1:
    raise SeedsNotAligned("run_seeds: the seeds' checkpoints are at different rounds "
                          f"({[f.start for f in runs]}); run them separately")
  start = runs[0].start
  if batched:
    state = jax.device_put(jax.tree.map(lambda *a: jnp.stack(a), *[f.state for f in runs]),
                           state_shardings(runs[0].state, exp.runtime.mesh, True))
  else:
    state = runs[0].state
  for f in runs:
    f.state = None  # the run's state lives in `state` from here on
  if start < config.num_rounds:
    seeds = (f" | seeds {', '.join(str(e.config.seed) for e in exps)} on a replica axis"
             if batched else "")
    log(describe(exp, start) + seeds)
  progress = metrics_lib.Progress(config.num_rounds, start, log)
  t0 = time.perf_counter()
  timing = {"first_dispatch_s": None, "round_s": None}
  take = (lambda tree, i, axis: jax.tree.map(lambda a: np.take(a, i, axis), tree)
          ) if batched else (lambda tree, i, axis: tree)
  r = start
  while r < config.num_rounds:
    stop = next_stop(r, config)
    if timing["first_dispatch_s"] is None or timing["round_s"] is None:
      n = 1
    elif jax.process_count() > 1:  # every process must dispatch alike: no local clocks
      n = stop - r
    else:
      n = int(max(1, min(PROGRESS_S / max(timing["round_s"], 1e-6), max_rounds)))
      if deadline is not None:
        n = int(max(1, min(n, (deadline - time.time()) / max(timing["round_s"], 1e-6))))
    n = min(n, stop - r)
    t_dispatch = time.perf_counter()
    state, rows, accuracies = dispatch(state, data, np.int32(n))  # numpy: replicated
    rows = jax.tree.map(lambda a: a[:n], distributed.to_host(rows))
    accuracies = distributed.to_host(accuracies) if np.any(rows["evaluated"]) else None
    took = time.perf_counter() - t_dispatch
    if timing["first_dispatch_s"] is None:
      timing["first_dispatch_s"] = took
    elif timing["round_s"] is None:
      timing["round_s"] = took / n
      log(progress.estimate(timing["first_dispatch_s"], timing["round_s"],
                            jax.default_backend()))
    wall = t_dispatch - t0
    for i, f in enumerate(runs):
      f.record(take(rows, i, 1), r, None if accuracies is None else take(accuracies, i, 0),
               wall, took)
    r += n
    progress.update(r, [f.mean_acc for f in runs], [f.loss for f in runs],
                    [f.sampled for f in runs],  # the accuracy's round: the last row's
                    acc_round=(runs[0].log_rows.rows or [{}])[-1].get("round"))
    late = deadline is not None and time.time() >= deadline and r < config.num_rounds
    if ((config.checkpoint_every and r % config.checkpoint_every == 0)
        or r == config.num_rounds or late):
      wall = time.perf_counter() - t0
      for i, f in enumerate(runs):
        f.save(r, jax.tree.map(lambda a: a[i], state) if batched else state, wall)
    if late:
      for f in runs:
        f.ckpt.close()
      raise DeadlineReached(r, config.num_rounds)
  if runs[0].acc is None:  # resumed a finished run: evaluate the restored state
    if batched:
      counts = jax.jit(map_replicas(exp.algorithm.evaluate, data_axes,
                                    exp.runtime.client_parallelism))(state, data)
    else:
      counts = evaluate(state, data)
    counts = distributed.to_host(counts)
    for i, f in enumerate(runs):
      f.acc = per_client_accuracy(exp, take(counts, i, 0))
  timing_out = {}
  if timing["first_dispatch_s"] is not None:
    # compilation: the first dispatch (one round) minus a compiled round's time
    timing_out = {"compile_s": timing["first_dispatch_s"] - (timing["round_s"] or 0.0),
                  "round_s": timing["round_s"]}
  if batched:
    timing_out["replicas"] = len(runs)
  return [f.summary(r, timing_out) for f in runs]
