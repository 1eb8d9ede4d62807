r"""Seeds as separate runs vs seeds on a replica axis: wall time and memory of one sweep cell.

  python benchmarks/replicas.py --sweep=experiments/sweeps/paper_cpu.py --algorithm=fedmrl
  python benchmarks/replicas.py --sweep=experiments/sweeps/paper_cpu.py --algorithm=fedmrl \
      --seeds=0,1,2 --rounds=5
  python benchmarks/replicas.py --sweep=experiments/claims/m2_m3_fedmrl.py \
      --setting="d1=500, no MRL" --seeds=3,4 --rounds=4 --way=replica

Runs the cell's seeds twice, in fresh temporary workdirs: (a) one ``loop.run`` per seed,
one after the other, as a sweep does with ``--seed_batch=1`` (the persistent compilation
cache on, in a fresh directory, so the first run compiles and the others load it), and
(b) ``loop.run_seeds`` (one program, a replica axis), as ``--seed_batch=S`` does (its
program is another one: it compiles once). Prints the wall seconds of each (compilation included), their
ratio, and the largest difference between the two ways' per-seed final accuracies.
``--rounds`` cuts the cell's rounds (0: the sweep's). ``--way`` runs one of the two
alone, so that the process's peak resident memory, printed last, is that way's.
"""
import argparse
import os
import resource
import shutil
import tempfile
import time

from fedjax_het import cli as cli_lib
from fedjax_het.config_files import load_config_file
from fedjax_het.sweeps import plan as plan_lib
from fedjax_het.training import compile_cache
from fedjax_het.training import loop

# the algorithms a sweep file names (``fedmrl``) are config files here
EXPERIMENTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "experiments")


def cell_configs(sweep_path: str, algorithm: str, setting: str | None, seeds, rounds: int):
  """The configs of one (algorithm, setting) cell of a sweep, one per seed."""
  sweep = load_config_file(sweep_path)
  sweep.seeds = tuple(seeds)
  runs = [r for r in plan_lib.plan(sweep, "/unused", configs_dir=EXPERIMENTS_DIR)
          if r.algorithm == algorithm
          and (setting is None or r.setting == setting)]
  if not runs:
    raise ValueError(f"no run of algorithm {algorithm!r} (setting {setting!r}) in "
                     f"{sweep_path}")
  first = runs[0].setting
  configs = [r.config for r in runs if r.setting == first]
  for c in configs:
    if rounds:
      c.num_rounds = rounds
  return first, configs


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--sweep", required=True,
                 help="a sweep file (experiments/sweeps/paper_cpu.py); required")
  p.add_argument("--algorithm", default="fedmrl", help="the cell's row")
  p.add_argument("--setting", default=None, help="the cell's column; unset: the sweep's first")
  p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds of the cell")
  p.add_argument("--rounds", type=int, default=0,
                 help="rounds of every run; 0: the sweep's")
  p.add_argument("--way", choices=("both", "separate", "replica"), default="both",
                 help="both ways, or one alone (its peak memory is then the process's)")
  args = p.parse_args(argv)
  cli_lib.quiet([""])
  try:
    setting, configs = cell_configs(args.sweep, args.algorithm, args.setting,
                                    [int(s) for s in args.seeds.split(",")], args.rounds)
  except (ValueError, FileNotFoundError) as err:
    cli_lib.fail(err)
  print(f"{args.algorithm} | {setting} | seeds {args.seeds} | {configs[0].num_rounds} "
        f"rounds", flush=True)
  root = tempfile.mkdtemp(prefix="replicas_")
  quiet = lambda line: None  # noqa: E731
  seconds, finals = {}, {}
  try:
    with compile_cache.enabled(os.path.join(root, "cache")):
      if args.way in ("both", "separate"):
        t = time.perf_counter()
        finals["separate"] = [loop.run(c, os.path.join(root, f"sep{c.seed}"), log=quiet)
                              for c in configs]
        seconds["separate"] = time.perf_counter() - t
        print(f"separate runs: {seconds['separate']:.1f} s"
              + ("" if args.way == "both" else
                 f"; final mean test acc per seed {format_finals(finals['separate'])} %"),
              flush=True)
      if args.way in ("both", "replica"):
        t = time.perf_counter()
        finals["replica"] = loop.run_seeds(
            configs, [os.path.join(root, f"bat{c.seed}") for c in configs], log=quiet)
        seconds["replica"] = time.perf_counter() - t
  finally:
    shutil.rmtree(root, ignore_errors=True)
  if args.way == "both":
    diff = max(abs(a["final_mean_test_acc"] - b["final_mean_test_acc"])
               for a, b in zip(finals["separate"], finals["replica"]))
    print(f"replica axis: {seconds['replica']:.1f} s; separate / replica = "
          f"{seconds['separate'] / seconds['replica']:.2f}x; final mean test acc per seed "
          f"{format_finals(finals['replica'])} %, largest difference to the separate runs "
          f"{100 * diff:.4f} points")
  elif args.way == "replica":
    print(f"replica axis: {seconds['replica']:.1f} s; final mean test acc per seed "
          f"{format_finals(finals['replica'])} %")
  # Linux reports KiB (macOS bytes)
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if os.uname().sysname
                                                                == "Darwin" else 1024)
  print(f"peak resident memory of this process ({args.way}): {peak / 2**30:.2f} GiB")


def format_finals(summaries) -> str:
  """'80.19 / 75.87': each seed's final mean test accuracy in percent."""
  return " / ".join(f"{100 * s['final_mean_test_acc']:.2f}" for s in summaries)


if __name__ == "__main__":
  main()
