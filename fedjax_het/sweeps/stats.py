"""The statistics of the sweeps' reports: a mean and its standard error, where a paired
difference is going (its slope and level over the last third of a run), the first
evaluation that reaches a target, Spearman's rank correlation and eta squared.

Functions of arrays; nothing here reads a run. ``paired``, ``figures`` and the claims
ledger (``claim_runs``, ``verdicts``, ``claims_page``) use them.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np


def mean_se(diffs: np.ndarray) -> tuple[float, float]:
  """Mean and its standard error (sample std / sqrt(n); nan for a single value)."""
  d = np.asarray(diffs, dtype=np.float64)
  se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("nan")
  return float(d.mean()), se


def mean_se_text(mean: float, se: float) -> str:
  """``'+1.23 ± 0.45'`` (no ``±`` part when ``se`` is nan: a single seed).

  A standard error that is not zero but rounds to 0.00 keeps one significant digit
  (``'+27.71 ± 0.005'``: two seeds whose differences agree to 0.01 point), so that only
  seeds that agree exactly print ``± 0.00``.
  """
  if math.isnan(se):
    return f"{mean:+.2f}"
  return f"{mean:+.2f} ± " + (f"{se:.1g}" if 0 < se < 0.005 else f"{se:.2f}")


def first_reach(acc: Sequence[float], target: float) -> int | None:
  """Index of the first value ``>= target`` (None when never reached)."""
  hits = np.flatnonzero(np.asarray(acc) >= target)
  return int(hits[0]) if len(hits) else None


@dataclasses.dataclass(frozen=True)
class Trend:
  """Where a paired difference is going at the end of a run.

  Attributes:
    slope: the mean over seeds of each seed's least-squares slope of the difference
      against the round, over the window, in points per 10 rounds.
    se: its standard error over seeds (nan for one seed).
    first, last: the window's first and last evaluated round.
    level: the mean over seeds of each seed's mean difference over the window, in
      points: the difference read over the window rather than at its last round, which
      one noisy evaluation can move.
    level_se: its standard error over seeds (nan for one seed).
  """
  slope: float
  se: float
  first: int
  last: int
  level: float
  level_se: float

  @property
  def direction(self) -> str:
    """``'rising'`` / ``'falling'`` (slope beyond two standard errors) or ``'flat'``
    (within them, or a single seed)."""
    if math.isnan(self.se) or abs(self.slope) <= 2 * self.se:
      return "flat"
    return "rising" if self.slope > 0 else "falling"

  def __str__(self) -> str:
    return (f"{mean_se_text(self.slope, self.se)} per 10 rounds over rounds "
            f"{self.first}-{self.last}: {self.direction}")


def trend(rounds: np.ndarray, diffs: np.ndarray, *, upto: int | None = None,
          fraction: float = 1 / 3) -> Trend:
  """The slope of per-seed differences over the last ``fraction`` of a run.

  Args:
    rounds: evaluated rounds [R], ascending.
    diffs: per-seed differences [S, R].
    upto: the run's last round to consider (default the last evaluated round): the
      window is the evaluated rounds in ``(upto * (1 - fraction), upto]``.
    fraction: the share of the run the window covers.

  Returns:
    ``Trend``: the seeds' mean slope (points per 10 rounds) and its standard error, and
    the seeds' mean difference over the window (its level) with its standard error.

  Raises:
    ValueError: fewer than two evaluated rounds fall in the window.
  """
  rounds = np.asarray(rounds, dtype=np.float64)
  last = float(rounds[-1]) if upto is None else float(upto)
  window = (rounds > last * (1 - fraction)) & (rounds <= last)
  if window.sum() < 2:
    raise ValueError(f"the last {fraction:.0%} of rounds 1..{last:.0f} holds "
                     f"{int(window.sum())} evaluated round(s); a slope needs two")
  x = rounds[window]
  y = np.asarray(diffs, dtype=np.float64)[:, window]
  xc = x - x.mean()
  slopes = 10.0 * (y - y.mean(axis=1, keepdims=True)) @ xc / (xc @ xc)
  mean, se = mean_se(slopes)
  level, level_se = mean_se(y.mean(axis=1))
  return Trend(mean, se, int(x[0]), int(x[-1]), level, level_se)


def ranks(x: Sequence[float]) -> np.ndarray:
  """Ranks 1..n of ``x``, ties sharing their average rank."""
  x = np.asarray(x, np.float64)
  order = np.argsort(x, kind="stable")
  r = np.empty(len(x))
  r[order] = np.arange(1, len(x) + 1)
  for v in np.unique(x):
    r[x == v] = r[x == v].mean()
  return r


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
  """Spearman's rank correlation (Pearson's of the tie-averaged ranks); nan when either
  is constant."""
  rx, ry = ranks(x), ranks(y)
  rx, ry = rx - rx.mean(), ry - ry.mean()
  denom = math.sqrt(float((rx ** 2).sum() * (ry ** 2).sum()))
  return float((rx * ry).sum() / denom) if denom else math.nan


def excess_eta_squared(values: np.ndarray, groups: np.ndarray) -> float:
  """The share of the variance of ``values`` that ``groups`` explain (eta squared),
  minus its expectation when they explain nothing, (k - 1) / (n - 1), in points; nan
  with fewer than two groups or no spread."""
  values, groups = np.asarray(values, np.float64), np.asarray(groups)
  kinds = np.unique(groups)
  n, k = len(values), len(kinds)
  total = float(((values - values.mean()) ** 2).sum())
  if k < 2 or n <= k or total == 0.0:
    return math.nan
  between = sum(float((groups == g).sum()) * (values[groups == g].mean() - values.mean())
                ** 2 for g in kinds)
  return 100.0 * (between / total - (k - 1) / (n - 1))
