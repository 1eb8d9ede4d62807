r"""Runs a grid of experiments (algorithms x settings x seeds) and tabulates the results.

  python experiments/sweep.py --sweep=experiments/sweeps/smoke.py --sweep_dir=/tmp/sweep
  python experiments/sweep.py --sweep=experiments/sweeps/paper_table.py \
      --sweep_dir=runs/paper_table --sweep.seeds=0,1
  python experiments/sweep.py --sweep=experiments/sweeps/paper_table.py \
      --sweep_dir=runs/paper_table --dry_run      # list the runs, run nothing
  python experiments/sweep.py --sweep=experiments/claims/table.py \
      --sweep_dir=runs/two --sweep.algorithms=standalone,fedmoe   # two of its rows

A sweep file's ``get_config()`` returns a ConfigDict of ``algorithms``, ``settings`` and
``seeds`` (``fedjax_het.sweeps.plan`` says what each holds); an algorithm given by name
is ``<configs_dir>/<name>.py``, the folder the caller passes (``experiments/sweep.py``:
its own folder, ``experiments/``). ``--sweep.algorithms=a,b`` and ``--sweep.settings=s,t``
(names or slugs) run some of the file's rows and columns (``plan.select``): the
overrides of the rows left out are dropped, with a line that says so.

Every run is ``loop.run`` in this process, in ``<sweep_dir>/<algorithm>/<setting
slug>/seed<k>/``. A run whose ``summary.json`` says it finished (with the same config) is
skipped; a half-finished one resumes from its checkpoint, so rerunning a killed sweep
continues it; a finished one keeps only its last checkpoint step (``--keep_checkpoints``:
a step of an N=100 run is about 1.7 GB). After every run ``results.csv`` and
``results.md`` (rows methods, columns settings, mean +- std over seeds of the final mean
test accuracy, best per column in bold; ``fedjax_het.sweeps.tables``) are rewritten;
``sweep.json`` records the command, the sweep config and the environment for
``experiments/results_page.py``. Progress lines carry the sweep's ETA
(``fedjax_het.sweeps.eta``).
"""
from __future__ import annotations

import functools
import json
import os
import shlex
import subprocess
import sys
import time
from typing import Callable, Sequence

import jax
import ml_collections

from fedjax_het.sweeps import budget
from fedjax_het.sweeps import eta as eta_lib
from fedjax_het.sweeps import tables
from fedjax_het.sweeps.plan import Run
from fedjax_het.sweeps.plan import finished_summary
from fedjax_het.sweeps.plan import plan
from fedjax_het.sweeps.plan import select
from fedjax_het.sweeps.plan import slug
from fedjax_het.training import checkpoint as ckpt_lib
from fedjax_het.training import estimate
from fedjax_het.training import experiment
from fedjax_het.training import loop
from fedjax_het.training import metrics as metrics_lib

# Raised by a run that the sweep records as failed and moves past.
RUN_ERRORS = (FloatingPointError,)


def environment(directory: str | None = None) -> dict:
  """JAX version, devices and the git commit of ``directory`` (default: the current
  one), recorded with the results."""
  def git(*args):
    return subprocess.run(["git", *args], capture_output=True, text=True,
                          cwd=directory, timeout=10).stdout.strip()

  try:
    commit = git("rev-parse", "--short", "HEAD")
    commit += "+uncommitted changes" if commit and git("status", "--porcelain") else ""
  except (OSError, subprocess.SubprocessError):
    commit = ""
  devices = jax.devices()
  return {"jax": jax.__version__, "backend": jax.default_backend(),
          "devices": f"{len(devices)} x {devices[0].device_kind}", "git_commit": commit}


def write_manifest(sweep_dir: str, sweep: ml_collections.ConfigDict, runs: Sequence[Run],
                   command: str | None, source_dir: str | None = None) -> None:
  """``sweep.json``: the command, the sweep config, the runs and the environment
  (``environment(source_dir)``).

  Without a ``command`` (a call from Python) the one recorded earlier is kept.
  """
  path = os.path.join(sweep_dir, "sweep.json")
  if command is None and os.path.exists(path):
    with open(path) as f:
      command = json.load(f).get("command")
  metrics_lib.write_json(path, {
      "command": command, "sweep": sweep.to_dict(), "environment": environment(source_dir),
      "settings": {r.setting: slug(r.setting) for r in runs},
      "runs": [{"algorithm": r.algorithm, "setting": r.setting, "seed": r.seed,
                "workdir": os.path.relpath(r.workdir, sweep_dir)} for r in runs]})


