r"""Runs a grid of experiments (algorithms x settings x seeds) and tabulates the results.

  python experiments/sweep.py --sweep=experiments/sweeps/smoke.py --sweep_dir=/tmp/sweep
  python experiments/sweep.py --sweep=experiments/sweeps/paper_table.py \
      --sweep_dir=runs/paper_table --sweep.seeds=0,1
  python experiments/sweep.py --sweep=experiments/sweeps/paper_table.py \
      --sweep_dir=runs/paper_table --dry_run      # list the runs, run nothing

A sweep file's ``get_config()`` returns a ConfigDict with

- ``algorithms``: experiment config files (``experiments/fedmrl.py``, optionally with a
  ``:variant``) or algorithm names (``fedmrl`` = ``experiments/fedmrl.py``); the file's
  stem names the table row;
- ``settings``: table columns, ``{name: {dotted key: value}}`` (nested dicts are
  flattened); build it with ``ConfigDict(..., allow_dotted_keys=True, sort_keys=False)``
  to keep dotted keys and the column order;
- ``seeds``: the seeds of every cell;
- optional ``base_overrides`` (applied to every run), ``algorithm_overrides``
  (``{row name: overrides}``) and ``variant`` (e.g. ``'smoke'``, for every config file).

Every run is ``loop.run`` in this process, in ``<sweep_dir>/<algorithm>/<setting
slug>/seed<k>/``. A run whose ``summary.json`` says it finished (with the same config) is
skipped; a half-finished one resumes from its checkpoint, so rerunning a killed sweep
continues it. After every run ``results.csv`` and ``results.md`` (rows methods, columns
settings, mean +- std over seeds of the final mean test accuracy, best per column in bold)
are rewritten; ``sweep.json`` records the command, the sweep config and the environment
for ``experiments/results_page.py``.
"""
from __future__ import annotations

import csv
import dataclasses
import importlib.util
import io
import json
import math
import os
import re
import shlex
import subprocess
import sys
import time
from typing import Callable, Iterable, Mapping, Sequence

import jax
import ml_collections
import numpy as np

from fedjax_het import config as config_lib
from fedjax_het.sweeps import budget
from fedjax_het.training import estimate, loop
from fedjax_het.training import metrics as metrics_lib

# experiments/ of the source tree: algorithm names in a sweep file name its config files
EXPERIMENTS_DIR = os.path.join(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
    "experiments")
ACCURACY_COLUMNS = ("final_mean_test_acc", "best_mean_test_acc", "final_sampled_test_acc",
                    "best_sampled_test_acc")
CSV_COLUMNS = ("algorithm", "setting", "seed", "status", *ACCURACY_COLUMNS,
               "rounds_completed", "uplink_params", "downlink_params", "compile_s",
               "wall_s", "workdir")
INT_COLUMNS = ("seed", "rounds_completed")
FLOAT_COLUMNS = (*ACCURACY_COLUMNS, "uplink_params", "downlink_params", "compile_s",
                 "wall_s")
# The tables of results.md: (title, metric). Protocol (a) is the papers' text (pFedMoE
# Appendix A): every client with the server's latest shared parameters; protocol (b) is
# the FedMRL authors' code: the round's sampled clients right after local training.
TABLES = (
    ("Final accuracy, protocol (a): all clients, server's shared parameters",
     "final_mean_test_acc"),
    ("Best round, protocol (a): all clients, server's shared parameters (as the papers "
     "report)", "best_mean_test_acc"),
    ("Final accuracy, protocol (b): the round's sampled clients right after local "
     "training", "final_sampled_test_acc"),
    ("Best round, protocol (b): the round's sampled clients right after local training "
     "(the FedMRL authors' code)", "best_sampled_test_acc"),
)
ROUND_RE = re.compile(r"^round (\d+)/(\d+)")
# Raised by a run that the sweep records as failed and moves past.
RUN_ERRORS = (FloatingPointError,)


