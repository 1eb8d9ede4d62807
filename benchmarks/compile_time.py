r"""How big a run's two programs are and how long they take to trace, lower and compile.

  python benchmarks/compile_time.py --config=experiments/fedmrl.py:cpu
  python benchmarks/compile_time.py --sweep=experiments/claims/p1_classes.py \
      --algorithm=fedmoe --seeds=3
  python benchmarks/compile_time.py --sweep=experiments/claims/p1_classes.py \
      --algorithm=fedmoe --no_compile      # sizes only (here and for CUDA)
  python benchmarks/compile_time.py --config=experiments/fedmrl.py:cpu --group_programs
  python benchmarks/compile_time.py --config=experiments/fedmrl.py:cpu --kernel_kinds

The init (``program.compile_fns(...).init``: every client's parameters and optimizer
state) and the dispatch ``loop.run`` calls (``program.compile_dispatch``: rounds and
their evaluations in one ``lax.while_loop``), each staged by hand (``trace``, ``lower``,
``compile``) and then run: the init once, the dispatch for one round and for two, so its
line also gives the seconds of a round and the megabytes of temporaries the compiled
program allocates beside its arguments and outputs, and the kernels XLA generated code for
(``hlo_size.kernels``: the optimized program's fused computations, and how many distinct
bodies they have; on the 2-core CPU a dispatch's compile took about 4 ms per fused
computation, distinct or not; ``--kernel_kinds`` adds a line of the distinct ones by
kind). Each line ends with the program's size
(``hlo_size``, beside it: StableHLO ops in all and in its largest computation)
lowered for this machine's backend and for CUDA (no GPU needed). A line is printed as
each program is done (a call stopped while the dispatch compiles still tells the
init's times). ``--seeds=S``
stages the dispatch of S seeds on a replica axis, as ``sweep.py --seed_batch=S`` runs
them. Each line names the backend and the switches that change how XLA compiles
(``XLA_FLAGS``, jax's ``jax_threefry_gpu_kernel_lowering``, the dispatch's XLA options of
``fedjax_het.training.compile_options``), so runs of one command
under different switches can be told apart. ``--group_programs`` then compiles each
group's round and evaluation as a program of its own, one after another and on every
CPU at once: the other way to keep the groups apart (docs/performance.md, "Program size
and compile cost"). The script sets no persistent compilation
cache (one set by ``JAX_COMPILATION_CACHE_DIR`` would serve a rerun from its cache).
"""
import argparse
import concurrent.futures
import os
import time
from unittest import mock

import hlo_size  # benchmarks/: the script's directory
import jax
import numpy as np
from init_compile import add_run_flags  # benchmarks/: the script's directory
from init_compile import load

from fedjax_het import cli as cli_lib
from fedjax_het import clients as clients_lib
from fedjax_het.algorithms import rounds
from fedjax_het.training import compile_options
from fedjax_het.training import experiment
from fedjax_het.training import program


def timed(fn, *args):
  """``(fn(*args) with its arrays ready, seconds)``."""
  t = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return out, time.perf_counter() - t


def stage(jitted, *args, compile=True):
  """``(compiled or None, trace s, lower s, compile s, sizes)`` of ``jitted`` at ``args``.

  ``sizes``: the program's ``hlo_size.ProgramSize`` lowered for this machine's backend
  and for CUDA (``lowering_platforms=('cuda',)``, which needs no GPU; a line ``not
  lowered (...)`` saying why where this jax cannot lower for CUDA). ``compile=False``:
  nothing compiled (None and a NaN compile time).
  """
  traced, trace_s = timed(jitted.trace, *args)
  lowered, lower_s = timed(traced.lower)
  sizes = {jax.default_backend(): hlo_size.measure(lowered)}
  if jax.default_backend() != "cuda":
    try:
      sizes["cuda"] = hlo_size.measure(traced.lower(lowering_platforms=("cuda",)))
    except Exception as err:  # noqa: BLE001 - a jax without CUDA lowering rules
      sizes["cuda"] = f"not lowered ({type(err).__name__}: {err})"
  if not compile:
    return None, trace_s, lower_s, float("nan"), sizes
  compiled, compile_s = timed(lowered.compile)
  return compiled, trace_s, lower_s, compile_s, sizes


def memory_and_kernels(compiled) -> str:
  """``temporaries N MB, F fused computations, K distinct kernels``: the buffers the
  compiled program allocates while it runs, beside its arguments and outputs
  (``memory_analysis().temp_size_in_bytes``), and its kernels (``hlo_size.kernels``)."""
  stats = compiled.memory_analysis()
  memory = ("temporaries unknown" if stats is None
            else f"temporaries {stats.temp_size_in_bytes / 1e6:.1f} MB")
  return f"{memory}, {hlo_size.kernels(compiled)}"


