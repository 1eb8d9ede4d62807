r"""The claims ledger: the papers' claims tested on committed runs, with verdicts.

  python experiments/claims_page.py --results=results --out=docs/claims.md

A ledger (``experiments/claims/ledger.py``) is a list of ``Claim``: the paper's
statement and number, the setting we ran, and two groups of runs (``Group``: a sweep
directory under ``--results``, a method and a setting, and optionally cells of other
sweeps holding the same runs at more seeds) compared seed by seed, at the
same partition, at one or more rounds (``Claim.rounds``). Groups of different sweeps
pair when their runs share the seed and the partition (the claims sweeps hold the same
public set out of every pool); a comparison read at several budgets (T and 3 T) is one
row per budget with a shared ``Claim.headline``.

A claim's difference is the mean over seeds of the per-seed difference, with its
standard error (``paired``), and its verdict (``verdict``):

- ``reproduced``: the paper's sign beyond two standard errors and at least half the
  paper's size (a claim without a number: the sign alone);
- ``same direction, smaller``: the paper's sign beyond two standard errors, under half;
- ``not seen``: within two standard errors of zero;
- ``opposite``: the other sign beyond two standard errors;
- a claim of no difference (a method robust to a setting): ``reproduced`` within two
  standard errors of zero, ``differs`` beyond.

Every row also says where the difference was going at the round read: the slope of the
per-round difference over the last third of rounds 1..T (``paired.trend``), ``rising``
or ``falling`` beyond two standard errors, else ``flat``; and the page reads the
difference a second way, as its mean over that last third (``Trend.level``, which one
noisy evaluation cannot move), naming the claims whose verdict differs read that way.
Tests: ``'paired'`` (A minus B in accuracy points, protocol (a)), ``'clients'`` (the
share of clients on which A beats B at the run's final round, minus 50%, in points: the
papers' "76% of clients") and ``'target'`` (what A saves against B to first reach
``Claim.target`` mean test accuracy, in % of B's cost, per seed: rounds, communication =
the parameters sent both ways until then, or computation = those rounds times the
round's FLOPs from the sweep's ``costs.json``, as the papers count them; a seed in which
either never reaches the target leaves the claim without a verdict) and ``'gates'``
(FedMoE's gate weights on the test samples, from ``gates.json`` beside a run,
``write_gates``: how much more of their variance the clients explain
(``measure='clients'``), or within each client its classes (``'classes'``), than chance
would, in points; a one-sided claim that they differ) and ``'fidelity'`` (Moss: the
Spearman rank correlation, per seed, between each client's final test accuracy and the
FILE fidelity of its device type at the final round, ``fidelity_correlation``).
"""
from __future__ import annotations

import csv
import dataclasses
import math
import os
from typing import Sequence

import numpy as np

from fedjax_het.sweeps import paired
from fedjax_het.sweeps.rundirs import RunData
from fedjax_het.sweeps.rundirs import load_runs
from fedjax_het.sweeps.rundirs import read_json

VERDICTS = ("reproduced", "same direction, smaller", "not seen", "opposite", "differs")
TESTS = ("paired", "clients", "target", "gates", "fidelity")
MEASURES = {"target": ("rounds", "communication", "computation"),
            "gates": ("clients", "classes")}
GATES_FILE = "gates.json"
NOT_REACHED = "target not reached in every run"
ONE_SEED = "one seed: no verdict"  # a pair from one seed has no standard error
TIMINGS = frozenset({"wall_s"})  # metric keys that differ between copies of a run


@dataclasses.dataclass(frozen=True)
class Group:
  """Runs of one method in one setting of one sweep (``sweep``: its directory under the
  ledger's results root), joined by the runs of the groups in ``more``: the same runs
  (same config but the seed) that other sweeps made at further seeds, so that a claim
  can read 5 seeds where the first sweep ran 3."""
  sweep: str
  method: str
  setting: str
  more: tuple = ()

  def __post_init__(self):
    if any(not isinstance(g, Group) or g.more for g in self.more):
      raise ValueError(f"{self.method} ({self.sweep}: {self.setting}): 'more' takes "
                       "groups without a 'more' of their own")

  @property
  def cells(self) -> tuple:
    """``(sweep, method, setting)`` of every cell the group reads, its own first."""
    return tuple((g.sweep, g.method, g.setting) for g in (self, *self.more))

  @property
  def sweeps(self) -> tuple:
    """Every sweep directory the group reads, its own first."""
    return tuple(dict.fromkeys(sweep for sweep, _, _ in self.cells))

  def __str__(self) -> str:
    more = "".join(f" + {g.sweep}" + (f" ({g.setting})" if g.setting != self.setting else "")
                   for g in self.more)
    return f"{self.method} ({self.sweep}{more}: {self.setting})"


