r"""Paired differences between a sweep's runs, matched by seed.

  python experiments/paired.py --sweep_dir=results/bf16_fedmrl_cpu --baseline=float32
  python experiments/paired.py --sweep_dir=results/paper_cpu --baseline=standalone

Two runs of a sweep at the same seed share everything the seed draws that the grid does
not change: within a setting every method gets the same partition (one partition per
cell), and two settings that differ only in, say, ``runtime.compute_dtype`` share the
partition, the initial keys and the sampling. The difference between them at one seed
is therefore far less noisy than the difference between two means over seeds, whose
spread is mostly the partition's. This module reports, for each pair of groups, the
per-seed differences and their mean with its standard error (sample std / sqrt(n));
``paired_report`` writes them as Markdown (the command line of ``experiments/paired.py``).

``--baseline`` names either a setting (each method's other settings against that
setting: bf16 against float32) or a method (every other method against it within each
setting: FedMRL against Standalone). Only finished runs (a ``summary.json``) count, and
only seeds both groups finished.

The metrics, in accuracy points (the runs' fractions x 100), for protocol (a)
(``mean_test_acc``: every client, the server's shared parameters) and, where the runs
evaluated it, protocol (b) (``sampled_test_acc``: the round's sampled clients after
local training): ``final`` (the last evaluation), ``last k`` (the mean of the
evaluations in the last ``k`` rounds, ``--last_k``; with evaluation every round a
less noisy reading of where a run ends than its final evaluation alone) and ``best``
(the best evaluated round; for (b) the best of every round, logged or not).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

from fedjax_het.sweeps import stats
from fedjax_het.sweeps.rundirs import RunData

METRICS = (
    ("final (a)", "mean_test_acc", "final"),
    ("last k (a)", "mean_test_acc", "last_k"),
    ("best (a)", "mean_test_acc", "best"),
    ("final (b)", "sampled_test_acc", "final"),
    ("last k (b)", "sampled_test_acc", "last_k"),
    ("best (b)", "sampled_test_acc", "best"),
)


@dataclasses.dataclass(frozen=True)
class Comparison:
  """One group against the baseline group, seed by seed.

  Attributes:
    method, setting: the compared group.
    base_method, base_setting: the baseline group (one of them equals the compared
      group's, the other is the baseline).
    seeds: the seeds both groups finished, sorted.
    diffs: column title -> per-seed differences in points [len(seeds)] (group minus
      baseline); columns the runs lack are absent.
    base: column title -> the baseline group's per-seed values in points.
  """
  method: str
  setting: str
  base_method: str
  base_setting: str
  seeds: tuple
  diffs: dict
  base: dict


def run_metrics(rows: Sequence[dict], last_k: int) -> dict:
  """A run's accuracies in points by column title (see ``METRICS``).

  Args:
    rows: the run's ``metrics.jsonl`` rows in round order.
    last_k: ``last k`` averages the evaluations of rounds ``> final round - last_k``.

  Returns:
    ``{title: points}`` for every column whose key some row holds.
  """
  if last_k < 1:
    raise ValueError(f"last_k must be >= 1, got {last_k}")
  out = {}
  for title, key, stat in METRICS:
    evaluated = [(r["round"], r[key]) for r in rows if r.get(key) is not None]
    if not evaluated:
      continue
    last_round = evaluated[-1][0]
    if stat == "final":
      value = evaluated[-1][1]
    elif stat == "last_k":
      value = float(np.mean([v for t, v in evaluated if t > last_round - last_k]))
    else:
      value = max(v for _, v in evaluated)
      if key == "sampled_test_acc":  # the loop's running best covers unlogged rounds
        value = max([value] + [r["best_sampled_test_acc"] for r in rows
                               if r.get("best_sampled_test_acc") is not None])
    out[title] = 100.0 * value
  return out


def group_values(runs: Sequence[RunData], last_k: int) -> dict:
  """``{(method, setting): {seed: run_metrics}}`` over the finished runs."""
  groups: dict = {}
  for run in runs:
    if run.per_client is None:  # no summary.json: the run has not finished
      continue
    groups.setdefault((run.method, run.setting), {})[run.seed] = run_metrics(
        run.rows, last_k)
  return groups


def pairs(groups: dict, baseline: str) -> list[tuple[tuple, tuple, tuple]]:
  """``[(group, baseline group, shared seeds)]``: every group of ``groups`` (``{(method,
  setting): {seed: ...}}``) against ``baseline``, a setting or a method name of them.

  A setting as baseline pairs each method's other settings with that setting (bf16
  against float32); a method pairs every other method with it within each setting.

  Raises:
    ValueError: ``baseline`` names no group, or both a method and a setting.
  """
  methods = list(dict.fromkeys(m for m, _ in groups))
  settings = list(dict.fromkeys(s for _, s in groups))
  is_setting, is_method = baseline in settings, baseline in methods
  if is_setting == is_method:
    what = "both a method and a setting" if is_setting else "no method or setting"
    raise ValueError(f"--baseline={baseline!r} is {what} of the finished runs; methods: "
                     f"{', '.join(methods) or '(none)'}; settings: "
                     f"{', '.join(map(repr, settings)) or '(none)'}")
  out = []
  for (method, setting), values in groups.items():
    base_key = (method, baseline) if is_setting else (baseline, setting)
    if base_key == (method, setting) or base_key not in groups:
      continue
    seeds = tuple(sorted(set(values) & set(groups[base_key])))
    if seeds:
      out.append(((method, setting), base_key, seeds))
  return out


def compare(groups: dict, baseline: str) -> list[Comparison]:
  """Every group against ``baseline``, a setting or a method name of ``groups``
  (``pairs``), in the ``METRICS`` columns both groups' runs hold.

  Raises:
    ValueError: ``baseline`` names no group, or both a method and a setting.
  """
  out = []
  for key, base_key, seeds in pairs(groups, baseline):
    values, base_values = groups[key], groups[base_key]
    titles = [t for t, _, _ in METRICS
              if all(t in values[s] and t in base_values[s] for s in seeds)]
    out.append(Comparison(
        *key, *base_key, seeds,
        {t: np.array([values[s][t] - base_values[s][t] for s in seeds]) for t in titles},
        {t: np.array([base_values[s][t] for s in seeds]) for t in titles}))
  return out


@dataclasses.dataclass(frozen=True)
class RoundComparison:
  """One group against the baseline group at every round both evaluated, seed by seed.

  Attributes:
    method, setting, base_method, base_setting: as ``Comparison``.
    key: the ``metrics.jsonl`` accuracy compared (``mean_test_acc``: protocol (a)).
    seeds: the seeds both groups finished, sorted.
    rounds: the rounds every one of those runs evaluated [R], ascending.
    diffs: per-seed differences in points [len(seeds), R] (group minus baseline).
  """
  method: str
  setting: str
  base_method: str
  base_setting: str
  key: str
  seeds: tuple
  rounds: np.ndarray
  diffs: np.ndarray

  def at(self, round_: int) -> np.ndarray:
    """The per-seed differences at ``round_`` (the last evaluated round <= it)."""
    i = int(np.searchsorted(self.rounds, round_, side="right")) - 1
    if i < 0:
      raise ValueError(f"no evaluation at or before round {round_} "
                       f"(first: {int(self.rounds[0])})")
    return self.diffs[:, i]

  def mean_se(self) -> tuple[np.ndarray, np.ndarray]:
    """Per round: the mean difference and its standard error over seeds [R] each."""
    n = self.diffs.shape[0]
    se = (self.diffs.std(axis=0, ddof=1) / math.sqrt(n) if n > 1
          else np.full(self.diffs.shape[1], np.nan))
    return self.diffs.mean(axis=0), se

  def trend(self, upto: int | None = None, fraction: float = 1 / 3) -> stats.Trend:
    """The slope of the difference over the last ``fraction`` of rounds 1..``upto``
    (``stats.trend``)."""
    return stats.trend(self.rounds, self.diffs, upto=upto, fraction=fraction)


def round_values(rows: Sequence[dict], key: str) -> dict:
  """``{round: points}`` of the rows that evaluated ``key``."""
  return {int(r["round"]): 100.0 * r[key] for r in rows if r.get(key) is not None}


def compare_rounds(runs: Sequence[RunData], baseline: str,
                   key: str = "mean_test_acc") -> list[RoundComparison]:
  """Every finished group against ``baseline`` (a setting or a method), round by round.

  Only seeds both groups finished count, and only rounds every one of those runs
  evaluated.

  Raises:
    ValueError: ``baseline`` names no group, or both a method and a setting.
  """
  groups: dict = {}
  for run in runs:
    if run.per_client is not None:
      groups.setdefault((run.method, run.setting), {})[run.seed] = round_values(
          run.rows, key)
  out = []
  for group, base_key, _ in pairs(groups, baseline):
    c = round_pair(groups[group], groups[base_key], group, base_key, key)
    if c is not None:
      out.append(c)
  return out


def round_pair(values: dict, base: dict, group: tuple, base_group: tuple,
               key: str = "mean_test_acc") -> RoundComparison | None:
  """``values`` minus ``base`` (each ``{seed: {round: points}}``) at the seeds both hold
  and the rounds all of those runs evaluated; None when they share none."""
  seeds = tuple(sorted(set(values) & set(base)))
  if not seeds:
    return None
  common = set.intersection(*(set(values[s]) & set(base[s]) for s in seeds))
  if not common:
    return None
  rounds = np.array(sorted(common))
  diffs = np.array([[values[s][t] - base[s][t] for t in rounds] for s in seeds])
  return RoundComparison(*group, *base_group, key, seeds, rounds, diffs)