def size_line(sizes: dict) -> str:
  """``cpu: N StableHLO ops, largest computation M (...); cuda: ...``."""
  return "; ".join(f"{platform}: {size}" for platform, size in sizes.items())


def switches(platform: str) -> str:
  """The compile switches in force: ``XLA_FLAGS``, jax's threefry lowering and the
  dispatch's XLA options (``fedjax_het.training.compile_options``)."""
  flags = os.environ.get("XLA_FLAGS", "").strip() or "none"
  threefry = getattr(jax.config, "jax_threefry_gpu_kernel_lowering", None)
  options = compile_options.dispatch_compiler_options(platform) or "none"
  return (f"XLA_FLAGS {flags}, threefry kernel "
          f"{'unknown' if threefry is None else 'on' if threefry else 'off'}, "
          f"dispatch options {options}")


def kinds_line(compiled) -> str:
  """``kernels by kind: K1 kind1, K2 kind2, ...`` (``hlo_size.kernel_kinds``)."""
  return "kernels by kind: " + ", ".join(
      f"{n} {kind}" for kind, n in hlo_size.kernel_kinds(compiled).items())


def measure(config, seeds: int = 1, log=print, compile=True, groups=False,
            kinds=False) -> None:
  """Stages and runs ``config``'s init, then its dispatch, logging a line after each.

  Each line gives the program's size (``hlo_size``) for this backend and for CUDA;
  ``compile=False`` stops at the sizes: nothing is compiled or run (with ``seeds`` > 1
  the init is, to stack the replicas' states). ``kinds``: a line more after each compiled
  program, its distinct kernels by kind (``hlo_size.kernel_kinds``).
  """
  configs = [config]
  for s in range(1, seeds):
    c = config.copy_and_resolve_references()
    c.seed = config.seed + s
    configs.append(c)
  exps = [experiment.prepare(c, place=seeds == 1) for c in configs]
  exp = exps[0]
  fns = program.compile_fns(exp)  # turns the threefry kernel on where it is used
  init = fns.init
  name = (f"{config.algorithm} N={config.num_clients} {'+'.join(exp.runtime.layout.archs)} "
          f"{clients_lib.resolve_parallelism(exp.runtime.client_parallelism)} on "
          f"{jax.default_backend()} ({switches(jax.default_backend())})")
  keys = [jax.random.PRNGKey(c.seed) for c in configs]
  sizes_only = not compile and seeds == 1  # the dispatch traced on the abstract state
  init_c, trace_s, lower_s, compile_s, sizes = stage(init, keys[0], compile=not sizes_only)
  states = []
  if sizes_only:  # nothing compiled: the init is not run
    log(f"{name} | init: trace {trace_s:.1f} s, lower {lower_s:.1f} s, not compiled | "
        f"{size_line(sizes)}")
  else:
    for key in keys:
      state, run_s = timed(init_c, key)
      states.append(state)
    log(f"{name} | init: trace {trace_s:.1f} s, lower {lower_s:.1f} s, compile "
        f"{compile_s:.1f} s, run {run_s:.2f} s, {memory_and_kernels(init_c)} | {size_line(sizes)}")
    if kinds:
      log(f"{name} | init {kinds_line(init_c)}")
  if sizes_only:
    data, axes, state = exp.data, None, fns.abstract
  elif seeds == 1:
    data, axes, state = exp.data, None, states[0]
  else:
    data, axes = program.replica_data(exps)
    state = program.replica_state(states, exp.runtime.mesh)
  dispatch = program.compile_dispatch(exp, program.dispatch_rows(config.num_rounds), axes)
  run, trace_s, lower_s, compile_s, sizes = stage(
      dispatch.jitted, state, data, np.int32(1), dispatch.schedule, compile=compile)
  what = f"{name} | dispatch of {seeds} seed{'s' if seeds > 1 else ''}"
  if run is None:
    log(f"{what}: trace {trace_s:.1f} s, lower {lower_s:.1f} s, not compiled | "
        f"{size_line(sizes)}")
    return
  (state, _, _), first = timed(run, state, data, np.int32(1), dispatch.schedule)
  _, two = timed(run, state, data, np.int32(2), dispatch.schedule)
  log(f"{what}: trace {trace_s:.1f} s, lower {lower_s:.1f} s, compile {compile_s:.1f} s, "
      f"first round {first:.2f} s, then {two / 2:.3f} s a round, {memory_and_kernels(run)} | "
      f"{size_line(sizes)}")
  if kinds:
    log(f"{what} {kinds_line(run)}")
  if groups:
    log(f"{name} | {group_programs(exp, fns.abstract, data)}")


