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

No verdict against a side that did not learn: a comparison (``'paired'`` or
``'clients'``) whose method or baseline ends, at the round read (mean over the paired
seeds), at or below its floor is ``uninformative``, neither reproduced nor opposite. A
side's floor (``side_floor``) is the chance level of its clients' own label sets, the
mean over clients of 1 / the classes each holds (``chance_level``, from the runs'
``partition.json``), or the ledger's ``Claim.floor`` where that is higher.

Every row also says where the difference was going at the round read: the slope of the
per-round difference over the last third of rounds 1..T (``stats.trend``), ``rising``
or ``falling`` beyond two standard errors, else ``flat``; and the page reads the
difference a second way, as its mean over that last third (``Trend.level``, which one
noisy evaluation cannot move), naming the claims whose verdict differs read that way.

``read`` reads a claim (its runs through ``claim_runs``) into one ``Reading`` per round.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
from typing import Sequence

import numpy as np

from fedjax_het.sweeps import stats
from fedjax_het.sweeps.claim_runs import group_runs
from fedjax_het.sweeps.claim_runs import per_seed
from fedjax_het.sweeps.claim_runs import round_comparison
from fedjax_het.sweeps.claims import Claim
from fedjax_het.sweeps.claims import Group
from fedjax_het.sweeps.rundirs import RunData

VERDICTS = ("reproduced", "same direction, smaller", "not seen", "opposite", "differs")
NOT_REACHED = "target not reached in every run"
ONE_SEED = "one seed: no verdict"  # a pair from one seed has no standard error
UNINFORMATIVE = "uninformative"  # a side at or below its floor: it did not learn
FLOORED_TESTS = ("paired", "clients")  # the comparisons of two sides' accuracies


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
  sides: tuple = ()  # ((A's accuracy, A's floor), (B's ...)) in points, for a floor test


@functools.lru_cache(maxsize=None)
def chance_level(workdir: str) -> float:
  """The mean over a run's clients of 1 / the classes in its training data (the
  accuracy of a client answering one of its own classes at random), from the run's
  ``partition.json``; nan when it has none."""
  path = os.path.join(workdir, "partition.json")
  if not os.path.exists(path):
    return math.nan
  with open(path) as f:
    held = [sum(1 for n in c["train_class_counts"] if n > 0)
            for c in json.load(f)["clients"]]
  return float(np.mean([1.0 / k for k in held if k > 0]))


def side_floor(runs: Sequence[RunData], floor: float | None = None) -> float:
  """A side's floor in points: its runs' mean ``chance_level``, or ``floor`` (a
  fraction) where that is higher (nan when neither is known)."""
  chance = [c for c in (chance_level(r.workdir) for r in runs) if not math.isnan(c)]
  levels = ([float(np.mean(chance))] if chance else []) + (
      [floor] if floor is not None else [])
  return 100.0 * max(levels) if levels else math.nan


def accuracy_at(run: RunData, round_: int) -> float:
  """A run's mean test accuracy in points at the last evaluation at or before ``round_``."""
  rows = [r for r in run.rows if r.get("mean_test_acc") is not None
          and int(r["round"]) <= round_]
  return 100.0 * rows[-1]["mean_test_acc"] if rows else math.nan


def sides_at(claim: Claim, runs_by_sweep: dict, seeds: Sequence[int],
             round_: int) -> tuple:
  """``((accuracy, floor), ...)`` of A and B at ``round_``, means over ``seeds``."""
  def side(group: Group):
    runs = [r for r in group_runs(runs_by_sweep, group) if r.seed in set(seeds)]
    return (float(np.mean([accuracy_at(r, round_) for r in runs])),
            side_floor(runs, claim.floor))
  return side(claim.a), side(claim.b)


def learned(sides: tuple) -> bool:
  """Every side above its floor (a side whose floor is unknown counts as learned)."""
  return all(not acc <= floor for acc, floor in sides)


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
    sides = ()
    if claim.test in FLOORED_TESTS:
      seeds = sorted({r.seed for r in group_runs(runs_by_sweep, claim.a)}
                     & {r.seed for r in group_runs(runs_by_sweep, claim.b)})
      sides = sides_at(claim, runs_by_sweep, seeds, last)
    judged = claim_verdict(mean, se, claim) if learned(sides) else UNINFORMATIVE
    return [Reading(last, diffs, mean, se, None, judged, sides=sides)]
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
    sides = sides_at(claim, runs_by_sweep, c.seeds, t)
    if not learned(sides):
      out.append(Reading(t, diffs, mean, se, trend, UNINFORMATIVE,
                         window and UNINFORMATIVE, sides))
      continue
    out.append(Reading(t, diffs, mean, se, trend, claim_verdict(mean, se, claim), window,
                       sides))
  return out
