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
RESUMABLE_KEYS = ("num_rounds", "eval_every", "checkpoint_every", "keep_checkpoints",
                  "runtime.client_parallelism", "runtime.num_devices")


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
            build: Callable[[Any, Runtime], Algorithm] | None = None) -> Experiment:
  """Validates the config, loads and partitions the data, builds the algorithm.

  Args:
    config: experiment config (see ``fedjax_het.config.base_config``).
    build: optional ``(config, runtime) -> Algorithm`` overriding the config's algorithm
      (``algorithms.get_spec``), for research code plugging in its own algorithm.
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
  return Experiment(config, rt, algorithm, place_data(fed, mesh), counts, archs,
                    pool.summary(), pool.tables(train, test))


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



def state_shardings(abstract: State, mesh) -> State:
  """Client state sharded on its leading axis; round, rng and server replicated."""
  rep, cli = sharding.replicated(mesh), sharding.client_sharding(mesh)
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


def compile_dispatch(exp: Experiment, max_rounds: int) -> Callable:
  """Jitted ``(state, data, n) -> (state, metrics)`` running ``n <= max_rounds`` rounds.

  ``n`` is a traced argument (a ``lax.while_loop``), so the run compiles once whatever
  the number of rounds per dispatch; round ``i`` of the dispatch writes row ``i`` of
  every metric ``[max_rounds, ...]`` (rows from ``n`` on are zeros). The state buffers
  are donated.
  """
  alg, mesh = exp.algorithm, exp.runtime.mesh
  shards = state_shardings(jax.eval_shape(alg.init, jax.random.PRNGKey(0)), mesh)
  one_round = round_with_checks(alg)

  @functools.partial(jax.jit, donate_argnums=0, out_shardings=(shards, None))
  def dispatch(state, data, n):
    shapes = jax.eval_shape(one_round, state, data)[1]
    rows = jax.tree.map(lambda a: jnp.zeros((max_rounds,) + a.shape, a.dtype), shapes)

    def body(carry):
      i, state, rows = carry
      state, metrics = one_round(state, data)
      rows = jax.tree.map(lambda r, v: r.at[i].set(v), rows, metrics)
      return i + 1, state, rows

    _, state, rows = jax.lax.while_loop(lambda c: c[0] < n, body,
                                        (jnp.zeros((), jnp.int32), state, rows))
    return state, rows
  return dispatch


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
  """The next round after ``round_`` that evaluates, checkpoints or ends the run."""
  stops = [config.num_rounds, (round_ // config.eval_every + 1) * config.eval_every]
  if config.checkpoint_every:
    stops.append((round_ // config.checkpoint_every + 1) * config.checkpoint_every)
  return min(stops)


def check_finite(metrics: dict, first_round: int, archs) -> None:
  """Raises FloatingPointError at the first non-finite loss or parameter of a chunk.

  Args:
    metrics: the stacked metrics of rounds ``first_round + 1 ..``: ``group_train_loss``
      [rounds, groups] and ``group_finite`` [rounds, groups + 1] (last column: server).
    first_round: rounds completed before the chunk.
    archs: architecture of each group, for the message.
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
          f"non-finite {what} at round {first_round + r + 1} in {where}; rounds "
          f"{first_round + 1}-{first_round + len(losses)} were not saved; the last good "
          f"checkpoint (round {first_round} or earlier) is kept")


STANDARD_METRICS = ("train_loss", "group_train_loss", "uplink_params", "downlink_params",
                    "group_finite", "sampled_test_acc")
PROGRESS_S = 20.0  # aim for a progress line about this often (seconds)
MAX_DISPATCH = 1000  # most rounds in one dispatch (sizes the per-round metric buffers)


