r"""The campaign: the speed comparison and the papers' CIFAR-10 column, in a time budget.

One command measures what the library is for (issue "Speed for the papers' protocol"),
in this order, writing small result files as it goes:

1. ``benchmarks/compare.py`` for FedAvg, FedMRL and FedMoE (ours-auto, the per-client
   ``jax.jit`` loop, the per-client PyTorch loop where torch is installed), its table in
   ``<results>/<name>/compare.txt``;
2. the sweep of the size (``paper``: the CIFAR-10 column of
   ``experiments/sweeps/paper_table.py``, N=10/50/100 under the papers' protocol) into
   ``<results>/<name>/``: Standalone, FedMRL and FedMoE first, then the other methods,
   then the other seeds (with ``seed_batch`` > 1 the seeds of a cell run together on a
   replica axis). Before it starts it prints each run's FLOPs, its estimated time from a
   calibration and the plan that fits the budget.

Every step resumes: a finished comparison is not run again, finished runs are skipped,
and the run in progress when the budget ends checkpoints and continues at the next
call. The run directories keep ``metrics.jsonl``, ``summary.json``, ``config.json`` and
``partition.json`` (small, committed) beside their ``checkpoints/`` (git-ignored), so
docs/results.md is regenerated from committed runs wherever they were made
(``experiments/results_page.py --sweep_dir=results/<name>``). Each call appends a line
to ``<results>/<name>/campaign.jsonl`` (device, budget, what it did).

  python benchmarks/campaign.py --size=tiny --results=/tmp/results    # CPU, about a minute
  python benchmarks/campaign.py --size=cpu                            # 2-core CPU, hours
  python benchmarks/campaign.py --size=paper --budget_min=25          # one GPU
  python benchmarks/campaign.py --size=paper --compute_dtype=bfloat16  # bf16, its own dir

``--compute_dtype=bfloat16`` runs both steps in bf16 (``runtime.compute_dtype`` of
every run, ``compare.py --dtype``) into ``<results>/<name>_bf16``, so float32 and bf16
runs never share a table. The default stays float32: on CPU bf16 kept accuracy within
the issue's 1 point (FedMoE -0.3, FedMRL -0.5 +- 0.2 points over 10 seeds,
docs/performance.md), but FedMRL's half point is a real cost, as large as some of the
gaps the papers report between methods, and the other methods are unchecked.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import time
from typing import Callable

import jax
import ml_collections

from fedjax_het.config_files import flatten
from fedjax_het.config_files import load_config_file
from fedjax_het.sweeps import plan as plan_lib
from fedjax_het.sweeps import runner
from fedjax_het.sweeps import tables
from fedjax_het.training import metrics as metrics_lib

# The methods the papers are about come first, then the baselines, then other seeds.
FIRST = ("standalone", "fedmrl", "fedmoe")


@dataclasses.dataclass(frozen=True)
class Size:
  """A preset of ``--size``.

  Attributes:
    name: the results directory ``<results>/<name>``.
    compare_args: ``benchmarks/compare.py`` arguments.
    sweep_file: the sweep (under ``<repo_dir>/experiments/sweeps/``).
    settings_prefix: keep only the sweep's settings whose name starts with this.
    seeds: the seeds of every cell (None: the sweep file's).
    seed_batch: seeds run together (None: ``default_seed_batch``).
  """
  name: str
  compare_args: tuple
  sweep_file: str
  settings_prefix: str = ""
  seeds: tuple | None = None
  seed_batch: int | None = None


SIZES = {
    "paper": Size("paper_cifar10", ("--size=paper",), "paper_table.py", "CIFAR-10 "),
    "cpu": Size("paper_cpu", ("--size=small", "--torch_threads=1"), "paper_cpu.py",
                seeds=(0, 1, 2)),
    # both seeds on the replica axis even on CPU, so CI runs that path
    "tiny": Size("campaign_tiny", ("--size=tiny", "--repeats=1"), "tiny.py", seed_batch=2),
}
COMPARE_ALGORITHMS = "fedavg,fedmrl,fedmoe"
COMPUTE_DTYPES = ("float32", "bfloat16")


def results_name(size: Size, compute_dtype: str) -> str:
  """``<results>/<name>``'s name: the size's, ``_bf16`` appended for bf16 runs."""
  return size.name + ("_bf16" if compute_dtype == "bfloat16" else "")


def experiments_dir(repo_dir: str) -> str:
  """``<repo_dir>/experiments``: the sweep files' and the algorithms' config files."""
  return os.path.join(repo_dir, "experiments")


def sweep_config(size: Size, compute_dtype: str = "float32", *,
                 repo_dir: str) -> ml_collections.ConfigDict:
  """The size's sweep (in the source tree ``repo_dir``), its settings and seeds cut as
  the size says, every run computing in ``compute_dtype``."""
  sweep = load_config_file(os.path.join(experiments_dir(repo_dir), "sweeps",
                                        size.sweep_file))
  settings = plan_lib.named_overrides(sweep.settings)
  kept = {name: values for name, values in settings if name.startswith(size.settings_prefix)}
  sweep.settings = ml_collections.ConfigDict(kept, allow_dotted_keys=True, sort_keys=False)
  if size.seeds is not None:
    sweep.seeds = tuple(size.seeds)
  if compute_dtype != "float32":
    base = flatten(sweep.get("base_overrides") or {})
    base["runtime.compute_dtype"] = compute_dtype
    sweep.base_overrides = ml_collections.ConfigDict(base, allow_dotted_keys=True)
  return sweep


def priority(sweep: ml_collections.ConfigDict) -> Callable:
  """Sort key of runs: seed 0 of FIRST's methods, then of the others, then later seeds.

  Within each part, by setting (the sweep's order), then by method.
  """
  settings = [name for name, _ in plan_lib.named_overrides(sweep.settings)]
  algorithms = [plan_lib.resolve_algorithm(a)[0] for a in sweep.algorithms]
  min_seed = min(sweep.seeds)

  def key(run):
    return (run.seed != min_seed, run.algorithm not in FIRST, run.seed,
            settings.index(run.setting), algorithms.index(run.algorithm))
  return key


def compare_command(size: Size, compute_dtype: str = "float32", *,
                    repo_dir: str) -> list[str]:
  """``<repo_dir>/benchmarks/compare.py`` for FedAvg/FedMRL/FedMoE: ours-auto, jit loop,
  torch."""
  impls = "ours-auto,jit-per-client"
  if importlib.util.find_spec("torch") is not None:
    impls += ",torch"
  return [sys.executable, os.path.join(repo_dir, "benchmarks", "compare.py"),
          *size.compare_args, f"--algorithms={COMPARE_ALGORITHMS}", f"--impls={impls}",
          f"--dtype={compute_dtype}"]


def run_compare(size: Size, out_dir: str, deadline: float,
                log: Callable[[str], None], compute_dtype: str = "float32", *,
                repo_dir: str) -> str:
  """Step 1: the comparison table into ``compare.txt`` (skipped when already there).

  Returns:
    ``'done earlier'``, ``'done'``, or ``'stopped at the budget'`` (rerun to finish).
  """
  path = os.path.join(out_dir, "compare.txt")
  if os.path.exists(path):
    log(f"campaign: compare.py done earlier ({path})")
    return "done earlier"
  command = compare_command(size, compute_dtype, repo_dir=repo_dir)
  log(f"campaign: {' '.join(os.path.relpath(c) if c.endswith('.py') else c for c in command)}")
  try:
    out = subprocess.run(command, stdout=subprocess.PIPE, text=True, check=True,
                         timeout=max(deadline - time.time(), 1.0))
  except subprocess.TimeoutExpired:
    log("campaign: compare.py did not finish within the budget; rerun to continue")
    return "stopped at the budget"
  tables.write_text(path, out.stdout)
  log(out.stdout.rstrip())
  return "done"


def default_seed_batch() -> int:
  """Seeds run together: 3 on accelerators (small runs do not fill one), 1 on CPU."""
  return 1 if jax.default_backend() == "cpu" else 3


def run_campaign(size_name: str, *, results_dir: str, budget_s: float,
                 seed_batch: int | None = None, compare: bool = True,
                 compute_dtype: str = "float32",
                 log: Callable[[str], None] = print, repo_dir: str) -> dict:
  """Runs the campaign of ``size_name`` for at most about ``budget_s`` seconds.

  ``compute_dtype``: every run's and the comparison's compute dtype (``float32`` or
  ``bfloat16``; bf16 results go to their own directory, ``results_name``).
  ``repo_dir``: the source tree (its ``experiments/`` and ``benchmarks/compare.py``).

  Returns:
    What this call did: ``{'compare', 'runs_done', 'runs_total', 'rows'}``.
  """
  if size_name not in SIZES:
    raise ValueError(f"--size={size_name!r}; valid: {sorted(SIZES)}")
  if budget_s <= 0:
    raise ValueError(f"the budget must be positive, got {budget_s} s")
  if compute_dtype not in COMPUTE_DTYPES:
    raise ValueError(f"compute_dtype={compute_dtype!r}; valid: {list(COMPUTE_DTYPES)}")
  size = SIZES[size_name]
  if seed_batch is None:
    seed_batch = size.seed_batch or default_seed_batch()
  t0 = time.time()
  deadline = t0 + budget_s
  out_dir = os.path.join(results_dir, results_name(size, compute_dtype))
  os.makedirs(out_dir, exist_ok=True)
  sweep = sweep_config(size, compute_dtype, repo_dir=repo_dir)
  configs_dir = experiments_dir(repo_dir)
  # validates every config before anything runs
  runs = plan_lib.plan(sweep, out_dir, configs_dir=configs_dir)
  log(f"campaign {size_name}: budget {metrics_lib.format_s(budget_s)}, {len(runs)} runs "
      f"-> {out_dir}; {jax.device_count()} x {jax.devices()[0].device_kind}, seeds "
      f"{seed_batch} at a time, compute in {compute_dtype}")
  compared = (run_compare(size, out_dir, deadline, log, compute_dtype, repo_dir=repo_dir)
              if compare else "skipped")
  rows = []
  if time.time() < deadline:
    rows = runner.run_sweep(sweep, out_dir, log=log, seed_batch=seed_batch,
                            order=priority(sweep), deadline=deadline, estimate_first=True,
                            command=f"python benchmarks/campaign.py --size={size_name}"
                            + (f" --compute_dtype={compute_dtype}"
                               if compute_dtype != "float32" else ""),
                            configs_dir=configs_dir)
  done = sum(r["status"] == "done" for r in rows)
  record = {"size": size_name, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z",
                                                        time.localtime(t0)),
            "seconds": round(time.time() - t0, 1), "budget_s": budget_s,
            "device": f"{jax.device_count()} x {jax.devices()[0].device_kind}",
            "backend": jax.default_backend(), "jax": jax.__version__,
            "seed_batch": seed_batch, "compute_dtype": compute_dtype,
            "compare": compared, "runs_done": done,
            "runs_total": len(runs)}
  with open(os.path.join(out_dir, "campaign.jsonl"), "a") as f:
    f.write(json.dumps(record) + "\n")
  left = len(runs) - done
  log(f"campaign {size_name}: {done} of {len(runs)} runs done"
      + (f", {left} left: rerun the same command to continue" if left else "")
      + f"; results in {out_dir}")
  return {**record, "rows": rows}


def cli(argv=None, *, repo_dir: str) -> None:
  """``benchmarks/campaign.py``: ``--size``, ``--budget_min``, ``--results``, ...

  ``repo_dir``: the source tree (``run_campaign``); ``--results`` defaults to its
  ``results/``.
  """
  import argparse  # noqa: PLC0415

  from fedjax_het import cli as cli_lib  # noqa: PLC0415
  from fedjax_het.training import compile_cache  # noqa: PLC0415

  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--size", default="paper", choices=sorted(SIZES))
  p.add_argument("--budget_min", type=float, default=25.0,
                 help="minutes; the run in progress at the end checkpoints (rerun to "
                      "continue)")
  p.add_argument("--results", default=os.path.join(repo_dir, "results"),
                 help="results directory (committed; checkpoints inside are ignored)")
  p.add_argument("--seed_batch", type=int, default=0,
                 help="seeds of a cell run together (0: the size's, else 3 on "
                      "accelerators and 1 on CPU)")
  p.add_argument("--skip_compare", action="store_true")
  p.add_argument("--compute_dtype", default="float32", choices=COMPUTE_DTYPES,
                 help="every run's and the comparison's compute dtype; bfloat16 results "
                      "go to <results>/<name>_bf16")
  p.add_argument("--compile_cache", default="",
                 help="a directory, 'default' or 'off'; unset: <results>/<name>/xla_cache")
  args = p.parse_args(argv)
  if args.budget_min <= 0:
    p.error(f"--budget_min must be positive, got {args.budget_min}")
  cli_lib.quiet([sys.argv[0]])
  out_dir = os.path.join(args.results, results_name(SIZES[args.size], args.compute_dtype))
  compile_cache.enable(args.compile_cache or os.path.join(out_dir, "xla_cache"))
  try:
    run_campaign(args.size, results_dir=args.results, budget_s=60 * args.budget_min,
                 seed_batch=args.seed_batch or None, compare=not args.skip_compare,
                 compute_dtype=args.compute_dtype,
                 log=lambda s: print(s, flush=True), repo_dir=repo_dir)
  except (ValueError, FileNotFoundError, subprocess.CalledProcessError) as err:
    cli_lib.fail(err)
