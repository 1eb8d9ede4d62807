"""Run outputs: ``metrics.jsonl`` (one row per evaluated round), progress lines, JSON."""
from __future__ import annotations

import json
import math
import os
import time
from typing import Any, Callable


def write_json(path: str, obj: Any) -> None:
  """Writes JSON atomically (temporary file + rename), so a kill never leaves half a file."""
  tmp = f"{path}.tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=1, sort_keys=True)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def read_jsonl(path: str) -> list[dict]:
  """Rows of a JSON-lines file (a torn last line from a kill is dropped)."""
  if not os.path.exists(path):
    return []
  rows = []
  with open(path) as f:
    for line in f:
      try:
        rows.append(json.loads(line))
      except json.JSONDecodeError:
        break
  return rows


class MetricsLog:
  """Appends rows to ``metrics.jsonl``; on resume keeps only rows up to the restored round.

  Args:
    path: the file.
    resume_round: rounds already completed by the restored state (0 for a fresh run);
      rows beyond it came from the interrupted run's lost rounds and are dropped, so the
      file never holds a round twice.
    write: False keeps the rows in memory only (the non-primary processes of a
      multi-process run, which read the file once process 0 has rewritten it).
  """

  def __init__(self, path: str, resume_round: int, *, write: bool = True):
    self.path, self.write = path, write
    self.rows = [r for r in read_jsonl(path) if r["round"] <= resume_round]
    if write:
      with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in self.rows)

  def append(self, row: dict) -> None:
    self.rows.append(row)
    if not self.write:
      return
    with open(self.path, "a") as f:
      f.write(json.dumps(row) + "\n")
      f.flush()
      os.fsync(f.fileno())


class Progress:
  """Prints ``round r/R | acc | loss | rounds/s | eta`` lines."""

  def __init__(self, total_rounds: int, start_round: int, log: Callable[[str], None]):
    self.total, self.start, self.log = total_rounds, start_round, log
    self.t0 = time.perf_counter()

  def update(self, round_: int, acc: float, loss: float) -> None:
    elapsed = time.perf_counter() - self.t0
    rate = (round_ - self.start) / elapsed if elapsed > 0 else math.inf
    eta = (self.total - round_) / rate if rate > 0 else math.inf
    self.log(f"round {round_}/{self.total} | mean test acc {acc:.4f} | train loss "
             f"{loss:.4f} | {rate:.2f} rounds/s | eta {eta:.0f}s")