@dataclasses.dataclass(frozen=True)
class Claim:
  """One row of the ledger.

  Attributes:
    id: short name (``'P1 8/10'``); also the figure's file name.
    paper: the paper's statement, with where it is (table, figure, section).
    paper_points: the paper's difference in points; its sign is the claim's direction.
      None for a claim without a number (then ``direction`` gives the sign).
    ran: the setting we ran and how it is cut from the paper's.
    a, b: the groups compared (A minus B).
    rounds: the rounds read (the last of them no later than the runs' last round).
    sweep_files: the sweep files that make the runs (commands on the page).
    test: ``'paired'``, ``'clients'`` or ``'target'`` (module docstring).
    direction: +1 or -1, the claim's sign when ``paper_points`` is None; 0 for a claim
      of no difference (robustness): ``reproduced`` when within two standard errors of
      zero, else ``differs``.
    headline: the name shared by one comparison's rows at several budgets (the page
      says where their verdicts differ), or "".
    target: a ``'target'`` claim's accuracy (a fraction in (0, 1]).
    measure: a ``'target'`` claim's cost, or what a ``'gates'`` claim's weights differ
      across (``MEASURES``).
  """
  id: str
  paper: str
  paper_points: float | None
  ran: str
  a: Group
  b: Group
  rounds: tuple
  sweep_files: tuple
  test: str = "paired"
  direction: int = 1
  headline: str = ""
  target: float | None = None
  measure: str = ""

  def __post_init__(self):
    if self.test not in TESTS:
      raise ValueError(f"claim {self.id}: test={self.test!r} is not one of {TESTS}")
    if self.test == "target":
      if self.target is None or not 0 < self.target <= 1:
        raise ValueError(f"claim {self.id}: a 'target' claim needs target in (0, 1]; "
                         f"got {self.target!r}")
    if self.test in MEASURES and self.measure not in MEASURES[self.test]:
      raise ValueError(f"claim {self.id}: measure={self.measure!r} is not one of "
                       f"{MEASURES[self.test]}")
    if not self.rounds:
      raise ValueError(f"claim {self.id}: no rounds to read")


@dataclasses.dataclass(frozen=True)
class Reading:
  """A claim read at one round: per-seed differences, their mean ± s.e., the trend,
  the verdict, and ``window``: the verdict of the trend's level (the mean difference
  over the last third of the rounds read; "" without a trend)."""
  round: int
  diffs: np.ndarray
  mean: float
  se: float
  trend: paired.Trend | None
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


def group_runs(runs_by_sweep: dict, group: Group) -> list[RunData]:
  """The finished runs of ``group``, one per seed, from every cell it reads (a seed
  found twice is a copy of one run: the first is kept).

  Raises:
    ValueError: a seed finished in two of its cells with different metrics.
  """
  by_seed = {}
  for sweep, method, setting in group.cells:
    for r in runs_by_sweep.get(sweep, []):
      if r.method != method or r.setting != setting or r.per_client is None:
        continue
      first = by_seed.setdefault(r.seed, r)
      if first is not r and _metrics(first) != _metrics(r):
        raise ValueError(f"{group}: seed {r.seed} finished in {first.workdir} and in "
                         f"{r.workdir} with different metrics")
  return list(by_seed.values())


def _metrics(run: RunData) -> list[dict]:
  """A run's metric rows without their timings (a copied run's are equal)."""
  return [{k: v for k, v in row.items() if k not in TIMINGS} for row in run.rows]


def round_comparison(claim: Claim, runs_by_sweep: dict) -> paired.RoundComparison | None:
  """A minus B at every round both groups' finished runs evaluated (protocol (a))."""
  def values(group):
    return {r.seed: paired.round_values(r.rows, "mean_test_acc")
            for r in group_runs(runs_by_sweep, group)}
  return paired.round_pair(values(claim.a), values(claim.b),
                           (claim.a.method, claim.a.setting),
                           (claim.b.method, claim.b.setting))


