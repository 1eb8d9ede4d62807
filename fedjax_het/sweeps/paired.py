r"""Paired differences between a sweep's runs, matched by seed.

  python experiments/paired.py --sweep_dir=results/bf16_fedmrl_cpu --baseline=float32
  python experiments/paired.py --sweep_dir=results/paper_cpu --baseline=standalone

Two runs of a sweep at the same seed share everything the seed draws that the grid does
not change: within a setting every method gets the same partition (one partition per
cell), and two settings that differ only in, say, ``runtime.compute_dtype`` share the
partition, the initial keys and the sampling. The difference between them at one seed
is therefore far less noisy than the difference between two means over seeds, whose
spread is mostly the partition's. This module reports, for each pair of groups, the
per-seed differences and their mean with its standard error (sample std / sqrt(n)).

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

from fedjax_het.sweeps.rundirs import RunData
from fedjax_het.sweeps.rundirs import load_runs

# (column title, metrics.jsonl key, statistic)
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

  def trend(self, upto: int | None = None, fraction: float = 1 / 3) -> Trend:
    """The slope of the difference over the last ``fraction`` of rounds 1..``upto``."""
    return trend(self.rounds, self.diffs, upto=upto, fraction=fraction)


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


def first_reach(acc: Sequence[float], target: float) -> int | None:
  """Index of the first value ``>= target`` (None when never reached)."""
  hits = np.flatnonzero(np.asarray(acc) >= target)
  return int(hits[0]) if len(hits) else None


def mean_se(diffs: np.ndarray) -> tuple[float, float]:
  """Mean and its standard error (sample std / sqrt(n); nan for a single value)."""
  d = np.asarray(diffs, dtype=np.float64)
  se = float(d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else float("nan")
  return float(d.mean()), se


def mean_se_text(mean: float, se: float) -> str:
  """``'+1.23 ± 0.45'`` (no ``±`` part when ``se`` is nan: a single seed)."""
  return f"{mean:+.2f}" + ("" if math.isnan(se) else f" ± {se:.2f}")


def _cell(diffs: np.ndarray) -> str:
  return mean_se_text(*mean_se(diffs))


def markdown(comparisons: Sequence[Comparison], *, last_k: int,
             per_seed: bool = False) -> str:
  """The table of mean differences (± standard error) and, if asked, per-seed values."""
  if not comparisons:
    return "No pair of groups shares a finished seed.\n"
  titles = [t for t, _, _ in METRICS if any(t in c.diffs for c in comparisons)]
  shown = [t.replace("last k", f"last {last_k}") for t in titles]
  first = comparisons[0]
  minus = (f"the same method in setting {first.base_setting!r}"
           if first.base_method == first.method
           else f"{first.base_method} in the same setting")
  lines = [
      f"Each row: the method in the setting minus {minus}, in accuracy points, mean ± "
      "standard error over the seeds both finished (n); `last "
      f"{last_k}`: the mean of the evaluations in the last {last_k} rounds.", "",
      "| method | setting | n | " + " | ".join(shown) + " |",
      "|---|---|---:|" + "---:|" * len(titles)]
  for c in comparisons:
    cells = [_cell(c.diffs[t]) if t in c.diffs else "–" for t in titles]
    lines.append(f"| {c.method} | {c.setting} | {len(c.seeds)} | " + " | ".join(cells)
                 + " |")
  if per_seed:
    for c in comparisons:
      lines += ["", f"{c.method} / {c.setting} minus {c.base_method} / "
                f"{c.base_setting}, per seed ({', '.join(map(str, c.seeds))}):", ""]
      for t, name in zip(titles, shown):
        if t in c.diffs:
          lines.append(f"- {name}: " + " / ".join(f"{d:+.2f}" for d in c.diffs[t])
                       + f" (baseline {' / '.join(f'{b:.2f}' for b in c.base[t])})")
  return "\n".join(lines) + "\n"


def trend_markdown(comparisons: Sequence[RoundComparison], *,
                   per_round: bool = False) -> str:
  """Where each difference is going: its value at the last round both evaluated, its
  mean over the last third of the run and its slope there (``trend``); with
  ``per_round`` also the difference at every evaluated round."""
  if not comparisons:
    return ""
  protocol = {"mean_test_acc": "(a)", "sampled_test_acc": "(b)"}
  lines = ["Where each difference is going: at the last round every seed evaluated, its "
           "mean over the last third of the run (which one noisy evaluation cannot move) "
           "and its slope there (each seed's mean and least-squares slope, mean ± "
           "standard error over the seeds, points and points per 10 rounds; `rising` or "
           "`falling` beyond two standard errors, else `flat`).", "",
           "| method | setting | protocol | n | last round | difference | last third "
           "| slope / 10 rounds | going |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
  for c in comparisons:
    try:
      t = c.trend()
    except ValueError:  # too few evaluated rounds in the last third
      t = None
    level, slope = ("–", "–") if t is None else (mean_se_text(t.level, t.level_se),
                                                 mean_se_text(t.slope, t.se))
    lines.append(f"| {c.method} | {c.setting} | {protocol.get(c.key, c.key)} | "
                 f"{len(c.seeds)} | {int(c.rounds[-1])} | {_cell(c.diffs[:, -1])} | "
                 f"{level} | {slope} | {'–' if t is None else t.direction} |")
  if per_round:
    for c in comparisons:
      lines += ["", f"{c.method} / {c.setting} minus {c.base_method} / {c.base_setting}, "
                f"{protocol.get(c.key, c.key)}, by round (mean ± s.e. over seeds "
                f"{', '.join(map(str, c.seeds))}):", "", "| round | difference |",
                "|---:|---:|"]
      lines += [f"| {int(r)} | {_cell(c.diffs[:, i])} |" for i, r in enumerate(c.rounds)]
  return "\n".join(lines) + "\n"


def paired_report(sweep_dir: str, baseline: str, *, last_k: int = 5,
                  per_seed: bool = False, per_round: bool = False) -> str:
  """The Markdown report of ``sweep_dir``'s groups against ``baseline``: the table of
  differences, then where each is going (``trend_markdown``)."""
  if last_k < 1:
    raise ValueError(f"--last_k must be >= 1, got {last_k}")
  runs = load_runs(sweep_dir)
  if not runs:
    raise FileNotFoundError(f"no run directories with metrics under {sweep_dir!r}")
  table = markdown(compare(group_values(runs, last_k), baseline), last_k=last_k,
                   per_seed=per_seed)
  rounds = [c for key in ("mean_test_acc", "sampled_test_acc")
            for c in compare_rounds(runs, baseline, key)]
  trends = trend_markdown(rounds, per_round=per_round)
  return table + ("\n" + trends if trends else "")


def cli() -> None:
  """The command line: ``--sweep_dir``, ``--baseline``, ``--last_k``, ``--per_seed``,
  ``--per_round``."""
  from absl import flags  # noqa: PLC0415

  from fedjax_het import cli as cli_lib  # noqa: PLC0415

  sweep_dir = flags.DEFINE_string("sweep_dir", None, "A sweep directory (or of runs).")
  baseline = flags.DEFINE_string("baseline", None, "A setting or a method to subtract.")
  last_k = flags.DEFINE_integer("last_k", 5, "Rounds averaged by the `last k` columns.")
  per_seed = flags.DEFINE_bool("per_seed", False, "Also list every seed's difference.")
  per_round = flags.DEFINE_bool("per_round", False,
                                "Also list the difference at every evaluated round.")
  flags.mark_flags_as_required(["sweep_dir", "baseline"])

  def main(argv):
    del argv
    try:
      print(paired_report(sweep_dir.value, baseline.value, last_k=last_k.value,
                          per_seed=per_seed.value, per_round=per_round.value),
            end="", flush=True)
    except (ValueError, FileNotFoundError) as err:
      cli_lib.fail(err)

  cli_lib.run(main, flag=None)


if __name__ == "__main__":
  cli()
