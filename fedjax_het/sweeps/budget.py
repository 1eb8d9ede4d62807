"""A sweep's cost before it runs: FLOPs and estimated time of each run, and what fits.

``plan_budget`` prints, before a sweep (or the campaign) starts, one line per batch of
runs still to do: its FLOPs (``training.estimate.run_cost``, from XLA's cost analysis of
the algorithm's client step), its estimated time from a short calibration
(``training.estimate.calibrate`` of the first batch still to do, as it will run, its
seeds on the replica axis: the program that batch compiles anyway, so the persistent
compilation cache makes the calibration's compile its own), the cumulative time, and
whether it fits the budget.

Costs are computed once per (algorithm, setting) cell, on its first seed (the seeds of
a cell cost the same up to their partitions), and kept in ``<sweep_dir>/costs.json`` so
a resumed sweep does not compute them again.
"""
from __future__ import annotations

import json
import os
from typing import Callable, NamedTuple, Sequence

from fedjax_het.training import estimate
from fedjax_het.training import experiment
from fedjax_het.training import metrics as metrics_lib

COSTS_FILE = "costs.json"


class Line(NamedTuple):
  """One batch of the plan: its runs (positions), FLOPs, estimated and cumulative s."""
  positions: tuple
  flops: float
  seconds: float
  cumulative: float
  fits: bool


def cell_key(run) -> str:
  return f"{run.algorithm}|{run.setting}"


def _saved(sweep_dir: str) -> dict:
  """``costs.json``'s cells of known FLOPs: a cell saved with 0 (written on a GPU before
  ``estimate`` lowered for the CPU) is left out, so it is computed again."""
  path = os.path.join(sweep_dir, COSTS_FILE)
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return {key: cost for key, cost in json.load(f).items()
            if cost.get("total_flops", 0) > 0}


def _comparable(run) -> dict:
  config = run.config.to_dict()
  config.pop("seed", None)
  return json.loads(json.dumps(config))


def saved_costs(runs: Sequence, sweep_dir: str) -> dict:
  """``{(algorithm, setting): cost}`` of the runs' cells that ``<sweep_dir>/costs.json``
  holds with the same config (nothing is computed)."""
  saved = _saved(sweep_dir)
  return {(run.algorithm, run.setting): saved[cell_key(run)] for run in runs
          if cell_key(run) in saved
          and saved[cell_key(run)].get("config") == _comparable(run)}


def cell_costs(runs: Sequence, positions: Sequence[int], sweep_dir: str,
               log: Callable[[str], None] = print) -> dict:
  """``{cell key: {'total_flops', 'round_flops', 'num_rounds'}}`` of the runs' cells.

  Read from ``<sweep_dir>/costs.json`` where a cell's config is unchanged; the others
  are computed (``estimate.run_cost``) and the file rewritten.
  """
  path = os.path.join(sweep_dir, COSTS_FILE)
  saved = _saved(sweep_dir)
  out = {}
  for i in positions:
    run, key = runs[i], cell_key(runs[i])
    config = _comparable(run)
    if key in out:
      continue
    if key in saved and saved[key].get("config") == config:
      out[key] = saved[key]
      continue
    exp = experiment.prepare(run.config, place=False)
    cost = estimate.run_cost(exp)
    out[key] = {"total_flops": cost.total_flops, "round_flops": cost.round_flops,
                "num_rounds": cost.num_rounds, "config": config}
    log(f"cost of {run.algorithm} | {run.setting}: {estimate.format_flops(cost.total_flops)}")
  metrics_lib.write_json(path, {**saved, **out})
  return out


def plan_budget(runs: Sequence, batches: Sequence[Sequence[int]], costs: dict,
                calibration: estimate.Calibration,
                budget_s: float | None) -> list[Line]:
  """Estimated time of each batch in order, and which fit ``budget_s`` (None: all).

  A batch of S seeds is estimated as S runs at the calibration's FLOP/s (that of the
  first batch, all its seeds counted), plus one compilation per batch.
  """
  lines, total = [], 0.0
  for positions in batches:
    c = costs[cell_key(runs[positions[0]])]
    flops = c["total_flops"] * len(positions)
    seconds = calibration.compile_s + flops / max(calibration.flops_per_s, 1e-9)
    total += seconds
    lines.append(Line(tuple(positions), flops, seconds, total,
                      budget_s is None or total <= budget_s))
  return lines


def format_plan(runs: Sequence, lines: Sequence[Line], calibration: estimate.Calibration,
                budget_s: float | None) -> list[str]:
  """The plan as printed lines: the calibration, one line per batch, what fits."""
  fmt = metrics_lib.format_s
  out = [f"calibration: compile {fmt(calibration.compile_s)}, {calibration.round_s:.2f} s "
         f"per round, {calibration.flops_per_s / 1e12:.3f} TFLOP/s achieved"]
  for line in lines:
    first = runs[line.positions[0]]
    seeds = ",".join(str(runs[i].seed) for i in line.positions)
    mark = "" if line.fits else "  (after the budget: next call)"
    out.append(f"  {first.algorithm} | {first.setting} | seed{'s' * (len(line.positions) > 1)}"
               f" {seeds}: {estimate.format_flops(line.flops)}, about {fmt(line.seconds)} "
               f"(total {fmt(line.cumulative)}){mark}")
  fitting = sum(len(line.positions) for line in lines if line.fits)
  total = sum(len(line.positions) for line in lines)
  budget = "no budget" if budget_s is None else f"budget {fmt(budget_s)}"
  out.append(f"plan: {fitting} of {total} runs fit ({budget}); estimated "
             f"{fmt(lines[-1].cumulative if lines else 0.0)} for all")
  return out