def batches(runs: Sequence[Run], done: Sequence[dict | None], seed_batch: int,
            order: Callable[[Run], object] | None = None) -> list[list[int]]:
  """Which unfinished runs to compute together, as lists of positions in ``runs``.

  With ``seed_batch`` > 1 the unfinished seeds of one (algorithm, setting) cell are
  taken ``seed_batch`` at a time (``loop.run_seeds``: one program, a replica axis over
  seeds). Batches follow ``order`` (a sort key of a batch's first run; stable) or the
  plan's order.
  """
  todo = [i for i, s in enumerate(done) if s is None]
  if seed_batch <= 1:
    out = [[i] for i in todo]
  else:
    cells: dict = {}
    for i in todo:
      cells.setdefault((runs[i].algorithm, runs[i].setting), []).append(i)
    out = sorted((idx[j:j + seed_batch] for idx in cells.values()
                  for j in range(0, len(idx), seed_batch)), key=lambda b: b[0])
  return sorted(out, key=lambda b: order(runs[b[0]])) if order else out


def batch_prefix(positions: Sequence[int], total: int, runs: Sequence[Run]) -> str:
  """``'[4-6/30] fedmrl | N=10,C=100% | seeds 0,1,2'`` (one run: ``eta.run_prefix``).

  Positions that are not consecutive (a cell's seeds 1 and 2 after every method's seed
  0) are listed: ``'[14,24/30] ...'``.
  """
  first = runs[positions[0]]
  if len(positions) == 1:
    return eta_lib.run_prefix(positions[0] + 1, total, first)
  seeds = ",".join(str(runs[i].seed) for i in positions)
  consecutive = list(positions) == list(range(positions[0], positions[-1] + 1))
  where = (f"{positions[0] + 1}-{positions[-1] + 1}" if consecutive
           else ",".join(str(i + 1) for i in positions))
  return f"[{where}/{total}] {first.algorithm} | {first.setting} | seeds {seeds}"


def run_batch(batch: Sequence[Run], log: Callable[[str], None],
              deadline: float | None = None,
              on_progress: Callable[[int, int], None] | None = None) -> list:
  """Summaries (or an error per run) of a batch: ``loop.run_seeds``, else one by one.

  A batch whose seeds cannot share a program (checkpoints at different rounds), or
  that fails (one seed's non-finite loss stops the program), is run again seed by seed,
  each resuming from its own checkpoint, so the healthy seeds finish. A run that passes
  the ``deadline`` raises ``loop.DeadlineReached`` (checkpointed). ``on_progress`` goes
  to the loop (``(rounds completed, num_rounds)`` after every dispatch). The loop's
  hint at the ':cpu' config variants is off: the sweep file fixes the configs.
  """
  if len(batch) > 1:
    try:
      return loop.run_seeds([r.config for r in batch], [r.workdir for r in batch],
                            log=log, deadline=deadline, on_progress=on_progress,
                            cpu_hint=False)
    except (loop.SeedsNotAligned, *RUN_ERRORS) as err:
      log(f"seeds run one by one ({type(err).__name__}: {err})")
  out = []
  for r in batch:
    try:
      out.append(loop.run(r.config, r.workdir, log=log, deadline=deadline,
                          on_progress=on_progress, cpu_hint=False))
    except RUN_ERRORS as err:
      out.append(err)
  return out


def first_calibration(runs: Sequence[Run], positions: Sequence[int]) -> estimate.Calibration:
  """``estimate.calibrate`` of a batch as ``run_batch`` runs it: its seeds on a replica
  axis, or its first run alone where they cannot share one (or it has one seed)."""
  if len(positions) > 1:
    exps = [experiment.prepare(runs[i].config, place=False) for i in positions]
    try:
      loop.check_replicas(exps)
    except ValueError:
      pass  # run_batch runs these seeds one by one
    else:
      return estimate.calibrate(exps)
  return estimate.calibrate(experiment.prepare(runs[positions[0]].config))


