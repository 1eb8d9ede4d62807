"""Planning a sweep: the runs of its grid (algorithms x settings x seeds), finished or not.

A sweep file's ``get_config()`` returns a ConfigDict with

- ``algorithms``: experiment config files (``experiments/fedmrl.py``, optionally with a
  ``:variant``) or algorithm names (``fedmrl`` = ``<configs_dir>/fedmrl.py``, the folder
  the caller names: ``experiments/`` for ``experiments/sweep.py``); the file's stem
  names the table row;
- ``settings``: table columns, ``{name: {dotted key: value}}`` (nested dicts are
  flattened); build it with ``ConfigDict(..., allow_dotted_keys=True, sort_keys=False)``
  to keep dotted keys and the column order;
- ``seeds``: the seeds of every cell;
- optional ``base_overrides`` (applied to every run), ``algorithm_overrides``
  (``{row name: overrides}``) and ``variant`` (e.g. ``'smoke'``, for every config file).

``select`` cuts a sweep to some of its rows and columns (``--sweep.algorithms=a,b``,
``--sweep.settings=s,t`` on ``experiments/sweep.py``'s command line).

Every run lives in ``<sweep_dir>/<algorithm>/<setting slug>/seed<k>/``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Callable, Iterable, Sequence

import ml_collections

from fedjax_het import config as config_lib
from fedjax_het import validation
from fedjax_het.config_files import flatten
from fedjax_het.config_files import load_config_file
from fedjax_het.training.runfiles import comparable


@dataclasses.dataclass(frozen=True)
class Run:
  """One cell entry of the grid.

  Attributes:
    algorithm: the row name (config file stem).
    setting: the column name.
    seed: the seed.
    config: the full experiment config.
    workdir: ``<sweep_dir>/<algorithm>/<setting slug>/seed<seed>``.
  """
  algorithm: str
  setting: str
  seed: int
  config: ml_collections.ConfigDict
  workdir: str


def resolve_algorithm(entry: str, default_variant: str | None = None,
                      configs_dir: str | None = None):
  """``(row name, config file, variant)`` of an ``algorithms`` entry.

  ``'fedmrl'`` -> ``('fedmrl', '<configs_dir>/fedmrl.py', default_variant)`` (config
  file None without a ``configs_dir``); ``'path/x.py:smoke'`` -> ``('x', 'path/x.py',
  'smoke')``.
  """
  path, _, arg = entry.partition(":")
  name = os.path.splitext(os.path.basename(path))[0]
  if not path.endswith(".py"):
    path = os.path.join(configs_dir, f"{path}.py") if configs_dir else None
  return name, path, arg or default_variant


def named_overrides(spec) -> list[tuple[str, dict]]:
  """``[(name, dotted overrides)]`` from a mapping or a list of ``(name, overrides)``."""
  if spec is None:
    return []
  items = spec.items() if hasattr(spec, "items") else spec
  return [(str(name), flatten(values or {})) for name, values in items]


def slug(name: str) -> str:
  """A directory name for a setting: ``'N=10,C=100%'`` -> ``'n10_c100pct'``."""
  s = name.lower().replace("%", "pct").replace("=", "")
  s = re.sub(r"[^a-z0-9.+-]+", "_", s).strip("_.")
  return s or "default"


def _unique(names: Iterable[str], what: str) -> None:
  names = list(names)
  dup = sorted({n for n in names if names.count(n) > 1})
  if dup:
    raise ValueError(f"sweep: {what} {dup} appear more than once; rename them")


def _algorithms(sweep: ml_collections.ConfigDict, configs_dir: str | None) -> list:
  """The sweep's ``(row name, config file, variant)``; a name without a file is an error."""
  variant = sweep.get("variant") or None
  algorithms = [resolve_algorithm(e, variant, configs_dir) for e in sweep.algorithms]
  bare = [name for name, path, _ in algorithms if path is None]
  if bare:
    raise ValueError(f"sweep: the algorithms {bare} name no config file; pass configs_dir "
                     "(the folder of their config files, experiments/) or give paths")
  return algorithms