def extra_metrics(metrics: dict) -> dict:
  """An algorithm's own metrics (e.g. Moss's ``fidelity``) at the last round of a chunk."""
  return {k: np.asarray(v[-1]).tolist() for k, v in sorted(metrics.items())
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


def run(config: ml_collections.ConfigDict, workdir: str, *, fresh_start: bool = False,
        log: Callable[[str], None] = print, build=None) -> dict:
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

  Returns:
    The summary dict also written to ``summary.json``.
  """
  exp = prepare(config, build)  # all validation and data errors happen here
  config = exp.config
  workdir = os.path.abspath(workdir)  # orbax needs absolute paths
  primary = distributed.is_primary()
  log = log if primary else (lambda line: None)
  if fresh_start and primary:
    clear_outputs(workdir)
  os.makedirs(workdir, exist_ok=True)
  distributed.sync("fedjax_het:workdir_ready")
  init, _, evaluate, abstract = compile_fns(exp)
  max_rounds = min(config.num_rounds, MAX_DISPATCH)
  dispatch = compile_dispatch(exp, max_rounds)
  ckpt = (ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                                max_to_keep=config.keep_checkpoints,
                                fingerprint=fingerprint(exp),
                                defaults=config_lib.flat_defaults(config.algorithm)))
  restored = ckpt.restore_latest(abstract)
  if restored is None:
    state = init(jax.random.PRNGKey(config.seed))
    meta = {"uplink_params": 0.0, "downlink_params": 0.0, "wall_s": 0.0}
  else:
    state, meta = restored
    log(f"resumed from round {int(state.round)} in {workdir}")
  start = int(state.round)
  metrics_path = os.path.join(workdir, "metrics.jsonl")
  if primary:
    metrics_lib.write_json(os.path.join(workdir, "config.json"), config.to_dict())
    write_partition(workdir, exp)
    log_rows = metrics_lib.MetricsLog(metrics_path, start)
  distributed.sync("fedjax_het:outputs_ready")  # others read metrics.jsonl once rewritten
  if not primary:
    log_rows = metrics_lib.MetricsLog(metrics_path, start, write=False)
  if start < config.num_rounds:
    log(describe(exp, start))
  progress = metrics_lib.Progress(config.num_rounds, start, log)
  t0, wall0 = time.perf_counter(), meta["wall_s"]
  up, down = meta["uplink_params"], meta["downlink_params"]
  # the best sampled-client accuracy of every round so far (rounds between a logged row
  # and the checkpoint included: the checkpoint's meta carries it)
  best_sampled = meta.get("best_sampled_test_acc")
  acc, sampled, loss = None, None, float("nan")
  timing = {"first_dispatch_s": None, "round_s": None}
  r = start
  while r < config.num_rounds:
    stop = next_stop(r, config)
    # ---- train rounds r+1 .. r+n in one dispatch: one round first (progress from round
    # one, and it times the compilation), then about PROGRESS_S of rounds at a time
    if timing["first_dispatch_s"] is None or timing["round_s"] is None:
      n = 1
    elif jax.process_count() > 1:  # every process must dispatch alike: no local clocks
      n = stop - r
    else:
      n = int(max(1, min(PROGRESS_S / max(timing["round_s"], 1e-6), max_rounds)))
    n = min(n, stop - r)
    t_dispatch = time.perf_counter()
    state, m = dispatch(state, exp.data, np.int32(n))  # numpy: replicated in every process
    m = jax.tree.map(lambda a: a[:n], distributed.to_host(m))
    took = time.perf_counter() - t_dispatch
    if timing["first_dispatch_s"] is None:
      timing["first_dispatch_s"] = took
    elif timing["round_s"] is None:
      timing["round_s"] = took / n
      log(progress.estimate(timing["first_dispatch_s"], timing["round_s"],
                            jax.default_backend()))
    check_finite(m, r, exp.runtime.layout.archs)
    up += float(np.sum(m["uplink_params"]))
    down += float(np.sum(m["downlink_params"]))
    loss = float(m["train_loss"][-1])
    if "sampled_test_acc" in m:
      sampled = float(m["sampled_test_acc"][-1])
      chunk_best = float(np.max(m["sampled_test_acc"]))
      best_sampled = chunk_best if best_sampled is None else max(best_sampled, chunk_best)
    r += n
    wall = wall0 + time.perf_counter() - t0
    # ---- evaluate every client on its own test split, with the server's parameters
    evaluated = r % config.eval_every == 0 or r == config.num_rounds
    if evaluated:
      acc = per_client_accuracy(exp, evaluate(state, exp.data))
      wall = wall0 + time.perf_counter() - t0
      row = {"round": r, "mean_test_acc": float(acc.mean()), "train_loss": loss,
             "uplink_params": up, "downlink_params": down}
      if sampled is not None:
        row.update(sampled_test_acc=sampled, best_sampled_test_acc=best_sampled)
      log_rows.append({**row, **extra_metrics(m), "wall_s": wall})
    progress.update(r, float(acc.mean()) if evaluated else None, loss, sampled)
    # ---- checkpoint
    if (config.checkpoint_every and r % config.checkpoint_every == 0) or r == config.num_rounds:
      ckpt.save(r, state, {"round": r, "uplink_params": up, "downlink_params": down,
                           "wall_s": wall, "best_sampled_test_acc": best_sampled})
  ckpt.close()
  if acc is None:  # resumed a finished run: evaluate the restored state
    acc = per_client_accuracy(exp, evaluate(state, exp.data))
  rows = log_rows.rows
  summary = {
      "final_mean_test_acc": float(acc.mean()),
      "best_mean_test_acc": max(row["mean_test_acc"] for row in rows),
      "per_client_test_acc": acc.tolist(),
      "rounds_completed": r,
      "data": exp.data_source,
      "uplink_params": rows[-1]["uplink_params"],
      "downlink_params": rows[-1]["downlink_params"],
      # wall-clock figures (they differ between identical runs; comparisons drop them)
      "timing": {"wall_s": rows[-1]["wall_s"]},
      "config": config.to_dict(),
  }
  if "sampled_test_acc" in rows[-1]:
    summary.update(final_sampled_test_acc=rows[-1]["sampled_test_acc"],
                   best_sampled_test_acc=rows[-1]["best_sampled_test_acc"])
  if timing["first_dispatch_s"] is not None:
    # compilation: the first dispatch (one round) minus a compiled round's time
    summary["timing"].update(
        compile_s=timing["first_dispatch_s"] - (timing["round_s"] or 0.0),
        round_s=timing["round_s"])
  if primary:
    metrics_lib.write_json(os.path.join(workdir, "summary.json"), summary)
  return summary