def print_plan(runs: Sequence[Run], jobs: Sequence[Sequence[int]], sweep_dir: str,
               budget_s: float | None, log: Callable[[str], None]) -> None:
  """The FLOPs and estimated time of every batch still to run, before the sweep starts.

  The calibration times the first batch as it will run (``estimate.calibrate``: one run,
  or its seeds on the replica axis); see ``fedjax_het.sweeps.budget``.
  """
  costs = budget.cell_costs(runs, [i for b in jobs for i in b], sweep_dir, log)
  calibration = first_calibration(runs, jobs[0])
  lines = budget.plan_budget(runs, jobs, costs, calibration, budget_s)
  for line in budget.format_plan(runs, lines, calibration, budget_s):
    log(line)


def run_sweep(sweep: ml_collections.ConfigDict, sweep_dir: str, *,
              log: Callable[[str], None] = print, command: str | None = None,
              seed_batch: int = 1, order: Callable[[Run], object] | None = None,
              deadline: float | None = None, estimate_first: bool = False,
              configs_dir: str | None = None, keep_checkpoints: str = "last") -> list[dict]:
  """Runs every unfinished run of the sweep and writes the results.

  Args:
    sweep: the sweep config (see ``fedjax_het.sweeps.plan``).
    sweep_dir: output directory; rerunning continues a killed sweep.
    log: where progress lines go.
    command: the command line, recorded in ``sweep.json``.
    seed_batch: seeds of a cell run together on a replica axis (``batches``); 1: one
      run at a time.
    order: sort key of the runs (``batches``); default the plan's order.
    deadline: a ``time.time()``: no batch starts after it, and the run in progress
      checkpoints and stops there (``loop.DeadlineReached``); rerunning continues.
    estimate_first: print the FLOPs and estimated time of every run still to do, and
      which fit before the deadline, before starting (``print_plan``).
    configs_dir: the folder of the config files of algorithms given by name
      (``plan``); ``sweep.json`` records its git commit (else the current folder's).
    keep_checkpoints: what a run keeps of its checkpoints once it has finished
      (``checkpoint.prune``): 'last' (its final step), 'none' or 'all'. A run
      interrupted or failed keeps them all, to resume.

  Returns:
    The ``results.csv`` rows of the finished and failed runs, in run order.
  """
  if not isinstance(seed_batch, int) or seed_batch < 1:
    raise ValueError(f"seed_batch={seed_batch!r} must be an integer >= 1")
  ckpt_lib.check_keep(keep_checkpoints, "keep_checkpoints")
  # every config is validated before anything runs
  runs = plan(sweep, sweep_dir, configs_dir=configs_dir)
  os.makedirs(sweep_dir, exist_ok=True)
  write_manifest(sweep_dir, sweep, runs, command, configs_dir)
  done = [finished_summary(r) for r in runs]
  todo = sum(s is None for s in done)
  log(f"sweep: {len(runs)} runs, {len(runs) - todo} finished earlier, {todo} to run "
      f"-> {sweep_dir}" + (f" (seeds {seed_batch} at a time)" if seed_batch > 1 else ""))
  rows, by_cell = {}, {}  # by_cell: (algorithm, setting) -> seconds of its finished runs
  for i, (run, summary) in enumerate(zip(runs, done)):
    if summary is not None:
      log(f"{eta_lib.run_prefix(i + 1, len(runs), run)} | finished earlier (final mean "
          f"test acc {100 * summary['final_mean_test_acc']:.2f}%), skipped")
      rows[i] = tables.result_row(run, sweep_dir, summary, "done")
  jobs = batches(runs, done, seed_batch, order)
  if estimate_first and jobs:
    print_plan(runs, jobs, sweep_dir, None if deadline is None else deadline - time.time(),
               log)
  # each cell's FLOPs (costs.json, written by the estimate) weigh the ETA of cells
  # that have not run yet
  flops = {cell: cost["total_flops"]
           for cell, cost in budget.saved_costs(runs, sweep_dir).items()}
  for j, positions in enumerate(jobs):
    if deadline is not None and time.time() >= deadline:
      log(f"sweep: the time budget is used up; {todo} runs left, rerun to continue")
      break
    batch = [runs[i] for i in positions]
    prefix = batch_prefix(positions, len(runs), runs)
    todo -= len(batch)
    t0 = time.perf_counter()
    elapsed = lambda t0=t0: time.perf_counter() - t0  # the batch's wall seconds
    later = [runs[i] for b in jobs[j + 1:] for i in b]
    cell = (batch[0].algorithm, batch[0].setting)
    eta = functools.partial(eta_lib.seconds_left, by_cell, later, flops, current=batch[0],
                            runs_now=len(batch))
    where = batch[0].workdir if len(batch) == 1 else os.path.join(
        os.path.dirname(batch[0].workdir), "seed{" + ",".join(str(r.seed) for r in batch) + "}")
    log(f"{prefix} | start -> {where} | sweep ETA {metrics_lib.format_s(eta(0.0, None))}")
    run_log, on_progress = eta_lib.prefixed_log(log, prefix, elapsed, eta)
    try:
      outcomes = run_batch(batch, run_log, deadline, on_progress)
    except loop.DeadlineReached as err:
      log(f"{prefix} | {err}; the sweep stops here, rerun to continue")
      break
    took = time.perf_counter() - t0
    # per run: a batch shares its time
    by_cell.setdefault(cell, []).extend([took / len(batch)] * len(batch))
    left = eta_lib.seconds_left(by_cell, later, flops)
    for i, run, out in zip(positions, batch, outcomes):
      tag = eta_lib.run_prefix(i + 1, len(runs), run)
      if isinstance(out, Exception):
        log(f"{tag} | FAILED: {out}")
        rows[i] = tables.result_row(run, sweep_dir, None, f"failed: {type(out).__name__}")
      else:
        rows[i] = tables.result_row(run, sweep_dir, out, "done")
        freed = ckpt_lib.prune(os.path.join(run.workdir, "checkpoints"), keep_checkpoints)
        log(f"{tag} | done in {metrics_lib.format_s(took)}: final mean test acc "
            f"{100 * out['final_mean_test_acc']:.2f}%"
            + (f" | checkpoints pruned to {keep_checkpoints!r}: {freed / 2**20:.1f} MiB "
               "freed" if freed else "")
            + f" | sweep ETA {metrics_lib.format_s(left)}")
    tables.write_results(sweep_dir, [rows[i] for i in sorted(rows)], runs, sweep.seeds)
  rows = [rows[i] for i in sorted(rows)]
  tables.write_results(sweep_dir, rows, runs, sweep.seeds)
  return rows