def plan(sweep: ml_collections.ConfigDict, sweep_dir: str, *,
         configs_dir: str | None = None) -> list[Run]:
  """Every run of a sweep (settings, then seeds, then algorithms), each config validated.

  The order fills every row of the table for seed 0 first, so a partial sweep already
  compares all methods. Every algorithm of a (setting, seed) cell gets the same clients:
  the largest ``data.public`` of the cell (Moss's public set) is held out of the pool
  for all of them, so Moss's row is a paired comparison with the others.

  Args:
    sweep: the sweep config (see the module docstring).
    sweep_dir: the directory the runs' workdirs go under.
    configs_dir: where an algorithm given by name has its config file
      (``<configs_dir>/<name>.py``).
  """
  algorithms = _algorithms(sweep, configs_dir)
  settings = named_overrides(sweep.settings)
  per_algorithm = dict(named_overrides(sweep.get("algorithm_overrides")))
  base = flatten(sweep.get("base_overrides") or {})
  if not algorithms or not settings or not sweep.seeds:
    raise ValueError("sweep: algorithms, settings and seeds must each be non-empty")
  _unique([a[0] for a in algorithms], "algorithm names")
  _unique([slug(s) for s, _ in settings], "setting slugs")
  unknown = sorted(set(per_algorithm) - {a[0] for a in algorithms})
  if unknown:
    raise ValueError(f"sweep.algorithm_overrides names {unknown}, which are not among the "
                     f"algorithms {[a[0] for a in algorithms]}")
  runs = []
  for setting, overrides in settings:
    for seed in sweep.seeds:
      cell = []
      for name, path, arg in algorithms:
        c = load_config_file(path, arg)
        config_lib.override(c, {**base, **per_algorithm.get(name, {}), **overrides,
                                "seed": int(seed)})
        cell.append((name, c))
      public = max(c.data.public for _, c in cell)
      for name, c in cell:
        c.data.public = public
        validation.validate(c)
        workdir = os.path.join(sweep_dir, name, slug(setting), f"seed{seed}")
        runs.append(Run(name, setting, int(seed), c, workdir))
  return runs


def split_names(text: str, names: Iterable[str]) -> list[str]:
  """A comma-separated list of names, some of which may hold commas themselves:
  ``'N=10,C=100%,x'`` with ``names`` holding ``'N=10,C=100%'`` is that name, then
  ``'x'`` (the longest run of pieces that is one of ``names``; else one piece)."""
  known, pieces, out, i = set(names), text.split(","), [], 0
  while i < len(pieces):
    j = next((j for j in range(len(pieces), i, -1) if ",".join(pieces[i:j]) in known),
             i + 1)
    out.append(",".join(pieces[i:j]).strip())
    i = j
  return [name for name in out if name]