@dataclasses.dataclass(frozen=True)
class Run:
  """One cell entry of the grid.

  Attributes:
    algorithm: the row name (config file stem).
    setting: the column name.
    seed: the seed.
    config: the full experiment config.
    workdir: ``<sweep_dir>/<algorithm>/<setting slug>/seed<seed>``.
  """
  algorithm: str
  setting: str
  seed: int
  config: ml_collections.ConfigDict
  workdir: str


# ----------------------------------------------------------------------------- planning


def load_module(path: str):
  """The Python file ``path`` imported as a module (a sweep file, or one it builds on)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"config file {path} does not exist")
  name = "_sweep_config_" + re.sub(r"\W", "_", os.path.abspath(path))
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config_file(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
  """``get_config(arg)`` of a Python config file, as ``config_flags`` loads it."""
  module = load_module(path)
  return module.get_config(arg) if arg else module.get_config()


def resolve_algorithm(entry: str, default_variant: str | None = None):
  """``(row name, config file, variant)`` of an ``algorithms`` entry.

  ``'fedmrl'`` -> ``('fedmrl', 'experiments/fedmrl.py', default_variant)``;
  ``'path/x.py:smoke'`` -> ``('x', 'path/x.py', 'smoke')``.
  """
  path, _, arg = entry.partition(":")
  if not path.endswith(".py"):
    path = os.path.join(EXPERIMENTS_DIR, f"{path}.py")
  return os.path.splitext(os.path.basename(path))[0], path, arg or default_variant


def flatten(overrides: Mapping, prefix: str = "") -> dict:
  """Nested overrides as dotted keys: ``{'a': {'b': 1}}`` -> ``{'a.b': 1}``."""
  flat = {}
  for key, value in overrides.items():
    if isinstance(value, (Mapping, ml_collections.ConfigDict)):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat


def named_overrides(spec) -> list[tuple[str, dict]]:
  """``[(name, dotted overrides)]`` from a mapping or a list of ``(name, overrides)``."""
  if spec is None:
    return []
  items = spec.items() if hasattr(spec, "items") else spec
  return [(str(name), flatten(values or {})) for name, values in items]


def slug(name: str) -> str:
  """A directory name for a setting: ``'N=10,C=100%'`` -> ``'n10_c100pct'``."""
  s = name.lower().replace("%", "pct").replace("=", "")
  s = re.sub(r"[^a-z0-9.+-]+", "_", s).strip("_.")
  return s or "default"


def _unique(names: Iterable[str], what: str) -> None:
  names = list(names)
  dup = sorted({n for n in names if names.count(n) > 1})
  if dup:
    raise ValueError(f"sweep: {what} {dup} appear more than once; rename them")


def plan(sweep: ml_collections.ConfigDict, sweep_dir: str) -> list[Run]:
  """Every run of a sweep (settings, then seeds, then algorithms), each config validated.

  The order fills every row of the table for seed 0 first, so a partial sweep already
  compares all methods. Every algorithm of a (setting, seed) cell gets the same clients:
  the largest ``data.public`` of the cell (Moss's public set) is held out of the pool
  for all of them, so Moss's row is a paired comparison with the others.
  """
  variant = sweep.get("variant") or None
  algorithms = [resolve_algorithm(e, variant) for e in sweep.algorithms]
  settings = named_overrides(sweep.settings)
  per_algorithm = dict(named_overrides(sweep.get("algorithm_overrides")))
  base = flatten(sweep.get("base_overrides") or {})
  if not algorithms or not settings or not sweep.seeds:
    raise ValueError("sweep: algorithms, settings and seeds must each be non-empty")
  _unique([a[0] for a in algorithms], "algorithm names")
  _unique([slug(s) for s, _ in settings], "setting slugs")
  unknown = sorted(set(per_algorithm) - {a[0] for a in algorithms})
  if unknown:
    raise ValueError(f"sweep.algorithm_overrides names {unknown}, which are not among the "
                     f"algorithms {[a[0] for a in algorithms]}")
  runs = []
  for setting, overrides in settings:
    for seed in sweep.seeds:
      cell = []
      for name, path, arg in algorithms:
        c = load_config_file(path, arg)
        config_lib.override(c, {**base, **per_algorithm.get(name, {}), **overrides,
                                "seed": int(seed)})
        cell.append((name, c))
      public = max(c.data.public for _, c in cell)
      for name, c in cell:
        c.data.public = public
        config_lib.validate(c)
        workdir = os.path.join(sweep_dir, name, slug(setting), f"seed{seed}")
        runs.append(Run(name, setting, int(seed), c, workdir))
  return runs


# ----------------------------------------------------------------------------- one run


def comparable(config: dict) -> dict:
  """Flat config values that define a run (the keys a resume may change dropped)."""
  flat = flatten(json.loads(json.dumps(config)))
  return {k: v for k, v in flat.items() if k not in loop.RESUMABLE_KEYS}


def finished_summary(run: Run) -> dict | None:
  """The run's ``summary.json`` if it completed ``num_rounds`` with the same config."""
  path = os.path.join(run.workdir, "summary.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    summary = json.load(f)
  resolved = comparable(config_lib.with_algo_defaults(run.config).to_dict())
  saved = comparable(summary.get("config", {}))
  defaults = config_lib.flat_defaults(run.config.algorithm)
  saved = {**{k: defaults[k] for k in resolved if k not in saved and k in defaults}, **saved}
  if summary.get("rounds_completed") != run.config.num_rounds or saved != resolved:
    return None  # loop.run resumes it, or refuses a different config with a clear error
  return summary


def last_wall_s(workdir: str) -> float | None:
  """The run's wall-clock seconds (last ``metrics.jsonl`` row)."""
  rows = metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl"))
  return rows[-1]["wall_s"] if rows else None


def result_row(run: Run, sweep_dir: str, summary: dict | None, status: str) -> dict:
  """The ``results.csv`` row of a run (None where a failed run has no value)."""
  s = summary or {}
  return {"algorithm": run.algorithm, "setting": run.setting, "seed": run.seed,
          "status": status,
          **{k: s.get(k) for k in ACCURACY_COLUMNS},
          "rounds_completed": s.get("rounds_completed"),
          "uplink_params": s.get("uplink_params"),
          "downlink_params": s.get("downlink_params"),
          "compile_s": s.get("timing", {}).get("compile_s"),
          "wall_s": last_wall_s(run.workdir),
          "workdir": os.path.relpath(run.workdir, sweep_dir)}


# ----------------------------------------------------------------------------- progress


def format_duration(seconds: float | None) -> str:
  """``'4m10s'``, ``'1h02m'``, ``'12s'``; ``'?'`` when unknown."""
  if seconds is None or not math.isfinite(seconds):
    return "?"
  s = int(round(max(seconds, 0.0)))
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  return f"{s // 3600}h{s % 3600 // 60:02d}m"


def sweep_eta(durations: Sequence[float], runs_after: int | Sequence[float | None],
              elapsed: float | None = 0.0, projected: float | None = None,
              current: float | None = None) -> float | None:
  """Seconds left in a sweep, from the runs finished so far and the current one's pace.

  Args:
    durations: wall seconds of the runs this sweep computed so far.
    runs_after: the runs still to compute after the current one: their number, or per
      run its expected seconds (the mean of its cell's finished runs: ``cell_means``)
      or None where its cell has none yet.
    elapsed: seconds spent on the current run; None between runs (none in progress).
    projected: the current run's total seconds projected from its own rounds
      (``projected_duration``), or None before it has two evaluated rounds.
    current: the current run's cell's mean so far, or None.

  Returns:
    The later runs' expected seconds (``per_run``, the mean of ``durations``, where a
    run has no cell mean; before any run finished, the current run's projection) plus
    ``left_now``: the current run's projection less ``elapsed`` (runs of one sweep can
    differ 2x in cost), else its cell's mean or ``per_run`` less ``elapsed``; None when
    neither is known.
  """
  per_run = float(np.mean(durations)) if durations else projected
  if per_run is None:
    return None
  after = [None] * runs_after if isinstance(runs_after, int) else list(runs_after)
  later = sum(per_run if v is None else v for v in after)
  if elapsed is None:
    return later
  own = next(v for v in (projected, current, per_run) if v is not None)
  return later + max(own - elapsed, 0.0)


def cell_means(durations: Mapping[tuple, Sequence[float]], later: Sequence[Run],
               flops: Mapping[tuple, float] | None = None) -> list[float | None]:
  """Each later run's expected seconds: its cell's mean so far; else, where ``flops``
  (``{(algorithm, setting): a run's FLOPs}``, ``costs.json``) knows its cell and some
  finished cell, its FLOPs at the seconds per FLOP the finished runs took (a cell 5x
  the FLOPs of those run so far counts 5x their time); else None."""
  flops = flops or {}
  done = [(d, flops[c]) for c, ds in durations.items() if c in flops for d in ds]
  rate = sum(d for d, _ in done) / sum(f for _, f in done) if done else None
  out = []
  for r in later:
    cell = (r.algorithm, r.setting)
    if durations.get(cell):
      out.append(float(np.mean(durations[cell])))
    elif rate is not None and cell in flops:
      out.append(rate * flops[cell])
    else:
      out.append(None)
  return out


def projected_duration(first: tuple[float, float], now: tuple[float, float]
                       ) -> float | None:
  """A run's total seconds, extrapolated from its pace after its first round line.

  Args:
    first: ``(elapsed seconds, fraction of rounds done)`` at the run's first
      ``round r/R`` line: compilation and the first dispatch are behind it.
    now: the same at the latest line.

  Returns:
    ``first's seconds + (1 - first's fraction) * seconds per fraction since first``, so
    the compile time is not spread over the rounds to come; None until a later round
    line than the first.
  """
  (t0, f0), (t1, f1) = first, now
  if f1 <= f0:
    return None
  return t0 + (t1 - t0) / (f1 - f0) * (1.0 - f0)


def run_prefix(position: int, total: int, run: Run) -> str:
  """``'[3/12] fedmrl | N=10,C=100% | seed 0'``."""
  return f"[{position}/{total}] {run.algorithm} | {run.setting} | seed {run.seed}"


def prefixed_log(log: Callable[[str], None], prefix: str, elapsed: Callable[[], float],
                 eta: Callable[[float, float | None], float | None]
                 ) -> Callable[[str], None]:
  """A ``log`` for ``loop.run`` adding the run's position and the sweep ETA to each line.

  Args:
    log: where lines go.
    prefix: ``run_prefix(...)``.
    elapsed: seconds spent on the current run so far.
    eta: ``(elapsed, projected run seconds or None) -> seconds left in the sweep``; the
      projection (``projected_duration``) reads loop's ``round r/R`` lines.
  """
  first: list = []
  last: list = [None]
  projected: list = [None]

  def emit(line: str) -> None:
    m = ROUND_RE.match(line)
    now = elapsed()
    if m:
      point = (now, int(m.group(1)) / int(m.group(2)))
      if not first or point[1] <= last[0][1]:  # a new run (a batch's seeds one by one)
        first[:] = [point]
      last[0] = point
      projected[0] = projected_duration(first[0], point)
    log(f"{prefix} | {line} | sweep ETA {format_duration(eta(now, projected[0]))}")

  return emit


# ----------------------------------------------------------------------------- tables


def mean_std(values: Sequence[float]) -> tuple[float, float]:
  """Mean and sample standard deviation (ddof=1; 0 for a single value)."""
  v = np.asarray(values, dtype=np.float64)
  return float(v.mean()), float(v.std(ddof=1)) if len(v) > 1 else 0.0


def csv_text(rows: Sequence[dict]) -> str:
  """``results.csv`` text: a header of ``CSV_COLUMNS``, one line per row."""
  out = io.StringIO()
  writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
  writer.writeheader()
  for row in rows:
    writer.writerow({k: "" if row.get(k) is None else row[k] for k in CSV_COLUMNS})
  return out.getvalue()


def parse_csv(text: str) -> list[dict]:
  """Rows of ``results.csv`` text with numbers parsed back (empty cells -> None)."""
  rows = []
  for raw in csv.DictReader(io.StringIO(text)):
    row = dict(raw)
    for k in INT_COLUMNS + FLOAT_COLUMNS:
      cast = int if k in INT_COLUMNS else float
      row[k] = cast(row[k]) if row.get(k) not in (None, "") else None
    rows.append(row)
  return rows


def _in_order(values: Iterable[str]) -> list[str]:
  return list(dict.fromkeys(values))


def cell_stats(rows: Sequence[dict], metric: str) -> dict:
  """``{(algorithm, setting): (mean, std, n)}`` over the finished rows' ``metric``."""
  groups: dict = {}
  for r in rows:
    if r.get("status") == "done" and r.get(metric) is not None:
      groups.setdefault((r["algorithm"], r["setting"]), []).append(r[metric])
  return {k: (*mean_std(v), len(v)) for k, v in groups.items()}


def markdown_table(rows: Sequence[dict], *, metric: str = "final_mean_test_acc",
                   methods: Sequence[str] | None = None,
                   settings: Sequence[str] | None = None,
                   num_seeds: int | None = None) -> str:
  """A papers'-layout table: rows methods, columns settings, ``mean ± std`` in %.

  Args:
    rows: ``results.csv`` rows (only ``status == 'done'`` ones count).
    metric: the accuracy column to tabulate (a fraction; shown in %).
    methods, settings: row and column order (default: first appearance in ``rows``).
    num_seeds: seeds per cell in the sweep; a cell with fewer finished runs shows
      ``(n=k)``.

  Returns:
    Markdown text; the best mean of each column (at the shown precision) is bold, a
    cell without runs shows ``–``. A single run shows its value without a spread.
  """
  methods = list(methods or _in_order(r["algorithm"] for r in rows))
  settings = list(settings or _in_order(r["setting"] for r in rows))
  stats = cell_stats(rows, metric)
  shown = {k: round(100 * m, 2) for k, (m, _, _) in stats.items()}
  best = {s: max((shown[(a, s)] for a in methods if (a, s) in shown), default=None)
          for s in settings}
  lines = ["| Method | " + " | ".join(esc(s) for s in settings) + " |",
           "|---|" + "---:|" * len(settings)]
  for a in methods:
    cells = []
    for s in settings:
      if (a, s) not in stats:
        cells.append("–")
        continue
      _, std, n = stats[(a, s)]
      text = f"{shown[(a, s)]:.2f}" + (f" ± {100 * std:.2f}" if n > 1 else "")
      text = f"**{text}**" if shown[(a, s)] == best[s] else text
      cells.append(text + (f" (n={n})" if num_seeds and n < num_seeds else ""))
    lines.append(f"| {esc(a)} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def time_table(rows: Sequence[dict], *, methods=None, settings=None) -> str:
  """Rows methods, columns settings: ``wall s (compile s)`` of the finished runs."""
  methods = list(methods or _in_order(r["algorithm"] for r in rows))
  settings = list(settings or _in_order(r["setting"] for r in rows))
  lines = ["| Method | " + " | ".join(esc(s) for s in settings) + " |",
           "|---|" + "---:|" * len(settings)]
  for a in methods:
    cells = []
    for s in settings:
      done = [r for r in rows if r["algorithm"] == a and r["setting"] == s
              and r.get("status") == "done" and r.get("wall_s") is not None]
      if not done:
        cells.append("–")
        continue
      wall = np.mean([r["wall_s"] for r in done])
      comp = [r["compile_s"] for r in done if r.get("compile_s") is not None]
      cells.append(f"{wall:.0f}" + (f" ({np.mean(comp):.0f})" if comp else ""))
    lines.append(f"| {esc(a)} | " + " | ".join(cells) + " |")
  return "\n".join(lines) + "\n"


def esc(text) -> str:
  """Escapes ``|`` in a Markdown table cell."""
  return str(text).replace("|", "\\|")


def results_markdown(rows: Sequence[dict], *, methods=None, settings=None,
                     seeds: Sequence[int] | None = None, heading: str = "##") -> str:
  """The final- and best-accuracy tables with their captions (``results.md``)."""
  seeds = list(seeds or sorted({r["seed"] for r in rows}))
  n = len(seeds)
  failed = [r for r in rows if r.get("status") != "done"]
  caption = (f"Mean test accuracy over clients (%), mean ± sample std over {n} seed"
             f"{'s' if n != 1 else ''} ({', '.join(map(str, seeds))}); best per column "
             "in bold; `(n=k)`: only k runs finished.")
  parts = []
  for title, metric in TABLES:
    if not any(r.get(metric) is not None for r in rows) and "sampled" in metric:
      continue  # runs without the sampled-client evaluation
    parts += [f"{heading} {title}", "", caption, "",
              markdown_table(rows, metric=metric, methods=methods, settings=settings,
                             num_seeds=n)]
  if any(r.get("wall_s") is not None for r in rows):
    parts += [f"{heading} Time per run", "",
              "Wall-clock seconds of a run, mean over its seeds, with the compilation "
              "(first dispatch minus a compiled round) in parentheses; runs that shared "
              "the machine with other jobs are slower than the machine allows.", "",
              time_table(rows, methods=methods, settings=settings)]
  if failed:
    parts += ["Failed runs: " + ", ".join(f"`{r['workdir']}` ({r['status']})"
                                          for r in failed), ""]
  return "\n".join(parts)


# ----------------------------------------------------------------------------- the sweep


def environment() -> dict:
  """JAX version, devices and git commit, recorded with the results."""
  def git(*args):
    return subprocess.run(["git", *args], capture_output=True, text=True,
                          cwd=EXPERIMENTS_DIR, timeout=10).stdout.strip()

  try:
    commit = git("rev-parse", "--short", "HEAD")
    commit += "+uncommitted changes" if commit and git("status", "--porcelain") else ""
  except (OSError, subprocess.SubprocessError):
    commit = ""
  devices = jax.devices()
  return {"jax": jax.__version__, "backend": jax.default_backend(),
          "devices": f"{len(devices)} x {devices[0].device_kind}", "git_commit": commit}


def write_text(path: str, text: str) -> None:
  """Writes a file atomically (temporary file + rename): a kill leaves the old one."""
  with open(f"{path}.tmp", "w") as f:
    f.write(text)
  os.replace(f"{path}.tmp", path)


def write_results(sweep_dir: str, rows: Sequence[dict], runs: Sequence[Run],
                  seeds: Sequence[int]) -> None:
  """Rewrites ``results.csv`` and ``results.md`` from the rows so far."""
  methods = _in_order(r.algorithm for r in runs)
  settings = _in_order(r.setting for r in runs)
  write_text(os.path.join(sweep_dir, "results.csv"), csv_text(rows))
  text = results_markdown(rows, methods=methods, settings=settings, seeds=seeds)
  write_text(os.path.join(sweep_dir, "results.md"),
             f"# Sweep results ({len(rows)}/{len(runs)} runs)\n\n{text}")


def write_manifest(sweep_dir: str, sweep: ml_collections.ConfigDict, runs: Sequence[Run],
                   command: str | None) -> None:
  """``sweep.json``: the command, the sweep config, the runs and the environment.

  Without a ``command`` (a call from Python) the one recorded earlier is kept.
  """
  path = os.path.join(sweep_dir, "sweep.json")
  if command is None and os.path.exists(path):
    with open(path) as f:
      command = json.load(f).get("command")
  metrics_lib.write_json(path, {
      "command": command, "sweep": sweep.to_dict(), "environment": environment(),
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
  """``'[4-6/30] fedmrl | N=10,C=100% | seeds 0,1,2'`` (one run: ``run_prefix``).

  Positions that are not consecutive (a cell's seeds 1 and 2 after every method's seed
  0) are listed: ``'[14,24/30] ...'``.
  """
  first = runs[positions[0]]
  if len(positions) == 1:
    return run_prefix(positions[0] + 1, total, first)
  seeds = ",".join(str(runs[i].seed) for i in positions)
  consecutive = list(positions) == list(range(positions[0], positions[-1] + 1))
  where = (f"{positions[0] + 1}-{positions[-1] + 1}" if consecutive
           else ",".join(str(i + 1) for i in positions))
  return f"[{where}/{total}] {first.algorithm} | {first.setting} | seeds {seeds}"


def run_batch(batch: Sequence[Run], log: Callable[[str], None],
              deadline: float | None = None) -> list:
  """Summaries (or an error per run) of a batch: ``loop.run_seeds``, else one by one.

  A batch whose seeds cannot share a program (checkpoints at different rounds), or
  that fails (one seed's non-finite loss stops the program), is run again seed by seed,
  each resuming from its own checkpoint, so the healthy seeds finish. A run that passes
  the ``deadline`` raises ``loop.DeadlineReached`` (checkpointed).
  """
  if len(batch) > 1:
    try:
      return loop.run_seeds([r.config for r in batch], [r.workdir for r in batch],
                            log=log, deadline=deadline)
    except (loop.SeedsNotAligned, *RUN_ERRORS) as err:
      log(f"seeds run one by one ({type(err).__name__}: {err})")
  out = []
  for r in batch:
    try:
      out.append(loop.run(r.config, r.workdir, log=log, deadline=deadline))
    except RUN_ERRORS as err:
      out.append(err)
  return out


def print_plan(runs: Sequence[Run], jobs: Sequence[Sequence[int]], sweep_dir: str,
               budget_s: float | None, log: Callable[[str], None]) -> None:
  """The FLOPs and estimated time of every batch still to run, before the sweep starts.

  The calibration times the first batch's first run (``estimate.calibrate``); see
  ``fedjax_het.sweeps.budget``.
  """
  costs = budget.cell_costs(runs, [i for b in jobs for i in b], sweep_dir, log)
  exp = loop.prepare(runs[jobs[0][0]].config)
  calibration = estimate.calibrate(exp)
  lines = budget.plan_budget(runs, jobs, costs, calibration, budget_s)
  for line in budget.format_plan(runs, lines, calibration, budget_s):
    log(line)


def run_sweep(sweep: ml_collections.ConfigDict, sweep_dir: str, *,
              log: Callable[[str], None] = print, command: str | None = None,
              seed_batch: int = 1, order: Callable[[Run], object] | None = None,
              deadline: float | None = None, estimate_first: bool = False) -> list[dict]:
  """Runs every unfinished run of the sweep and writes the results.

  Args:
    sweep: the sweep config (see the module docstring).
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

  Returns:
    The ``results.csv`` rows of the finished and failed runs, in run order.
  """
  if not isinstance(seed_batch, int) or seed_batch < 1:
    raise ValueError(f"seed_batch={seed_batch!r} must be an integer >= 1")
  runs = plan(sweep, sweep_dir)  # every config is validated before anything runs
  os.makedirs(sweep_dir, exist_ok=True)
  write_manifest(sweep_dir, sweep, runs, command)
  done = [finished_summary(r) for r in runs]
  todo = sum(s is None for s in done)
  log(f"sweep: {len(runs)} runs, {len(runs) - todo} finished earlier, {todo} to run "
      f"-> {sweep_dir}" + (f" (seeds {seed_batch} at a time)" if seed_batch > 1 else ""))
  rows, by_cell = {}, {}  # by_cell: (algorithm, setting) -> seconds of its finished runs
  durations = lambda: [d for ds in by_cell.values() for d in ds]  # noqa: E731
  for i, (run, summary) in enumerate(zip(runs, done)):
    if summary is not None:
      log(f"{run_prefix(i + 1, len(runs), run)} | finished earlier (final mean test acc "
          f"{100 * summary['final_mean_test_acc']:.2f}%), skipped")
      rows[i] = result_row(run, sweep_dir, summary, "done")
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
    elapsed = lambda t0=t0, k=len(batch): (time.perf_counter() - t0) / k  # noqa: E731
    later = [runs[i] for b in jobs[j + 1:] for i in b]
    cell = (batch[0].algorithm, batch[0].setting)
    eta = lambda now, projected, later=later, first=batch[0]: sweep_eta(  # noqa: E731
        durations(), cell_means(by_cell, later, flops), now, projected,
        cell_means(by_cell, [first], flops)[0])
    where = batch[0].workdir if len(batch) == 1 else os.path.join(
        os.path.dirname(batch[0].workdir), "seed{" + ",".join(str(r.seed) for r in batch) + "}")
    log(f"{prefix} | start -> {where} | sweep ETA {format_duration(eta(0.0, None))}")
    try:
      outcomes = run_batch(batch, prefixed_log(log, prefix, elapsed, eta), deadline)
    except loop.DeadlineReached as err:
      log(f"{prefix} | {err}; the sweep stops here, rerun to continue")
      break
    took = time.perf_counter() - t0
    # per run: a batch shares its time
    by_cell.setdefault(cell, []).extend([took / len(batch)] * len(batch))
    for i, run, out in zip(positions, batch, outcomes):
      if isinstance(out, Exception):
        log(f"{run_prefix(i + 1, len(runs), run)} | FAILED: {out}")
        rows[i] = result_row(run, sweep_dir, None, f"failed: {type(out).__name__}")
      else:
        rows[i] = result_row(run, sweep_dir, out, "done")
        log(f"{run_prefix(i + 1, len(runs), run)} | done in {format_duration(took)}: final "
            f"mean test acc {100 * out['final_mean_test_acc']:.2f}% | sweep ETA "
            f"{format_duration(sweep_eta(durations(), cell_means(by_cell, later, flops), None))}")
    write_results(sweep_dir, [rows[i] for i in sorted(rows)], runs, sweep.seeds)
  rows = [rows[i] for i in sorted(rows)]
  write_results(sweep_dir, rows, runs, sweep.seeds)
  return rows


def cli() -> None:
  """The command line: ``--sweep`` (config file), ``--sweep_dir``, ``--dry_run``."""
  from absl import flags  # noqa: PLC0415 - importing sweep defines no flags
  from ml_collections import config_flags  # noqa: PLC0415

  from fedjax_het import cli as cli_lib  # noqa: PLC0415
  from fedjax_het.training import compile_cache  # noqa: PLC0415

  sweep_flag = config_flags.DEFINE_config_file(
      "sweep", None, "Sweep config file (experiments/sweeps/smoke.py)", lock_config=True)
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
      if dry_flag.value:
        runs = plan(sweep, sweep_dir)
        for i, run in enumerate(runs):
          done = "finished" if finished_summary(run) else "to run"
          print(f"{run_prefix(i + 1, len(runs), run)} | {done} -> {run.workdir}")
        return
      rows = run_sweep(sweep, sweep_dir, log=lambda s: print(s, flush=True),
                       command=" ".join(shlex.quote(a) for a in ["python", *sys.argv]),
                       seed_batch=batch_flag.value, estimate_first=estimate_flag.value,
                       deadline=(time.time() + 60 * budget_flag.value
                                 if budget_flag.value > 0 else None))
    except (ValueError, FileNotFoundError) as err:
      cli_lib.fail(err)
    failed = [r for r in rows if r["status"] != "done"]
    left = len(plan(sweep, sweep_dir)) - len(rows)
    print(f"{len(rows) - len(failed)} runs done, {len(failed)} failed"
          + (f", {left} left (rerun to continue)" if left else "")
          + f"; table in {os.path.join(sweep_dir, 'results.md')}", flush=True)
    sys.exit(1 if failed else 0)

  cli_lib.run(main, flag="sweep")


if __name__ == "__main__":
  cli()
