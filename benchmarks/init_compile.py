r"""How long a run's init takes to compile at XLA's default level and at the init level.

  python benchmarks/init_compile.py --config=experiments/fedmrl.py:cpu
  python benchmarks/init_compile.py --sweep=experiments/claims/p1_classes.py \
      --algorithm=fedmoe

The init (``Algorithm.init``: every client's parameters and optimizer state, drawn once)
is compiled at XLA's default backend optimization level and at each ``--levels`` entry
(``fedjax_het.training.program.jit_init`` uses ``INIT_OPTIMIZATION_LEVEL`` on CPU), run
once, and its leaves compared bit for bit with the default's. Prints one line per level.
Run it without ``XLA_FLAGS`` setting a level, or the default row is that level.
"""
import argparse
import time

import jax
import numpy as np
from eval_cost import apply_sets  # benchmarks/: the script's directory

from fedjax_het import cli as cli_lib
from fedjax_het import config_files
from fedjax_het import packing
from fedjax_het import validation
from fedjax_het.sweeps import plan as plan_lib
from fedjax_het.training import experiment


def add_run_flags(p: argparse.ArgumentParser) -> None:
  """The flags naming the run to time: ``--config``, or ``--sweep`` with ``--algorithm``."""
  p.add_argument("--config", help="experiments/<algorithm>.py[:variant]")
  p.add_argument("--sweep", help="a sweep file; its first run of --algorithm is timed")
  p.add_argument("--algorithm", help="with --sweep: the row")
  p.add_argument("--configs_dir", default="experiments",
                 help="with --sweep: where an algorithm's config file is")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="a dotted config override (repeatable)")


def load(args):
  """The config of ``--config`` (with ``--set``) or of ``--sweep``'s first run of
  ``--algorithm``, validated (ValueError on flags that name no single run)."""
  if bool(args.config) == bool(args.sweep) or bool(args.sweep) != bool(args.algorithm):
    raise ValueError("give --config, or --sweep with --algorithm")
  if args.sweep:
    runs = [r for r in plan_lib.plan(config_files.load_config_file(args.sweep), "unused",
                                     configs_dir=args.configs_dir)
            if r.algorithm == args.algorithm]
    if not runs:
      raise ValueError(f"--algorithm={args.algorithm!r} is not a row of {args.sweep}")
    config = runs[0].config
  else:
    config = config_files.load_config_file(args.config)
  apply_sets(config, args.set)
  validation.validate(config)
  return config


def time_init(lowered, key, options):
  """(compile s, run s, leaves as numpy) of the ``lowered`` init compiled with ``options``."""
  t0 = time.perf_counter()
  compiled = lowered.compile(compiler_options=options) if options else lowered.compile()
  t1 = time.perf_counter()
  state = jax.block_until_ready(compiled(key))
  t2 = time.perf_counter()
  # the state's own leaves (each group's client tree, not its packed buffers)
  return t1 - t0, t2 - t1, [np.asarray(x)
                            for x in jax.tree.leaves(packing.unpack_all(state))]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  add_run_flags(p)
  p.add_argument("--levels", default="1", help="comma-separated backend optimization "
                 "levels to time against XLA's default")
  args = p.parse_args(argv)
  cli_lib.quiet([""])
  try:
    levels = [int(v) for v in args.levels.split(",") if v.strip()]
    config = load(args)
  except (ValueError, FileNotFoundError) as err:
    cli_lib.fail(err)
  exp = experiment.prepare(config, place=False)
  key = jax.random.PRNGKey(config.seed)
  name = (f"{config.algorithm} N={config.num_clients} {'+'.join(exp.runtime.layout.archs)} "
          f"on {jax.default_backend()}")
  lowered = jax.jit(exp.algorithm.init).lower(key)  # one lowering, compiled per level
  compile_s, run_s, reference = time_init(lowered, key, None)
  print(f"{name} | default level: compile {compile_s:.1f} s, run {run_s:.2f} s, "
        f"{len(reference)} leaves")
  for level in levels:
    compile_s, run_s, leaves = time_init(lowered, key,
                                         {"xla_backend_optimization_level": level})
    same = sum(np.array_equal(a, b) for a, b in zip(reference, leaves))
    worst = max(float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64))))
                for a, b in zip(reference, leaves))
    print(f"{name} | level {level}: compile {compile_s:.1f} s, run {run_s:.2f} s, "
          f"same bits in {same} of {len(leaves)} leaves (largest difference {worst:.1e})")


if __name__ == "__main__":
  main()