def client_shares(claim: Claim, runs_by_sweep: dict) -> tuple[np.ndarray, int] | None:
  """Per seed, the share of clients on which A beats B at the final round, minus 50%,
  in points; and that final round. None when the groups share no finished seed."""
  a = {r.seed: r for r in group_runs(runs_by_sweep, claim.a)}
  b = {r.seed: r for r in group_runs(runs_by_sweep, claim.b)}
  seeds = sorted(set(a) & set(b))
  if not seeds:
    return None
  shares = [100.0 * np.mean(np.greater(a[s].per_client, b[s].per_client)) - 50.0
            for s in seeds]
  return np.array(shares), int(a[seeds[0]].rows[-1]["round"])


def sweep_root(run: RunData) -> str:
  """The sweep directory a run of a sweep lies in (``<root>/<method>/<setting>/seed<k>``)."""
  return run.workdir[:-len(run.name)].rstrip(os.sep) or "."


def round_flops(run: RunData) -> float:
  """FLOPs of one round of ``run``'s cell, from its sweep's ``costs.json``.

  Raises:
    ValueError: the sweep holds no cost of the run's cell.
  """
  from fedjax_het.sweeps import budget  # noqa: PLC0415 - only for 'computation' claims
  path = os.path.join(sweep_root(run), budget.COSTS_FILE)
  costs = read_json(path) if os.path.exists(path) else {}
  cost = costs.get(f"{run.method}|{run.setting}")
  if not cost or not cost.get("round_flops"):
    raise ValueError(f"no round_flops of {run.method}|{run.setting} in {path}")
  return float(cost["round_flops"])


def cost_to_target(run: RunData, target: float, measure: str) -> float:
  """What ``run`` spent until its mean test accuracy first reached ``target`` (inf when
  it never did): rounds, parameters sent both ways, or FLOPs (module docstring)."""
  rows = [r for r in run.rows if r.get("mean_test_acc") is not None]
  i = paired.first_reach([r["mean_test_acc"] for r in rows], target)
  if i is None:
    return math.inf
  row = rows[i]
  if measure == "rounds":
    return float(row["round"])
  if measure == "communication":
    return float(row["uplink_params"] + row["downlink_params"])
  return float(row["round"]) * round_flops(run)


def target_savings(claim: Claim, runs_by_sweep: dict) -> tuple[np.ndarray, int] | None:
  """Per seed, 100 (cost_B - cost_A) / cost_B to reach the claim's target (nan where
  either run never reached it), and the runs' last round; None when no seed is shared."""
  a = {r.seed: r for r in group_runs(runs_by_sweep, claim.a)}
  b = {r.seed: r for r in group_runs(runs_by_sweep, claim.b)}
  seeds = sorted(set(a) & set(b))
  if not seeds:
    return None
  out = []
  for s in seeds:
    cost_a, cost_b = (cost_to_target(g[s], claim.target, claim.measure) for g in (a, b))
    finite = math.isfinite(cost_a) and math.isfinite(cost_b)
    out.append(100.0 * (cost_b - cost_a) / cost_b if finite else math.nan)
  return np.array(out), int(a[seeds[0]].rows[-1]["round"])


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


def gate_excess(samples: Sequence[tuple], measure: str) -> float:
  """``excess_eta_squared`` of the gate weights ``[(alpha, labels)]`` (one per client)
  by client (``'clients'``), or by class within each client, averaged over the clients
  with two classes or more (``'classes'``)."""
  if measure == "clients":
    return excess_eta_squared(np.concatenate([a for a, _ in samples]),
                              np.concatenate([np.full(len(a), k)
                                              for k, (a, _) in enumerate(samples)]))
  per_client = [excess_eta_squared(a, y) for a, y in samples]
  per_client = [v for v in per_client if not math.isnan(v)]
  return float(np.mean(per_client)) if per_client else math.nan


def write_gates(run: RunData) -> str:
  """``<workdir>/gates.json``: every client's ``(alpha_G, label)`` on its test samples,
  from the run's final checkpoint (``plots.gate_samples_by_client``)."""
  from fedjax_het.sweeps import plots  # noqa: PLC0415 - restores the checkpoint
  from fedjax_het.training import metrics as metrics_lib  # noqa: PLC0415
  samples = plots.gate_samples_by_client(run.workdir)
  path = os.path.join(run.workdir, GATES_FILE)
  metrics_lib.write_json(path, {
      "round": int(run.rows[-1]["round"]),
      "clients": [{"alpha_global": [round(float(v), 5) for v in a],
                   "label": [int(v) for v in y]} for a, y in samples]})
  return path