def group_computations(exp, state, data) -> list:
  """``[(fn, abstract operands)]``: every computation of its own (``rounds.own_computation``:
  each group's round, then each group's evaluation) of ``exp``'s round and evaluation.

  ``rounds.own_computation`` is patched for the duration of one ``jax.eval_shape`` of each
  and records what it is called with, so each can be jitted as a program of its own.
  """
  recorded, own = [], rounds.own_computation

  def record(fn, operands, witness):
    recorded.append((fn, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                                      operands)))
    return own(fn, operands, witness)
  with mock.patch.object(rounds, "own_computation", record):
    for fn in (exp.algorithm.round, exp.algorithm.evaluate):
      # a new function each time: jit's trace cache must not answer for an earlier trace
      jax.eval_shape(lambda s, d, fn=fn: fn(s, d), state, data)
  return recorded


def group_programs(exp, state, data, threads: int | None = None) -> str:
  """The other way to keep groups apart: each group's computation a jitted program.

  Stages every ``group_computations`` entry as its own program (what one jitted program
  per group, composed by the host each round, would compile; the server's aggregation
  would be one more), compiles them one after another, then all again at once on
  ``threads`` threads (default: the CPU count; XLA's compile releases the GIL).

  Returns:
    The measurement line's text after the run's name.
  """
  computations = group_computations(exp, state, data)
  t = time.perf_counter()
  staged = [jax.jit(fn).trace(*operands) for fn, operands in computations]
  trace_s = time.perf_counter() - t
  t = time.perf_counter()
  lowered = [s.lower() for s in staged]
  lower_s = time.perf_counter() - t
  serial = [timed(lo.compile)[1] for lo in lowered]
  threads = threads or os.cpu_count() or 1
  # jax keeps each lowering's executable: the same programs traced anew, as new functions
  again = [jax.jit(lambda *a, fn=fn: fn(*a)).trace(*operands).lower()
           for fn, operands in computations]
  t = time.perf_counter()
  with concurrent.futures.ThreadPoolExecutor(threads) as pool:
    list(pool.map(lambda lo: lo.compile(), again))
  parallel_s = time.perf_counter() - t
  cuda = [hlo_size.measure(s.lower(lowering_platforms=("cuda",))) for s in staged]
  return (f"{len(staged)} group computations as programs of their own: trace "
          f"{trace_s:.1f} s, lower {lower_s:.1f} s, compile {sum(serial):.1f} s one after another (largest "
          f"{max(serial):.1f} s), {parallel_s:.1f} s on {threads} threads | cuda: "
          f"{sum(c.module for c in cuda)} StableHLO ops as written, largest computation "
          f"{max(c.largest_uncalled for c in cuda)}")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  add_run_flags(p)
  p.add_argument("--seeds", type=int, default=1,
                 help="seeds on the dispatch's replica axis (sweep.py --seed_batch)")
  p.add_argument("--no_compile", action="store_true",
                 help="only the programs' sizes (StableHLO ops here and for CUDA) and "
                      "their trace and lower seconds: nothing compiled (but the init "
                      "with --seeds > 1)")
  p.add_argument("--group_programs", action="store_true",
                 help="then each group's round and evaluation as a jitted program of its "
                      "own, compiled one after another and on every CPU at once (the "
                      "other way to keep groups apart; one seed)")
  p.add_argument("--kernel_kinds", action="store_true",
                 help="a line more after each compiled program: its distinct kernels by "
                      "kind (the op each is named after: dot, reduce, slice, ...)")
  args = p.parse_args(argv)
  cli_lib.quiet([""])
  try:
    if args.seeds < 1:
      raise ValueError(f"--seeds={args.seeds}: must be >= 1")
    if args.group_programs and (args.seeds > 1 or args.no_compile):
      raise ValueError("--group_programs compiles one seed's programs: without --seeds "
                       "or --no_compile")
    config = load(args)
  except (ValueError, FileNotFoundError) as err:
    cli_lib.fail(err)
  measure(config, args.seeds, log=lambda line: print(line, flush=True),
          compile=not args.no_compile, groups=args.group_programs, kinds=args.kernel_kinds)


if __name__ == "__main__":
  main()