def select(sweep: ml_collections.ConfigDict, *,
           algorithms: str | Sequence[str] | None = None,
           settings: str | Sequence[str] | None = None, configs_dir: str | None = None,
           log: Callable[[str], None] = print) -> ml_collections.ConfigDict:
  """``sweep`` cut to some of its rows (``algorithms``) and columns (``settings``).

  Args:
    sweep: the sweep config (module docstring); left as it is.
    algorithms: row names (or entries) of ``sweep.algorithms``, kept in the sweep's
      order, then any other algorithm given by name or config file (``plan``'s entries),
      added; a string is a comma-separated list; None keeps every row.
      ``algorithm_overrides`` of the rows left out are dropped, with a ``log`` line
      that names them; each setting keeps the public set ``plan`` holds out of its pool
      for all the sweep's rows (Moss's), so a kept row's runs are the sweep file's.
    settings: names (or slugs) of ``sweep.settings``, kept in the sweep's order; a
      string is a comma-separated list (``split_names``: a name may hold commas); None
      keeps every column.
    configs_dir: where an algorithm given by name has its config file.
    log: where the line about dropped overrides goes.

  Raises:
    ValueError: an empty list, a setting that is not the sweep's, or an algorithm that
      is neither the sweep's nor a config file (the valid names are listed).
  """
  out = _copy(sweep)
  named = named_overrides(sweep.settings)
  keep = [n for n, _ in named]
  if isinstance(algorithms, str):
    algorithms = split_names(algorithms, ())
  if algorithms is not None:
    out.algorithms = _selected_algorithms(sweep, algorithms, configs_dir)
    rows = [resolve_algorithm(e, None, configs_dir)[0] for e in out.algorithms]
    overrides = named_overrides(sweep.get("algorithm_overrides"))
    dropped = [name for name, _ in overrides if name not in rows]
    if dropped:
      log(f"sweep: the algorithm_overrides of {', '.join(dropped)} dropped: not among "
          f"the algorithms selected ({', '.join(rows)})")
      out.algorithm_overrides = ml_collections.ConfigDict(
          {n: v for n, v in overrides if n in rows}, allow_dotted_keys=True,
          sort_keys=False)
  if settings is not None:
    by_name = {**{slug(n): n for n, _ in named}, **{n: n for n, _ in named}}
    if isinstance(settings, str):
      settings = split_names(settings, by_name)
    unknown = [s for s in settings if s not in by_name]
    if unknown or not settings:
      raise ValueError(f"sweep.settings: {_no_such(unknown, 'setting')}; the sweep's "
                       f"settings are {[n for n, _ in named]} (or their slugs "
                       f"{[slug(n) for n, _ in named]})")
    keep = [n for n in keep if n in {by_name[s] for s in settings}]
  # a cell's clients stay the sweep file's: the public set of its left-out rows too
  public = {} if algorithms is None else _public_sets(sweep, configs_dir)
  out.settings = ml_collections.ConfigDict(
      {n: {**v, **({"data.public": public[n]} if public.get(n) else {})}
       for n, v in named if n in keep}, allow_dotted_keys=True, sort_keys=False)
  return out


def _copy(sweep: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A new, unlocked sweep config holding ``sweep``'s fields (not copies of them)."""
  out = ml_collections.ConfigDict(sort_keys=False)
  for key in sweep.keys():
    out[key] = sweep[key]
  return out


def _public_sets(sweep: ml_collections.ConfigDict, configs_dir: str | None) -> dict:
  """``{setting: data.public}``: what ``plan`` holds out of each setting's pool."""
  first = _copy(sweep)
  first.seeds = tuple(sweep.seeds)[:1]
  return {r.setting: r.config.data.public for r in plan(first, "", configs_dir=configs_dir)}


def _selected_algorithms(sweep: ml_collections.ConfigDict, names: Sequence[str],
                         configs_dir: str | None) -> list[str]:
  """``select``'s rows: the sweep's entries named, in its order, then new entries."""
  entries = list(sweep.algorithms)
  rows = [resolve_algorithm(e, None, configs_dir)[0] for e in entries]
  kept = [e for e, row in zip(entries, rows) if row in names or e in names]
  new = [n for n in names if n not in rows and n not in entries]
  files = [resolve_algorithm(n, None, configs_dir)[1] for n in new]
  missing = [n for n, path in zip(new, files) if not path or not os.path.exists(path)]
  if missing or not names:
    raise ValueError(f"sweep.algorithms: {_no_such(missing, 'algorithm')}; the sweep's "
                     f"algorithms are {rows} (another needs a config file: a name in "
                     f"{configs_dir or 'the configs folder'} or a path)")
  return kept + list(dict.fromkeys(new))


def _no_such(names: Sequence[str], what: str) -> str:
  return (f"no {what} named {', '.join(map(repr, names))}" if names
          else f"no {what} given")


def finished_summary(run: Run) -> dict | None:
  """The run's ``summary.json`` if it completed ``num_rounds`` with the same config."""
  path = os.path.join(run.workdir, "summary.json")
  if not os.path.exists(path):
    return None
  with open(path) as f:
    summary = json.load(f)
  as_saved = lambda config: comparable(json.loads(json.dumps(config)))  # tuples: lists
  resolved = as_saved(validation.with_algo_defaults(run.config).to_dict())
  saved = as_saved(summary.get("config", {}))
  defaults = validation.flat_defaults(run.config.algorithm)
  saved = {**{k: defaults[k] for k in resolved if k not in saved and k in defaults}, **saved}
  if summary.get("rounds_completed") != run.config.num_rounds or saved != resolved:
    return None  # loop.run resumes it, or refuses a different config with a clear error
  return summary