def read_gates(run: RunData) -> list[tuple[np.ndarray, np.ndarray]] | None:
  """``[(alpha_G, labels)]`` per client from ``gates.json``, or None when absent."""
  path = os.path.join(run.workdir, GATES_FILE)
  if not os.path.exists(path):
    return None
  return [(np.asarray(c["alpha_global"]), np.asarray(c["label"]))
          for c in read_json(path)["clients"]]


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


def client_fidelity(run: RunData) -> tuple[np.ndarray, np.ndarray]:
  """Per client, the FILE fidelity of its device type at the run's last logged round
  (``metrics.jsonl``'s ``fidelity``, one per architecture group) and its final test
  accuracy (``summary.json``)."""
  from fedjax_het.data import federated  # noqa: PLC0415
  from fedjax_het.models import registry  # noqa: PLC0415
  config = read_json(os.path.join(run.workdir, "config.json"))
  _, client_ids = federated.group_clients(
      registry.client_archs(config["models"], config["num_clients"]))
  logged = [r["fidelity"] for r in run.rows if r.get("fidelity") is not None]
  if not logged:
    raise ValueError(f"{run.workdir}: no fidelity in metrics.jsonl (not a Moss run?)")
  fid = np.zeros(config["num_clients"])
  for g, ids in enumerate(client_ids):
    fid[list(ids)] = logged[-1][g]
  return fid, np.asarray(run.per_client, np.float64)


def fidelity_correlation(run: RunData) -> float:
  """Spearman's rank correlation between clients' fidelity and accuracy (above)."""
  return spearman(*client_fidelity(run))


def per_seed(claim: Claim, runs_by_sweep: dict) -> tuple[np.ndarray, int] | None:
  """A one-reading claim's per-seed values and the runs' last round (None: no runs)."""
  if claim.test in ("clients", "target"):
    return (client_shares if claim.test == "clients" else target_savings)(claim,
                                                                          runs_by_sweep)
  runs = group_runs(runs_by_sweep, claim.a)
  if claim.test == "gates":
    found = [(r, read_gates(r)) for r in runs]
    found = [(r, g) for r, g in found if g is not None]
    values = [gate_excess(g, claim.measure) for _, g in found]
    runs = [r for r, _ in found]
  else:  # fidelity
    values = [fidelity_correlation(r) for r in runs]
  return (np.array(values), int(runs[0].rows[-1]["round"])) if runs else None


def read(claim: Claim, runs_by_sweep: dict) -> list[Reading]:
  """The claim at each of its rounds the runs reached ([] when no pair finished)."""
  if claim.test != "paired":
    found = per_seed(claim, runs_by_sweep)
    if found is None:
      return []
    diffs, last = found
    if claim.test == "target" and np.isnan(diffs).any():
      return [Reading(last, diffs, math.nan, math.nan, None, NOT_REACHED)]
    mean, se = paired.mean_se(diffs)
    return [Reading(last, diffs, mean, se, None, _verdict(mean, se, claim))]
  c = round_comparison(claim, runs_by_sweep)
  if c is None:
    return []
  out = []
  for t in claim.rounds:
    if t > c.rounds[-1]:
      continue
    diffs = c.at(t)
    mean, se = paired.mean_se(diffs)
    try:
      trend = c.trend(upto=t)
    except ValueError:
      trend = None
    window = "" if trend is None else _verdict(trend.level, trend.level_se, claim)
    out.append(Reading(t, diffs, mean, se, trend, _verdict(mean, se, claim), window))
  return out


def _verdict(mean: float, se: float, claim: Claim) -> str:
  return (ONE_SEED if math.isnan(se)
          else verdict(mean, se, claim.paper_points, claim.direction))


def sweeps_read(claims: Sequence[Claim]) -> list[str]:
  """Every sweep directory the claims' groups read, in order of first mention."""
  return list(dict.fromkeys(s for c in claims for g in (c.a, c.b) for s in g.sweeps))


