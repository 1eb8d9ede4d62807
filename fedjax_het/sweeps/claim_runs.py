"""The runs a claim of the ledger reads, and what they measure, seed by seed.

A group's finished runs (``group_runs``: one per seed, from every cell it reads); per
test (``claims``' docstring) the per-seed values: A minus B round by round
(``round_comparison``), the share of clients on which A beats B (``client_shares``), the
cost saved to a target (``target_savings``), the gate weights' variance beyond chance
(``gate_excess``) and the fidelity-accuracy correlation (``fidelity_correlation``),
``per_seed`` picking one by the claim's test; and the sweeps the ledger reads
(``load_sweeps``) with the runs they recorded as failed (``load_failures``,
``failed_runs``).
"""
from __future__ import annotations

import csv
import math
import os
from typing import Sequence

import numpy as np

from fedjax_het.sweeps import paired
from fedjax_het.sweeps.claims import Claim
from fedjax_het.sweeps.claims import Group
from fedjax_het.sweeps.gates import read_gates
from fedjax_het.sweeps.rundirs import RunData
from fedjax_het.sweeps.rundirs import load_runs
from fedjax_het.sweeps.rundirs import read_json
from fedjax_het.sweeps.stats import excess_eta_squared
from fedjax_het.sweeps.stats import first_reach
from fedjax_het.sweeps.stats import spearman

TIMINGS = frozenset({"wall_s"})  # metric keys that differ between copies of a run


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
  i = first_reach([r["mean_test_acc"] for r in rows], target)
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