SUBSET_KEYS = ("algorithms", "settings")  # --sweep.<key>=a,b: a subset (plan.select)


def subset_args(argv: Sequence[str], flag: str = "sweep") -> tuple[list[str], dict]:
  """``argv`` without its ``--<flag>.algorithms`` / ``--<flag>.settings`` (``=a,b`` or
  the value as the next argument), and their texts by key (a repeated one joined by a
  comma): lists that ml_collections' overrides do not take, read by ``plan.select``."""
  rest, texts, i = [], {}, 0
  while i < len(argv):
    arg = argv[i]
    key = next((k for k in SUBSET_KEYS if arg == f"--{flag}.{k}"
                or arg.startswith(f"--{flag}.{k}=")), None)
    if key is None:
      rest.append(arg)
    elif "=" in arg:
      texts.setdefault(key, []).append(arg.split("=", 1)[1])
    elif i + 1 < len(argv):
      texts.setdefault(key, []).append(argv[i + 1])
      i += 1
    else:
      texts.setdefault(key, []).append("")
    i += 1
  return rest, {k: ",".join(v) for k, v in texts.items()}


def cli(configs_dir: str | None = None) -> None:
  """The command line: ``--sweep`` (config file), ``--sweep_dir``, ``--dry_run``.

  ``configs_dir``: the folder of the config files of algorithms given by name
  (``experiments/sweep.py`` passes its own folder).
  """
  from absl import flags  # noqa: PLC0415 - importing sweep defines no flags
  from ml_collections import config_flags  # noqa: PLC0415

  from fedjax_het import cli as cli_lib  # noqa: PLC0415
  from fedjax_het.training import compile_cache  # noqa: PLC0415

  argv, subset = subset_args(sys.argv)  # ml_collections reads the others (sys_argv)
  sweep_flag = config_flags.DEFINE_config_file(
      "sweep", None, "Sweep config file (experiments/sweeps/smoke.py); "
      "--sweep.algorithms=a,b and --sweep.settings=s,t (names or slugs) run some of its "
      "rows and columns, dropping the overrides of the rows left out", lock_config=True,
      sys_argv=argv)
  dir_flag = flags.DEFINE_string("sweep_dir", None, "Output directory: a run per "
                                 "algorithm, setting and seed, and the tables (a rerun "
                                 "continues it)")
  dry_flag = flags.DEFINE_bool("dry_run", False, "List the runs and whether each has "
                               "finished, run nothing, and exit")
  batch_flag = flags.DEFINE_integer(
      "seed_batch", 1, "Seeds of a cell run together as one program on a replica axis "
      "(loop.run_seeds); 1: one run at a time.")
  budget_flag = flags.DEFINE_float(
      "budget_min", 0.0, "Stop after this many minutes (the run in progress checkpoints; "
      "rerun to continue); 0: no limit.")
  estimate_flag = flags.DEFINE_bool(
      "estimate", True, "Before starting, print each run's FLOPs and estimated time from "
      "a short calibration of the first run, and what fits the budget.")
  keep_flag = flags.DEFINE_enum(
      "keep_checkpoints", "last", list(ckpt_lib.KEEP), "What a finished run keeps of its "
      "checkpoints: its final step ('last'), none or all (an N=100 step is about 1.7 GB).")
  cache_flag = flags.DEFINE_string(
      "compile_cache", "", "Persistent compilation cache: a directory, 'default' "
      "($FEDJAX_HET_CACHE or ~/.cache/fedjax_het/xla), 'off'; unset: <sweep_dir>/xla_cache "
      "(the seeds and settings of a cell compile once).")
  flags.mark_flags_as_required(["sweep", "sweep_dir"])

  def main(argv):
    del argv
    sweep, sweep_dir = sweep_flag.value, dir_flag.value
    if not dry_flag.value:
      compile_cache.enable(cache_flag.value or os.path.join(sweep_dir, "xla_cache"))
    try:
      if subset:
        sweep = select(sweep, algorithms=subset.get("algorithms"),
                       settings=subset.get("settings"), configs_dir=configs_dir,
                       log=lambda s: print(s, flush=True))
      if dry_flag.value:
        runs = plan(sweep, sweep_dir, configs_dir=configs_dir)
        for i, run in enumerate(runs):
          done = "finished" if finished_summary(run) else "to run"
          print(f"{eta_lib.run_prefix(i + 1, len(runs), run)} | {done} -> {run.workdir}")
        return
      rows = run_sweep(sweep, sweep_dir, log=lambda s: print(s, flush=True),
                       command=" ".join(shlex.quote(a) for a in ["python", *sys.argv]),
                       seed_batch=batch_flag.value, estimate_first=estimate_flag.value,
                       deadline=(time.time() + 60 * budget_flag.value
                                 if budget_flag.value > 0 else None),
                       configs_dir=configs_dir, keep_checkpoints=keep_flag.value)
    except (ValueError, FileNotFoundError, ckpt_lib.DiskFull) as err:
      cli_lib.fail(err)  # a full disk stops the sweep: every later run would hit it
    failed = [r for r in rows if r["status"] != "done"]
    left = len(plan(sweep, sweep_dir, configs_dir=configs_dir)) - len(rows)
    print(f"{len(rows) - len(failed)} runs done, {len(failed)} failed"
          + (f", {left} left (rerun to continue)" if left else "")
          + f"; table in {os.path.join(sweep_dir, 'results.md')}", flush=True)
    sys.exit(1 if failed else 0)

  cli_lib.run(main, argv=argv, flag="sweep")


if __name__ == "__main__":
  cli()