def load_sweeps(results: str, claims: Sequence[Claim]) -> dict:
  """``{sweep: [RunData]}`` of every sweep directory the claims name that exists."""
  out = {}
  for sweep in sweeps_read(claims):
    path = os.path.join(results, sweep)
    out[sweep] = load_runs(path) if os.path.isdir(path) else []
  return out


def load_failures(results: str, claims: Sequence[Claim]) -> dict:
  """``{sweep: [row]}``: the ``results.csv`` rows (``tables.result_row``) of the runs
  each sweep the claims name recorded as failed (e.g. ``'failed: FloatingPointError'``:
  a run stopped by a non-finite state; its checkpoints stay for a look)."""
  out = {}
  for sweep in sweeps_read(claims):
    path = os.path.join(results, sweep, "results.csv")
    if os.path.exists(path):
      with open(path, newline="") as f:
        out[sweep] = [r for r in csv.DictReader(f) if r["status"].startswith("failed")]
  return out


def failed_runs(group: Group, failures: dict, runs_by_sweep: dict) -> list[str]:
  """What the ledger says of the group's failed runs that no other cell of the group
  finished at their seed: method, setting, seed, status and the last round evaluated."""
  done = {r.seed for r in group_runs(runs_by_sweep, group)}
  out = []
  for sweep, method, setting in group.cells:
    for row in failures.get(sweep, []):
      seed = int(row["seed"])
      if (row["algorithm"], row["setting"]) != (method, setting) or seed in done:
        continue
      last = [r.rows[-1]["round"] for r in runs_by_sweep.get(sweep, [])
              if (r.method, r.setting, r.seed) == (method, setting, seed)]
      out.append(f"{method}, {setting}, seed {seed} ({row['status']}"
                 + (f"; its metrics end at round {last[0]}" if last else "") + ")")
  return out


# ----------------------------------------------------------------------------- the page


def side_labels(claim: Claim) -> tuple[str, str]:
  """What a figure's legend calls A and B: their methods, with their settings when both
  sides are one method (an ablation)."""
  a, b = claim.a, claim.b
  if a.method == b.method:
    return f"{a.method}, {a.setting}", f"{b.method}, {b.setting}"
  return a.method, b.method


def figure_title(claim: Claim) -> str:
  """The figure's title: the claim, then what is subtracted from what (a method's two
  settings when both sides are one method, e.g. an ablation)."""
  a, b = claim.a, claim.b
  if claim.test in ("gates", "fidelity"):
    return f"{claim.id}: {a.method}"
  if a.method == b.method:
    return f"{claim.id}: {a.method}\n{a.setting} minus {b.setting}"
  return f"{claim.id}: {a.method} minus {b.method}\n{a.setting}"


def figure_for(claim: Claim, runs_by_sweep: dict, out_dir: str) -> str | None:
  """The claim's figure (difference by round, or per-client differences), or None."""
  from fedjax_het.sweeps import plots  # noqa: PLC0415 - matplotlib only for the page
  from fedjax_het.sweeps.plan import slug  # noqa: PLC0415
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, f"{slug(claim.id)}.png")
  title = figure_title(claim)
  if claim.test == "fidelity":
    found = group_runs(runs_by_sweep, claim.a)
    if not found:
      return None
    return plots.plot_scatter([client_fidelity(r) for r in found],
                              [f"seed {r.seed}" for r in found],
                              "FILE fidelity of the client's type (final round)",
                              "client's final test accuracy", title, path)
  if claim.test == "gates":
    found = [read_gates(r) for r in group_runs(runs_by_sweep, claim.a)]
    found = [g for g in found if g is not None]
    if not found:
      return None
    return plots.plot_gates([a for a, _ in found[0]], f"{claim.a.method}, "
                            f"{claim.a.setting}, first seed", path)
  if claim.test == "target":
    a, b = group_runs(runs_by_sweep, claim.a), group_runs(runs_by_sweep, claim.b)
    if not a or not b:
      return None
    curves = dict(zip(side_labels(claim), (plots.mean_curve(a), plots.mean_curve(b))))
    return plots.plot_accuracy(curves, claim.a.setting, path, target=claim.target)
  if claim.test == "clients":
    a, b = group_runs(runs_by_sweep, claim.a), group_runs(runs_by_sweep, claim.b)
    if not a or not b:
      return None
    return plots.plot_client_diff(plots.client_diff(a, b), claim.a.method,
                                  claim.b.method, claim.a.setting, path)
  c = round_comparison(claim, runs_by_sweep)
  if c is None:
    return None
  return plots.plot_paired_rounds([c], title, path,
                                  marks=[t for t in claim.rounds if t <= c.rounds[-1]])


