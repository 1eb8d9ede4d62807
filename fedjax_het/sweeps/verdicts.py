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

No verdict against a side that did not learn: a row whose method or baseline ends, at
the round read, at or within noise of its floor is ``uninformative``, neither reproduced
nor opposite. Every kind of row is held to it: ``'paired'``, ``'clients'`` and
``'target'`` rows (both sides), ``'gates'`` and ``'fidelity'`` rows (their one side).
A client's floor is the better of two rates on its own test set, both computed from the
run's ``partition.json`` (``client_rates``): guessing from the client's training label
shares (``sum_c p_c q_c``, p its training shares, q its test shares) and always
answering its commonest training class (``q`` of that class; ties: the mean over the
tied classes). A client without test examples scores 0, as its accuracy does. The
floor, like the accuracy (``mean_test_acc``), is the mean over clients; a side's floor
is that mean over the side's runs at the paired seeds, or the ledger's ``Claim.floor``
where that is higher (``side_at``). A side is at its floor (``Side.at_floor``) when its
accuracy minus its floor, paired seed by seed (same partition), is no more than one
standard error of that difference above zero (with one seed: no more than zero).

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
ONE_SIDED = ("gates", "fidelity")  # rows of one group: its one side is floored


@dataclasses.dataclass(frozen=True)
class Side:
  """One side of a row at the round read, in points, means over the paired seeds: its
  accuracy, its floor, the two rates the floor is the better of (per client; module
  docstring), and its accuracy minus its floor with the standard error of that
  difference over the seeds (nan where no run has a ``partition.json``)."""
  accuracy: float
  floor: float
  guess: float
  commonest: float
  margin: float
  margin_se: float

  @property
  def at_floor(self) -> bool:
    """At or within one standard error above the floor (an unknown floor: False)."""
    if math.isnan(self.margin):
      return False
    return self.margin <= (0.0 if math.isnan(self.margin_se) else self.margin_se)


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
  sides: tuple = ()  # ``Side`` of A (and of B for a two-group row)


def client_rates(train_counts: Sequence[int], test_counts: Sequence[int]
                 ) -> tuple[float, float]:
  """``(guess, commonest)``: a client's accuracy on its test set guessing each label
  with its training share, and always answering its commonest training class (ties:
  the mean over the tied classes); ``(0, 0)`` without test or training examples."""
  train = np.asarray(train_counts, np.float64)
  test = np.asarray(test_counts, np.float64)
  if train.sum() <= 0 or test.sum() <= 0:
    return 0.0, 0.0
  p, q = train / train.sum(), test / test.sum()
  top = np.flatnonzero(train == train.max())
  return float(np.sum(p * q)), float(np.mean(q[top]))


@functools.lru_cache(maxsize=None)
def floor_rates(workdir: str) -> tuple[float, float, float]:
  """``(guess, commonest, floor)`` of a run, fractions: the means over its clients of
  ``client_rates`` and of the better of the two (the floor), from ``partition.json``
  (a client without ``test_class_counts``: its training shares stand for its test
  set's); nans when the run has no ``partition.json``."""
  path = os.path.join(workdir, "partition.json")
  if not os.path.exists(path):
    return math.nan, math.nan, math.nan
  with open(path) as f:
    clients = json.load(f)["clients"]
  rates = np.array([client_rates(c["train_class_counts"],
                                 c.get("test_class_counts", c["train_class_counts"]))
                    for c in clients])
  return (float(rates[:, 0].mean()), float(rates[:, 1].mean()),
          float(rates.max(axis=1).mean()))


def accuracy_at(run: RunData, round_: int) -> float:
  """A run's mean test accuracy in points at the last evaluation at or before ``round_``."""
  rows = [r for r in run.rows if r.get("mean_test_acc") is not None
          and int(r["round"]) <= round_]
  return 100.0 * rows[-1]["mean_test_acc"] if rows else math.nan


def side_at(runs: Sequence[RunData], round_: int, floor: float | None = None) -> Side:
  """The ``Side`` of ``runs`` (one per paired seed) at ``round_``; ``floor`` (a
  fraction): the ledger's floor, taken where it is above a run's own."""
  acc = np.array([accuracy_at(r, round_) for r in runs])
  rates = np.array([floor_rates(r.workdir) for r in runs]) * 100.0
  own = rates[:, 2]
  floors = own if floor is None else np.where(np.isnan(own) | (own < 100.0 * floor),
                                              100.0 * floor, own)
  known = ~np.isnan(floors)
  if known.any():
    margin, margin_se = stats.mean_se(acc[known] - floors[known])
  else:
    margin, margin_se = math.nan, math.nan

  def mean(x):
    return float(np.mean(x[~np.isnan(x)])) if (~np.isnan(x)).any() else math.nan
  return Side(float(np.mean(acc)), mean(floors), mean(rates[:, 0]), mean(rates[:, 1]),
              float(margin), float(margin_se))


def sides_at(claim: Claim, runs_by_sweep: dict, seeds: Sequence[int],
             round_: int) -> tuple:
  """The ``Side`` of A, and of B for a row of two groups, at ``round_`` over ``seeds``."""
  def side(group: Group):
    runs = [r for r in group_runs(runs_by_sweep, group) if r.seed in set(seeds)]
    return side_at(runs, round_, claim.floor)
  return (side(claim.a),) if claim.test in ONE_SIDED else (side(claim.a), side(claim.b))


def learned(sides: tuple) -> bool:
  """Every side above its floor by more than its noise (``Side.at_floor``)."""
  return not any(s.at_floor for s in sides)


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


def shared_seeds(claim: Claim, runs_by_sweep: dict) -> list[int]:
  """The seeds a row reads: A's finished ones, and B's too for a row of two groups."""
  seeds = {r.seed for r in group_runs(runs_by_sweep, claim.a)}
  if claim.test not in ONE_SIDED:
    seeds &= {r.seed for r in group_runs(runs_by_sweep, claim.b)}
  return sorted(seeds)


def read(claim: Claim, runs_by_sweep: dict) -> list[Reading]:
  """The claim at each of its rounds the runs reached ([] when no pair finished)."""
  if claim.test != "paired":
    found = per_seed(claim, runs_by_sweep)
    if found is None:
      return []
    diffs, last = found
    sides = sides_at(claim, runs_by_sweep, shared_seeds(claim, runs_by_sweep), last)
    if not learned(sides):
      mean, se = (stats.mean_se(diffs) if not np.isnan(diffs).any()
                  else (math.nan, math.nan))
      return [Reading(last, diffs, mean, se, None, UNINFORMATIVE, sides=sides)]
    if claim.test == "target" and np.isnan(diffs).any():
      return [Reading(last, diffs, math.nan, math.nan, None, NOT_REACHED, sides=sides)]
    mean, se = stats.mean_se(diffs)
    return [Reading(last, diffs, mean, se, None, claim_verdict(mean, se, claim),
                    sides=sides)]
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
