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
  """Prints a ``round r/R | ... | rounds/s | eta`` line after every dispatch of rounds.

  The first dispatch compiles, so its line gives its time and no ETA (extrapolating
  the compilation over the run would overstate it many times); the rate and the ETA of
  the later lines count only the rounds after it. An accuracy carried over from an
  earlier evaluation (``eval_every`` > 1) names its round: ``mean test acc 0.8123
  (round 10)``.

  Args:
    total_rounds: R.
    start_round: rounds completed before this process started (a resumed run).
    log: where lines go.
    clock: seconds (``time.perf_counter``; tests pass a fake one).
    cpu_hint: on a CPU run estimated to last over ``CPU_HINT_S``, name the ':cpu'
      variant of the experiment configs (off in a sweep: its sweep file fixes the
      configs).
  """

  def __init__(self, total_rounds: int, start_round: int, log: Callable[[str], None],
               clock: Callable[[], float] = time.perf_counter, *, cpu_hint: bool = True):
    self.total, self.start, self.log, self.clock = total_rounds, start_round, log, clock
    self.cpu_hint = cpu_hint
    self.t0 = clock()
    self.timed_from = None  # (round, clock) at the end of the first dispatch
    self.acc, self.acc_round = None, None

  def update(self, round_: int, acc, loss, sampled_acc=None, *,
             acc_round: int | None = None) -> None:
    """One line after a dispatch that ended at ``round_``.

    ``acc``, ``loss`` and ``sampled_acc`` are floats, or one per seed for seeds run on a
    replica axis (shown ``a/b/c``); ``acc`` None when no round was evaluated yet (the
    latest is shown). ``acc_round``: the round ``acc`` was evaluated at (default
    ``round_``); shown when it is an earlier one.
    """
    now = self.clock()
    if acc is not None and not _all_none(acc):
      self.acc, self.acc_round = acc, round_ if acc_round is None else acc_round
    parts = [f"round {round_}/{self.total}"]
    if self.acc is not None:
      carried = f" (round {self.acc_round})" if self.acc_round != round_ else ""
      parts.append(f"mean test acc {_values(self.acc)}{carried}")
    if sampled_acc is not None and not _all_none(sampled_acc):
      parts.append(f"sampled clients acc {_values(sampled_acc)}")
    parts.append(f"train loss {_values(loss)}")
    parts += self.speed(round_, now)
    self.log(" | ".join(parts))

  def speed(self, round_: int, now: float) -> list[str]:
    """The line's speed and ETA: the first dispatch's time, then the timed rate."""
    if self.timed_from is None:
      self.timed_from = (round_, now)
      n = round_ - self.start
      took = (f"{n} round{'s' if n != 1 else ''} in {format_s(now - self.t0)} with "
              "compilation")
      return [took, "eta 0s" if round_ >= self.total else "eta after the next round"]
    first_round, first_t = self.timed_from
    elapsed = now - first_t
    rate = (round_ - first_round) / elapsed if elapsed > 0 else math.inf
    eta = (self.total - round_) / rate if rate > 0 else math.inf
    return [f"{rate:.2f} rounds/s", f"eta {format_s(eta)}"]

  def estimate(self, first_s: float, round_s: float, backend: str) -> str:
    """The line after the second dispatch: compile time and the run's estimated time."""
    left = (self.total - self.start - 2) * round_s
    line = (f"compiled in {format_s(max(first_s - round_s, 0.0))}; {round_s:.2f} s per "
            f"round, about {format_s(left)} to go")
    if self.cpu_hint and backend == "cpu" and left > CPU_HINT_S:
      line += ("; on a CPU, the ':cpu' variant of an experiment config "
               "(--config=experiments/<algorithm>.py:cpu) finishes in minutes")
    return line


CPU_HINT_S = 15 * 60


def _all_none(value) -> bool:
  return all(v is None for v in value) if isinstance(value, (list, tuple)) else value is None


def _values(value) -> str:
  """``0.8123``, or ``0.8123/0.7990`` for one value per seed."""
  if isinstance(value, (list, tuple)):
    return "/".join("?" if v is None else f"{v:.4f}" for v in value)
  return f"{value:.4f}"


def format_s(seconds: float | None) -> str:
  """``42s``, ``3m05s``, ``2h07m`` (or ``?`` when unknown: None or not finite)."""
  if seconds is None or not math.isfinite(seconds):
    return "?"
  seconds = int(round(max(seconds, 0.0)))
  if seconds < 60:
    return f"{seconds}s"
  if seconds < 3600:
    return f"{seconds // 60}m{seconds % 60:02d}s"
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