def _cell(r: Reading, claim: Claim) -> str:
  if claim.test == "target" and r.verdict == NOT_REACHED:
    return f"{int(np.isnan(r.diffs).sum())} of {len(r.diffs)} seeds did not reach it"
  unit = {"target": f"% of B's {claim.measure} saved",
          "gates": " points above chance", "fidelity": " (Spearman)"}.get(claim.test, "")
  return f"{paired.mean_se_text(r.mean, r.se)}{unit} (n={len(r.diffs)})"


def _trend(r: Reading) -> str:
  if r.trend is None:
    return "–"
  return (f"{r.trend.direction} ({paired.mean_se_text(r.trend.slope, r.trend.se)} "
          "/ 10 rounds)")


def window_lines(readings: Sequence[Reading]) -> list[str]:
  """A figure's text: each reading at its round and over the last third of its rounds."""
  return [f"Round {r.round}: {paired.mean_se_text(r.mean, r.se)}, {r.verdict}; over rounds "
          f"{r.trend.first}-{r.trend.last} (the last third), the mean difference "
          f"{paired.mean_se_text(r.trend.level, r.trend.level_se)}: {r.window}."
          for r in readings if r.window]


def summary_lines(rows: Sequence[tuple[Claim, list[Reading]]]) -> list[str]:
  """The page's opening sentences, from the readings."""
  read_rows = [(c, rs) for c, rs in rows if rs]
  last = [rs[-1].verdict for _, rs in read_rows]
  order = dict.fromkeys((*VERDICTS, NOT_REACHED, ONE_SEED, *last))  # any other one last
  counts = ", ".join(f"{last.count(v)} {v}" for v in order if last.count(v))
  lines = [f"{len(read_rows)} of {len(rows)} claims have finished runs"
           + (f"; at the longest budget read: {counts}." if counts else ".")]
  budgets: dict = {}  # one comparison's readings over its rows (its budgets)
  for c, rs in read_rows:
    budgets.setdefault(c.headline or c.id, []).extend(rs)
  for name, rs in budgets.items():
    if len(rs) > 1 and len({r.verdict for r in rs}) > 1:
      lines.append(f"{name}: the verdict changes with the budget: " + ", then ".join(
          f"{r.verdict} at round {r.round} ({paired.mean_se_text(r.mean, r.se)})"
          for r in rs) + ".")
  changed = [f"{c.id} at round {r.round}: {r.verdict} "
             f"({paired.mean_se_text(r.mean, r.se)}), over "
             f"rounds {r.trend.first}-{r.trend.last}: {r.window} "
             f"({paired.mean_se_text(r.trend.level, r.trend.level_se)})"
             for c, rs in read_rows for r in rs if r.window and r.window != r.verdict]
  if changed:
    lines.append("Read as the mean difference over the last third of the rounds rather "
                 "than at the round read, the verdict differs: " + "; ".join(changed) + ".")
  moving = [f"{c.id} ({rs[-1].trend.direction})" for c, rs in read_rows
            if rs[-1].trend is not None and rs[-1].trend.direction != "flat"]
  if moving:
    lines.append("Still moving at the last round read (slope beyond two standard "
                 "errors): " + ", ".join(moving) + ".")
  return lines


