"""The sweep's ETA and the progress lines that carry it.

Seconds left come from the finished runs, the cells' costs and the current run's own
pace, which the training loop reports through ``on_progress(rounds completed,
num_rounds)`` after every dispatch (``loop.run``/``loop.run_seeds``).
"""
from __future__ import annotations

from typing import Callable, Mapping, Sequence

import numpy as np

from fedjax_het.sweeps.plan import Run
from fedjax_het.training.metrics import format_s


def sweep_eta(durations: Sequence[float], runs_after: int | Sequence[float | None],
              elapsed: float | None = 0.0, projected: float | None = None,
              current: float | None = None, runs_now: int = 1) -> float | None:
  """Seconds left in a sweep, from the runs finished so far and the current one's pace.

  Args:
    durations: seconds of the runs this sweep computed so far, per run (a batch's
      seeds share its wall time: each counts the batch's time over its size).
    runs_after: the runs still to compute after the current batch: their number, or
      per run its expected seconds (the mean of its cell's finished runs:
      ``cell_means``) or None where its cell has none yet.
    elapsed: wall seconds spent on the current batch; None between batches (none in
      progress).
    projected: the current batch's total wall seconds projected from its own rounds
      (``projected_duration``), or None before it has two evaluated rounds.
    current: the current batch's cell's mean seconds per run so far, or None.
    runs_now: the runs of the current batch (seeds run together on a replica axis).

  Returns:
    The later runs' expected seconds (``per_run``, the mean of ``durations``, where a
    run has no cell mean; before any run finished, the current batch's projection per
    run) plus ``left_now``: the current batch's projection less ``elapsed`` (runs of
    one sweep can differ 2x in cost), else ``runs_now`` times its cell's mean or
    ``per_run``, less ``elapsed``; None when neither is known.
  """
  per_run = (float(np.mean(durations)) if durations else
             None if projected is None else projected / runs_now)
  if per_run is None:
    return None
  after = [None] * runs_after if isinstance(runs_after, int) else list(runs_after)
  later = sum(per_run if v is None else v for v in after)
  if elapsed is None:
    return later
  own = projected if projected is not None else runs_now * (
      current if current is not None else per_run)
  return later + max(own - elapsed, 0.0)


def cell_means(durations: Mapping[tuple, Sequence[float]], later: Sequence[Run],
               flops: Mapping[tuple, float] | None = None) -> list[float | None]:
  """Each later run's expected seconds: its cell's mean so far; else, where ``flops``
  (``{(algorithm, setting): a run's FLOPs}``, ``costs.json``) knows its cell and some
  finished cell, its FLOPs at the seconds per FLOP the finished runs took (a cell 5x
  the FLOPs of those run so far counts 5x their time); else None."""
  flops = flops or {}
  done = [(d, flops[c]) for c, ds in durations.items() if c in flops for d in ds]
  # no rate from cells of unknown (0) FLOPs (budget._saved drops them from costs.json;
  # a caller's own mapping may still hold them)
  done_flops = sum(f for _, f in done)
  rate = sum(d for d, _ in done) / done_flops if done_flops > 0 else None
  out = []
  for r in later:
    cell = (r.algorithm, r.setting)
    if durations.get(cell):
      out.append(float(np.mean(durations[cell])))
    elif rate is not None and flops.get(cell, 0) > 0:
      out.append(rate * flops[cell])
    else:
      out.append(None)
  return out


def seconds_left(by_cell: Mapping[tuple, Sequence[float]], later: Sequence[Run],
                 flops: Mapping[tuple, float] | None = None, elapsed: float | None = None,
                 projected: float | None = None, current: Run | None = None,
                 runs_now: int = 1) -> float | None:
  """``sweep_eta`` from the sweep's bookkeeping.

  Args:
    by_cell: ``{(algorithm, setting): seconds per run of its finished runs}``.
    later: the runs after the current batch.
    flops: ``{(algorithm, setting): a run's FLOPs}`` (``cell_means``).
    elapsed, projected, runs_now: as ``sweep_eta``; ``elapsed`` None between batches.
    current: a run of the batch in progress (its cell's mean counts for each of the
      batch's ``runs_now`` runs), or None.
  """
  durations = [d for ds in by_cell.values() for d in ds]
  own = cell_means(by_cell, [current], flops)[0] if current is not None else None
  return sweep_eta(durations, cell_means(by_cell, later, flops), elapsed, projected, own,
                   runs_now)


def projected_duration(first: tuple[float, float], now: tuple[float, float]
                       ) -> float | None:
  """A run's total seconds, extrapolated from its pace after its first dispatch.

  Args:
    first: ``(elapsed seconds, fraction of rounds done)`` at the run's first progress
      report (``on_progress``): compilation and the first dispatch are behind it.
    now: the same at the latest report.

  Returns:
    ``first's seconds + (1 - first's fraction) * seconds per fraction since first``, so
    the compile time is not spread over the rounds to come; None until a later report
    than the first.
  """
  (t0, f0), (t1, f1) = first, now
  if f1 <= f0:
    return None
  return t0 + (t1 - t0) / (f1 - f0) * (1.0 - f0)


class Projection:
  """A run's total seconds, projected from the rounds the training loop reports done.

  Pass it as ``on_progress`` to ``loop.run``/``loop.run_seeds``: each call
  ``(rounds completed, num_rounds)`` is a point ``(elapsed(), fraction done)``; the
  first point of a run (after compilation and its first dispatch) anchors
  ``projected_duration``. A point at or before the latest one starts a new run (a
  batch's seeds run again one by one, each resuming from its checkpoint).

  Attributes:
    seconds: the projected total seconds, or None before a second point.
  """

  def __init__(self, elapsed: Callable[[], float]):
    self.elapsed = elapsed
    self.first: tuple[float, float] | None = None
    self.last: tuple[float, float] | None = None
    self.seconds: float | None = None

  def __call__(self, rounds_completed: int, num_rounds: int) -> None:
    point = (self.elapsed(), rounds_completed / num_rounds)
    if self.first is None or point[1] <= self.last[1]:
      self.first = point
    self.last = point
    self.seconds = projected_duration(self.first, point)


def run_prefix(position: int, total: int, run: Run) -> str:
  """``'[3/12] fedmrl | N=10,C=100% | seed 0'``."""
  return f"[{position}/{total}] {run.algorithm} | {run.setting} | seed {run.seed}"


def prefixed_log(log: Callable[[str], None], prefix: str, elapsed: Callable[[], float],
                 eta: Callable[[float, float | None], float | None]
                 ) -> tuple[Callable[[str], None], Projection]:
  """A ``log`` and an ``on_progress`` for ``loop.run``: the log adds the run's position
  and the sweep ETA to each line, the ETA projected from the progress reported so far.

  Args:
    log: where lines go.
    prefix: ``run_prefix(...)``.
    elapsed: wall seconds spent on the current batch so far.
    eta: ``(elapsed, projected batch seconds or None) -> seconds left in the sweep``.

  Returns:
    ``(log, on_progress)``: pass both to ``loop.run`` (``on_progress`` is the run's
    ``Projection``).
  """
  projection = Projection(elapsed)

  def emit(line: str) -> None:
    log(f"{prefix} | {line} | sweep ETA {format_s(eta(elapsed(), projection.seconds))}")

  return emit, projection
