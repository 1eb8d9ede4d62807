"""Deciding a claim's verdict: its per-seed differences read at each of its rounds.

A claim's difference is the mean over seeds of the per-seed difference, with its
standard error (``stats.mean_se``), and its verdict (``verdict``):

- ``reproduced``: the paper's sign beyond two standard errors and at least half the
  paper's size (a claim without a number: the sign alone);
- ``same direction, smaller``: the paper's sign beyond two standard errors, under half;
- ``not seen``: within two standard errors of zero;
- ``opposite``: the other sign beyond two standard errors;
- a claim of no difference (a method robust to a setting): ``reproduced`` within two
  standard errors of zero, ``differs`` beyond.

Every row also says where the difference was going at the round read: the slope of the
per-round difference over the last third of rounds 1..T (``stats.trend``), ``rising``
or ``falling`` beyond two standard errors, else ``flat``; and the page reads the
difference a second way, as its mean over that last third (``Trend.level``, which one
noisy evaluation cannot move), naming the claims whose verdict differs read that way.

``read`` reads a claim (its runs through ``claim_runs``) into one ``Reading`` per round.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from fedjax_het.sweeps import stats
from fedjax_het.sweeps.claim_runs import per_seed
from fedjax_het.sweeps.claim_runs import round_comparison
from fedjax_het.sweeps.claims import Claim

VERDICTS = ("reproduced", "same direction, smaller", "not seen", "opposite", "differs")
NOT_REACHED = "target not reached in every run"
ONE_SEED = "one seed: no verdict"  # a pair from one seed has no standard error


@dataclasses.dataclass(frozen=True)
class Reading:
  """A claim read at one round: per-seed differences, their mean ± s.e., the trend,
  the verdict, and ``window``: the verdict of the trend's level (the mean difference
  over the last third of the rounds read; "" without a trend)."""
  round: int
  diffs: np.ndarray
  mean: float
  se: float
  trend: stats.Trend | None
  verdict: str
  window: str = ""


def verdict(mean: float, se: float, paper_points: float | None,
            direction: int = 1) -> str:
  """The verdict of a difference ``mean`` ± ``se`` against the paper's (module docstring).

  Raises:
    ValueError: ``se`` is nan (a single seed has no verdict).
  """
  if math.isnan(se):
    raise ValueError("a verdict needs at least two seeds (no standard error)")
  if direction == 0 and paper_points is None:
    return "reproduced" if abs(mean) <= 2 * se else "differs"
  if abs(mean) <= 2 * se:
    return "not seen"
  sign = direction if paper_points is None else math.copysign(1, paper_points)
  if mean * sign < 0:
    return "opposite"
  if paper_points is None or abs(mean) >= abs(paper_points) / 2:
    return "reproduced"
  return "same direction, smaller"


def claim_verdict(mean: float, se: float, claim: Claim) -> str:
  """``verdict`` of ``claim``'s difference, or ``ONE_SEED`` without a standard error."""
  return (ONE_SEED if math.isnan(se)
          else verdict(mean, se, claim.paper_points, claim.direction))


def read(claim: Claim, runs_by_sweep: dict) -> list[Reading]:
  """The claim at each of its rounds the runs reached ([] when no pair finished)."""
  if claim.test != "paired":
    found = per_seed(claim, runs_by_sweep)
    if found is None:
      return []
    diffs, last = found
    if claim.test == "target" and np.isnan(diffs).any():
      return [Reading(last, diffs, math.nan, math.nan, None, NOT_REACHED)]
    mean, se = stats.mean_se(diffs)
    return [Reading(last, diffs, mean, se, None, claim_verdict(mean, se, claim))]
  c = round_comparison(claim, runs_by_sweep)
  if c is None:
    return []
  out = []
  for t in claim.rounds:
    if t > c.rounds[-1]:
      continue
    diffs = c.at(t)
    mean, se = stats.mean_se(diffs)
    try:
      trend = c.trend(upto=t)
    except ValueError:
      trend = None
    window = "" if trend is None else claim_verdict(trend.level, trend.level_se, claim)
    out.append(Reading(t, diffs, mean, se, trend, claim_verdict(mean, se, claim), window))
  return out