def render(claims: Sequence[Claim], runs_by_sweep: dict, *, page_path: str,
           figures_dir: str, results: str, command: str | None = None,
           notes: Sequence[tuple[str, str]] = (), about: str = "",
           failures: dict | None = None) -> str:
  """The ledger's Markdown page (figures written into ``figures_dir``).

  ``notes``: ``(claim, why it has no row yet)`` for claims the ledger does not test;
  ``about``: the runs' common setting, said once under the summary; ``failures``:
  ``load_failures``'s rows, named in the summary and under the claims that lack them.
  """
  page_dir = os.path.dirname(os.path.abspath(page_path))
  rows = [(c, read(c, runs_by_sweep)) for c in claims]
  failed = {c.id: [t for g in (c.a, c.b) for t in failed_runs(g, failures or {},
                                                               runs_by_sweep)]
            for c in claims}
  failed_text = {cid: "Failed, so not read: " + "; ".join(ts) + "."
                 for cid, ts in failed.items() if ts}
  lines = ["# Claims ledger", "",
           "<!-- Generated by experiments/claims_page.py from the runs under "
           f"{results}; do not edit by hand. -->", "", *summary_lines(rows),
           *(["Runs that failed are left out of their claims' pairs: "
              + "; ".join(f"{cid}: {'; '.join(failed[cid])}" for cid in failed_text) + "."]
             if failed_text else []), "",
           *([about, ""] if about else []),
           "| claim | paper | we ran | round | A − B, points | going | verdict |",
           "|---|---|---|---:|---:|---|---|"]
  figures = []
  for c, readings in rows:
    fig = figure_for(c, runs_by_sweep, figures_dir) if readings else None
    name = f"[{c.id}](#{plots_anchor(c.id)})" if fig else c.id
    paper = c.paper + ("" if c.paper_points is None else f" ({c.paper_points:+.2f})")
    what = (f"{c.a.method}, {c.ran}" if c.test in ("gates", "fidelity")
            else f"{c.a.method} − {c.b.method}, {c.ran}")
    if not readings:
      lines.append(f"| {c.id} | {paper} | {what} | – | runs not finished | – | pending |")
      continue
    for i, r in enumerate(readings):
      lines.append(f"| {name if i == 0 else ''} | {paper if i == 0 else ''} | "
                   f"{what if i == 0 else ''} | {r.round} | {_cell(r, c)} | {_trend(r)} | "
                   f"{r.verdict} |")
    if fig:
      figures.append((c, os.path.relpath(fig, page_dir),
                      window_lines(readings) + ([failed_text[c.id]] if c.id in failed_text
                                                else [])))
  lines += ["", "A − B: the mean over seeds of the per-seed difference (same seed: same "
            "partition), ± its standard error; `clients`: the share of clients on which A "
            "beats B at the final round, minus 50%; `to target`: what A saves, in % of "
            "B's cost, to first reach the target accuracy (the round shown is the runs' "
            "last); `gates`: the share of the gate weights' variance that the clients "
            "(or a client's classes) explain, minus the share chance would; "
            "`fidelity`: Spearman's correlation of clients' accuracy with their type's "
            "fidelity. Going: the slope of the per-round "
            "difference over the last third of the rounds read, beyond two standard "
            "errors; each figure's text also gives the mean difference over that last "
            "third and its verdict. Verdicts: `reproduced`, the paper's sign beyond two "
            "standard errors and at least half its size (for a claim of no difference: within two "
            "standard errors of zero); `same direction, smaller`, under half; `not "
            "seen`, within two standard errors of zero; `opposite`, the other sign "
            "beyond them; `differs`, a claim of no difference with a difference beyond "
            "them.", ""]
  if notes:
    lines += ["## Not tested yet", ""] + [f"- **{cid}**: {why}" for cid, why in notes]
    lines.append("")
  lines += ["## Figures", ""]
  for c, rel, windows in figures:
    lines += [f"### {c.id}", "", f"{c.paper}. We ran: {c.ran}.", "",
              *([" ".join(windows), ""] if windows else []), f"![{c.id}]({rel})", ""]
  sweeps = list(dict.fromkeys(f for c in claims for f in c.sweep_files))
  lines += ["## Commands", "",
            "`--seed_batch=3` runs a cell's three seeds as one program, which fills an "
            "accelerator. On a CPU leave it out: the seeds then run one after another "
            "in about the same time and less memory (FedMRL's N=100 cell on the "
            "2-core machine, 24 rounds: two seeds together peaked at 11.3 GiB, one seed "
            "alone at 5.2 GiB; docs/performance.md).", "", "```sh"]
  lines += [f"python experiments/sweep.py --sweep={f} --sweep_dir=" + os.path.join(
      results, *(["claims"] if "/claims/" in f else []),
      os.path.splitext(os.path.basename(f))[0]) + " --seed_batch=3 --budget_min=60"
      for f in sweeps]
  if command:
    lines.append(command)
  lines += ["```", ""]
  return "\n".join(lines)


def plots_anchor(claim_id: str) -> str:
  """The Markdown anchor of a claim's figure heading (GitHub's rule)."""
  return "".join(ch for ch in claim_id.lower().replace(" ", "-")
                 if ch.isalnum() or ch in "-_")
