"""The sweep's tables: ``results.csv`` rows and the Markdown tables of ``results.md``.

Rows are methods, columns settings, cells mean +- sample std over seeds of an accuracy
(best per column in bold), and a table of the time per run.
"""
from __future__ import annotations

import csv
import io
import os
from typing import Iterable, Sequence

import numpy as np

from fedjax_het.sweeps.plan import Run
from fedjax_het.training import metrics as metrics_lib

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


# ----------------------------------------------------------------------------- rows


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


# ----------------------------------------------------------------------------- files


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
