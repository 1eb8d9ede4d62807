"""The driver of a run: config -> rounds in dispatches -> metrics, checkpoints, summary.

``run(config, workdir)`` is what ``experiments/main.py`` calls. It validates the config
and reads the data before anything is compiled or written (``experiment.prepare``),
resumes from the newest checkpoint in ``workdir/checkpoints`` (``runfiles.RunFiles``),
and runs the rounds between two progress lines or checkpoints as one compiled dispatch
(``program.compile_dispatch``: no host round-trip per round). ``run_seeds`` runs the
seeds of one config as one program.
"""
from __future__ import annotations

import os
import time
from typing import Callable

import jax
import ml_collections
import numpy as np

from fedjax_het import distributed
from fedjax_het.training import estimate
from fedjax_het.training import host_memory
from fedjax_het.training import metrics as metrics_lib
from fedjax_het.training.experiment import Experiment
from fedjax_het.training.experiment import describe
from fedjax_het.training.experiment import prepare
from fedjax_het.training.program import compile_dispatch
from fedjax_het.training.program import compile_fns
from fedjax_het.training.program import dispatch_rows
from fedjax_het.training.program import map_replicas
from fedjax_het.training.program import per_client_accuracy
from fedjax_het.training.program import replica_data
from fedjax_het.training.program import replica_state
from fedjax_het.training.runfiles import RunFiles
from fedjax_het.training.runfiles import clear_outputs
from fedjax_het.training.runfiles import fingerprint

