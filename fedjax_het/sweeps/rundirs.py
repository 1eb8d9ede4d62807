"""Reading run directories: a workdir's metrics, summary and place in a sweep's grid.

A sweep directory holds ``<algorithm>/<setting slug>/seed<k>/`` workdirs and a
``sweep.json`` naming the settings (``fedjax_het.sweeps.runner``); any other directory
of runs works too, each directory with a ``metrics.jsonl`` being one run. The figures
(``plots``) and the paired comparisons (``paired``) read runs through here; nothing
here needs matplotlib.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re

from fedjax_het.training import metrics as metrics_lib

SEED_DIR = re.compile(r"^seed(\d+)$")


@dataclasses.dataclass(frozen=True)
class RunData:
  """What the reports need from one workdir.

  Attributes:
    name: path relative to ``--runs`` (``'.'`` replaced by the algorithm).
    method: the line / row name: the sweep's algorithm directory, else ``name``.
    setting: the sweep's setting name ('' outside a sweep).
    seed: the config's seed.
    algorithm: the config's algorithm.
    workdir: the directory.
    rows: ``metrics.jsonl`` rows.
    per_client: final per-client test accuracy (``summary.json``), or None.
  """
  name: str
  method: str
  setting: str
  seed: int
  algorithm: str
  workdir: str
  rows: tuple
  per_client: tuple | None

# ----------------------------------------------------------------------------- reading


def read_json(path: str):
  """The parsed JSON file."""
  with open(path) as f:
    return json.load(f)


def find_workdirs(root: str) -> list[str]:
  """Directories under ``root`` (itself included) holding a ``metrics.jsonl``, sorted."""
  found = []
  for dirpath, dirnames, filenames in os.walk(root):
    dirnames[:] = sorted(d for d in dirnames if d not in ("checkpoints", "tb"))
    if "metrics.jsonl" in filenames:
      found.append(dirpath)
  return sorted(found)


def sweep_record(root: str) -> dict:
  """A sweep directory's ``sweep.json`` (empty outside a sweep)."""
  path = os.path.join(root, "sweep.json")
  return read_json(path) if os.path.exists(path) else {}


def load_run(workdir: str, root: str, names: dict) -> RunData:
  """A workdir's metrics, summary and place in the grid."""
  config = read_json(os.path.join(workdir, "config.json"))
  rel = os.path.relpath(workdir, root)
  name = config["algorithm"] if rel == "." else rel
  parts = rel.split(os.sep)
  if len(parts) == 3 and SEED_DIR.match(parts[2]):
    method, setting = parts[0], names.get(parts[1], parts[1])
  else:
    method, setting = name, ""
  summary_path = os.path.join(workdir, "summary.json")
  per_client = (tuple(read_json(summary_path)["per_client_test_acc"])
                if os.path.exists(summary_path) else None)
  rows = tuple(metrics_lib.read_jsonl(os.path.join(workdir, "metrics.jsonl")))
  return RunData(name, method, setting, int(config["seed"]), config["algorithm"], workdir,
                 rows, per_client)


def load_runs(root: str) -> list[RunData]:
  """Every run under ``root`` that evaluated at least once, in the sweep's run order
  (methods and settings as in the sweep's table) or else in path order."""
  record = sweep_record(root)
  names = {v: k for k, v in record.get("settings", {}).items()}
  order = {r["workdir"]: i for i, r in enumerate(record.get("runs", []))}
  dirs = sorted(find_workdirs(root), key=lambda d: (
      order.get(os.path.relpath(d, root), len(order)), d))
  runs = [load_run(d, root, names) for d in dirs]
  return [r for r in runs if r.rows]