PROGRESS_S = 20.0  # aim for a progress line about this often (seconds)


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
        deadline: float | None = None,
        on_progress: Callable[[int, int], None] | None = None,
        cpu_hint: bool = True) -> dict:
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
    build: optional algorithm builder (see ``experiment.prepare``).
    deadline: a ``time.time()`` after which the run checkpoints the round it reached
      and raises ``DeadlineReached`` (dispatches are sized not to overrun it by more
      than about one round); None: no limit.
    on_progress: called after every dispatch (on process 0) with ``(rounds completed,
      num_rounds)``; a sweep projects its ETA from it.
    cpu_hint: a long CPU run's estimate line names the ':cpu' config variants
      (``metrics.Progress``); a sweep turns it off.

  Returns:
    The summary dict also written to ``summary.json``.
  """
  exp = prepare(config, build)  # all validation and data errors happen here
  return _run_program([exp], [workdir], exp.data, None, fresh_start=fresh_start,
                      log=log, deadline=deadline, on_progress=on_progress,
                      cpu_hint=cpu_hint)[0]


def run_seeds(configs, workdirs, *, fresh_start: bool = False,
              log: Callable[[str], None] = print, build=None,
              deadline: float | None = None,
              on_progress: Callable[[int, int], None] | None = None,
              cpu_hint: bool = True) -> list[dict]:
  """Runs S configs that differ only in ``seed`` as ONE compiled program.

  Every seed has its own partition, initialisation, client sampling and augmentation
  keys, as in S separate ``run`` calls; the rounds of all seeds run on a leading replica
  axis (each seed's client tables padded to the widest, which changes no step):
  ``jax.vmap``-ed where clients are (accelerators: small runs fill the device), looped
  inside the program on XLA:CPU (``map_replicas``); the program compiles once and the
  data is read once. Each seed writes the files of a separate run into its own workdir
  (``run`` with that seed's config resumes them, and the other way round); the per-seed
  metrics equal separate runs' to float tolerance (tests/test_replicas.py).

  The seeds must start from the same round (all fresh, or all checkpointed at the same
  round); otherwise ``SeedsNotAligned`` (a ValueError), and the caller runs them
  separately (the sweep does).

  Args:
    configs: S configs, equal but for ``seed``.
    workdirs: S distinct output directories.
    fresh_start, log, build, deadline, on_progress, cpu_hint: as ``run``.

  Returns:
    The S summaries, in the order of ``configs``.
  """
  if len(configs) != len(workdirs) or not configs:
    raise ValueError(f"run_seeds: {len(configs)} configs and {len(workdirs)} workdirs; "
                     "expected one workdir per config")
  if len(configs) == 1:
    return [run(configs[0], workdirs[0], fresh_start=fresh_start, log=log, build=build,
                deadline=deadline, on_progress=on_progress, cpu_hint=cpu_hint)]
  if len({os.path.abspath(w) for w in workdirs}) < len(workdirs):
    raise ValueError(f"run_seeds: the workdirs must differ; got {list(workdirs)}")
  if jax.process_count() > 1:
    raise ValueError("run_seeds runs in one process; run the seeds of a multi-process "
                     "run one at a time")
  exps = [prepare(c, build, place=False) for c in configs]
  check_replicas(exps)
  data, axes = replica_data(exps)
  return _run_program(exps, workdirs, data, axes, fresh_start=fresh_start, log=log,
                      deadline=deadline, on_progress=on_progress, cpu_hint=cpu_hint)


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


def dispatch_size(round_: int, stop: int, round_s: float | None, *, max_rounds: int,
                  processes: int = 1, deadline: float | None = None,
                  now: float = 0.0) -> int:
  """How many rounds the next dispatch runs: a pure policy (it reads no clock).

  One round while no compiled round has been timed (the first dispatch times the
  compilation, the second a round), so progress shows from round one; then about
  ``PROGRESS_S`` of rounds, at most ``max_rounds`` and, with a ``deadline``, at most the
  rounds that fit before it (at least one). The processes of a multi-process run must
  dispatch alike and read no local clock: they go straight to ``stop``. Never past ``stop``.

  Args:
    round_: rounds completed.
    stop: the next round a dispatch must end at (``next_stop``).
    round_s: seconds of one compiled round (timed by the second dispatch); None before.
    max_rounds: most rounds of one dispatch (``compile_dispatch``'s row buffers).
    processes: ``jax.process_count()``.
    deadline, now: ``time.time()`` values: when the run must stop (None: never), and now.
  """
  if round_s is None:
    n = 1
  elif processes > 1:
    n = stop - round_
  else:
    per_round = max(round_s, 1e-6)
    n = int(max(1, min(PROGRESS_S / per_round, max_rounds)))
    if deadline is not None:
      n = int(max(1, min(n, (deadline - now) / per_round)))
  return min(n, stop - round_)


def _replica(tree, i: int, axis: int, batched: bool):
  """Run ``i``'s part of a dispatch's output (replica axis ``axis``); one run: the tree."""
  return jax.tree.map(lambda a: np.take(a, i, axis), tree) if batched else tree


def record_and_save(runs: list[RunFiles], state, rows: dict, accuracies, *,
                    first_round: int, n: int, progress: metrics_lib.Progress,
                    on_progress: Callable[[int, int], None], wall_s: float,
                    took_s: float, t0: float, deadline: float | None,
                    batched: bool) -> int:
  """After a dispatch: records every run's rows, reports progress, checkpoints when due.

  Every run checkpoints at a ``checkpoint_every`` round, at the last round, and once the
  ``deadline`` has passed, in which case ``DeadlineReached`` is raised.

  Args:
    runs: the runs' files (one per replica).
    state: the (stacked, if ``batched``) state after the dispatch.
    rows, accuracies: the dispatch's rows ``[n, ...]`` and last evaluation (or None), on
      the host, the replica axis second in rows and first in accuracies if ``batched``.
    first_round, n: rounds completed before the dispatch, and the dispatch's rounds.
    progress, on_progress: the progress lines, and the caller's callback.
    wall_s, took_s: wall time of the loop before the dispatch, and of the dispatch.
    t0: ``time.perf_counter()`` when the loop started (the checkpoints' wall time).
    deadline: ``time.time()`` after which the run stops, or None.
    batched: the runs are replicas of one program (``run_seeds``).

  Returns:
    Rounds completed after the dispatch.
  """
  for i, f in enumerate(runs):
    f.record(_replica(rows, i, 1, batched), first_round,
             None if accuracies is None else _replica(accuracies, i, 0, batched),
             wall_s, took_s)
  config = runs[0].exp.config
  r, num_rounds = first_round + n, config.num_rounds
  on_progress(r, num_rounds)  # first: a sweep's ETA on the round line below is current
  progress.update(r, [f.mean_acc for f in runs], [f.loss for f in runs],
                  [f.sampled for f in runs],  # the accuracy's round: the last row's
                  acc_round=(runs[0].log_rows.rows or [{}])[-1].get("round"))
  late = deadline is not None and time.time() >= deadline and r < num_rounds
  if ((config.checkpoint_every and r % config.checkpoint_every == 0)
      or r == num_rounds or late):
    wall = time.perf_counter() - t0
    for i, f in enumerate(runs):
      f.save(r, jax.tree.map(lambda a, i=i: a[i], state) if batched else state, wall)
  if late:
    for f in runs:
      f.ckpt.close()
    raise DeadlineReached(r, num_rounds)
  return r


def _open_runs(exps, workdirs, fns, *, primary: bool, log, batched: bool):
  """Every run's ``RunFiles`` (restored or initialised) and the state the program runs on."""
  labels = [f"seed {e.config.seed}: " if batched else "" for e in exps]
  runs = [RunFiles(e, w, fns.init, fns.abstract, primary=primary, log=log, label=label)
          for e, w, label in zip(exps, workdirs, labels)]
  distributed.sync("fedjax_het:outputs_ready")  # others read metrics.jsonl once rewritten
  for f in runs:
    f.open_rows()
  if len({f.start for f in runs}) > 1:
    raise SeedsNotAligned("run_seeds: the seeds' checkpoints are at different rounds "
                          f"({[f.start for f in runs]}); run them separately")
  if batched:
    state = replica_state([f.state for f in runs], exps[0].runtime.mesh)
  else:
    state = runs[0].state
  for f in runs:
    f.state = None  # the run's state lives in `state` from here on
  return runs, state


def _summaries(runs: list[RunFiles], rounds: int, timing: dict, state, data, data_axes,
               evaluate) -> list[dict]:
  """Every run's summary; a resumed finished run's accuracies from its restored state."""
  exp, batched = runs[0].exp, data_axes is not None
  if runs[0].acc is None:  # resumed a finished run: evaluate the restored state
    if batched:
      counts = jax.jit(map_replicas(exp.algorithm.evaluate, data_axes,
                                    exp.runtime.client_parallelism))(state, data)
    else:
      counts = evaluate(state, data)
    counts = distributed.to_host(counts)
    for i, f in enumerate(runs):
      f.acc = per_client_accuracy(exp, _replica(counts, i, 0, batched))
  timing_out = {}
  if timing["first_dispatch_s"] is not None:
    # compilation: the first dispatch (one round) minus a compiled round's time
    timing_out = {"compile_s": timing["first_dispatch_s"] - (timing["round_s"] or 0.0),
                  "round_s": timing["round_s"]}
  if batched:
    timing_out["replicas"] = len(runs)
  return [f.summary(rounds, timing_out) for f in runs]


def _run_program(exps: list[Experiment], workdirs, data, data_axes, *, fresh_start: bool,
                 log: Callable[[str], None], deadline: float | None = None,
                 on_progress: Callable[[int, int], None] | None = None,
                 cpu_hint: bool = True) -> list[dict]:
  """The loop of ``run`` (one experiment, ``data_axes`` None) and ``run_seeds`` (several).

  Trains in dispatches of ``dispatch_size`` rounds, up to ``next_stop`` at most, and
  after each records every run's rows, prints a progress line and checkpoints every run
  when due (``record_and_save``).
  """
  exp, batched = exps[0], data_axes is not None
  config = exp.config
  workdirs = [os.path.abspath(w) for w in workdirs]  # the paths its lines and files name
  primary = distributed.is_primary()
  log = log if primary else (lambda line: None)
  on_progress = on_progress if primary and on_progress else (lambda done, total: None)
  for w in workdirs:
    if fresh_start and primary:
      clear_outputs(w)
    os.makedirs(w, exist_ok=True)
  distributed.sync("fedjax_het:workdir_ready")
  fns = compile_fns(exp)
  if jax.default_backend() == "cpu" and jax.process_count() == 1:
    warning = estimate.memory_warning(estimate.tree_bytes(fns.abstract), len(exps),
                                      estimate.available_memory())
    if warning:
      log(warning)
  max_rounds = dispatch_rows(config.num_rounds)
  dispatch = compile_dispatch(exp, max_rounds, data_axes)
  runs, state = _open_runs(exps, workdirs, fns, primary=primary, log=log, batched=batched)
  # the init ran once: its compiled program and what it freed (on the CPU quickstart
  # about 600 MiB, docs/performance.md "Program size and compile cost") are given back
  # before the dispatch compiles and runs
  fns.init.clear_cache()
  host_memory.release_freed()
  r = runs[0].start
  if r < config.num_rounds:
    seeds = (f" | seeds {', '.join(str(e.config.seed) for e in exps)} on a replica axis"
             if batched else "")
    log(describe(exp, r) + seeds)
  progress = metrics_lib.Progress(config.num_rounds, r, log, cpu_hint=cpu_hint)
  t0 = time.perf_counter()
  timing = {"first_dispatch_s": None, "round_s": None}
  while r < config.num_rounds:
    n = dispatch_size(r, next_stop(r, config), timing["round_s"], max_rounds=max_rounds,
                      processes=jax.process_count(), deadline=deadline, now=time.time())
    t_dispatch = time.perf_counter()
    state, rows, accuracies = dispatch(state, data, np.int32(n))  # numpy: replicated
    rows = jax.tree.map(lambda a, n=n: a[:n], distributed.to_host(rows))
    accuracies = distributed.to_host(accuracies) if np.any(rows["evaluated"]) else None
    took = time.perf_counter() - t_dispatch
    if timing["first_dispatch_s"] is None:
      timing["first_dispatch_s"] = took
    elif timing["round_s"] is None:
      timing["round_s"] = took / n
      log(progress.estimate(timing["first_dispatch_s"], timing["round_s"],
                            jax.default_backend()))
    r = record_and_save(runs, state, rows, accuracies, first_round=r, n=n,
                        progress=progress, on_progress=on_progress,
                        wall_s=t_dispatch - t0, took_s=took, t0=t0, deadline=deadline,
                        batched=batched)
    host_memory.release_freed()  # what the dispatch and a checkpoint freed
  return _summaries(runs, r, timing, state, data, data_axes, fns.evaluate)
