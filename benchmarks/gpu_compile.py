r"""A run's programs compiled for a GPU on a machine without one: seconds, CPU seconds, passes.

  pip install -e '.[gpu-aot]'          # jax's CUDA plugin: compiles for a GPU, runs nothing
  python benchmarks/gpu_compile.py --sweep=benchmarks/p1_cell.py --algorithm=fedmoe
  python benchmarks/gpu_compile.py --sweep=benchmarks/p1_cell.py --algorithm=fedmoe \
      --parallelism=vmap,sequential
  python benchmarks/gpu_compile.py --sweep=experiments/claims/p1_classes.py  # every row, cell
  python benchmarks/gpu_compile.py --config=experiments/fedmrl.py:smoke --out=/tmp/c.jsonl

Each run's init (``program.compile_fns(...).init``) and dispatch
(``program.compile_dispatch``, the program ``loop.run`` calls) are traced as a GPU run
traces them (``deviceless.as_gpu``: ``auto`` parallelism is ``vmap``, the models take
their GPU forms, the library's GPU compile options apply), then lowered and compiled for
``--target`` (an H100 by default) without a device (``fedjax_het.training.deviceless``).
One line per program, printed as it is done:

  <run> | dispatch: trace 3.1 s, lower 0.9 s, compile 21.0 s wall, XLA 23.4 CPU-s
    (+ ptxas 9.8 CPU-s), HLO passes 14.2 s, backend 6.5 s, 1609 fused computations, ...
    | top passes: priority-fusion 5.1 s, ...

``XLA CPU-s`` is this process's CPU time during the compile (XLA's passes, LLVM on its
threads); ``ptxas`` the CPU time of the ptxas processes it started; ``HLO passes`` and
``backend`` are XLA's own timers (``GpuCompiler::RunHloPasses``, ``RunBackend``: LLVM
and ptxas), and the top passes XLA's pass timers (``hlo_pass_pipeline``), summed over
each pass's calls (pipelines, which hold passes, are left out). What needs a device is
off (``deviceless.DEVICELESS_OPTIONS``: autotuning, which times kernels on it, and CUB's
radix sort for long sorts, XLA's own sort kernel compiled instead), so the compile on a
GPU takes at least this long. Programs of a sweep that lower to the same module (cells
of one shape) are compiled once and say so. ``--timeout_s`` stops a compile that runs
longer (the line says so; the process then exits: XLA's compile cannot be interrupted).

The script restarts itself with ``JAX_PLATFORMS=cpu`` (the plugin loads beside the CPU
backend, for compiling only) and XLA's INFO logging of its timers, which it reads from
its own stderr and does not print.
"""
import argparse
import collections
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import resource
import sys
import tempfile
import threading
import time

# the environment the compile runs in, set before jax starts (main() restarts with it)
ENVIRONMENT = {"JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "0",
               "TF_CPP_VMODULE": "hlo_pass_pipeline=1,gpu_compiler=1,nvptx_compiler=1"}

import hlo_size  # noqa: E402 - benchmarks/: the script's directory
import jax  # noqa: E402 - after ENVIRONMENT is defined; main() restarts with it set
import numpy as np  # noqa: E402
from eval_cost import apply_sets  # noqa: E402 - benchmarks/: the script's directory
from init_compile import add_run_flags  # noqa: E402
from init_compile import load  # noqa: E402

from fedjax_het import cli as cli_lib  # noqa: E402
from fedjax_het import clients as clients_lib  # noqa: E402
from fedjax_het import config_files  # noqa: E402
from fedjax_het import data as data_lib  # noqa: E402
from fedjax_het import validation  # noqa: E402
from fedjax_het.sweeps import plan as plan_lib  # noqa: E402
from fedjax_het.training import compile_options  # noqa: E402
from fedjax_het.training import deviceless  # noqa: E402
from fedjax_het.training import program  # noqa: E402

# XLA's timer lines: "HLO pass: <name> time: 1.2 s (1234567 us) ..." and the compiler's
_PASS = re.compile(r"HLO pass: (\S+) time: .*?\((\d+) us\)")
_PIPELINE = re.compile(r"Running HLO pass pipeline on module \S+: (\S+)")
_STAGE = re.compile(r"(GpuCompiler::RunHloPasses|GpuCompiler::RunBackend|CompileToPtx|"
                    r"PtxToCubin) for \S+ time: .*?\((\d+) us\)")


@dataclasses.dataclass
class XlaTimes:
  """What XLA's timers said about one compile (seconds).

  Attributes:
    passes: each HLO pass's time summed over its calls (pipelines left out).
    hlo_passes: ``GpuCompiler::RunHloPasses``.
    backend: ``GpuCompiler::RunBackend`` (LLVM and ptxas).
    llvm: ``CompileToPtx`` summed over its calls (threads).
    ptxas: ``PtxToCubin`` summed over its calls (threads).
  """
  passes: dict
  hlo_passes: float = 0.0
  backend: float = 0.0
  llvm: float = 0.0
  ptxas: float = 0.0

  def top(self, n: int) -> list:
    return sorted(self.passes.items(), key=lambda kv: -kv[1])[:n]


def parse_xla_log(text: str) -> XlaTimes:
  """``XlaTimes`` of XLA's INFO log (``TF_CPP_VMODULE`` as in ``ENVIRONMENT``)."""
  pipelines = set(_PIPELINE.findall(text))
  passes = collections.Counter()
  for name, us in _PASS.findall(text):
    if name not in pipelines:
      passes[name] += int(us) / 1e6
  stages = collections.Counter()
  for stage, us in _STAGE.findall(text):
    stages[stage] += int(us) / 1e6
  return XlaTimes(dict(passes), stages["GpuCompiler::RunHloPasses"],
                  stages["GpuCompiler::RunBackend"], stages["CompileToPtx"],
                  stages["PtxToCubin"])


@contextlib.contextmanager
def stderr_captured():
  """Within: file descriptor 2 (XLA's log, Python's stderr) goes to a file; yields a list
  that holds the file's text after the block. Lines that are not XLA INFO lines (errors,
  warnings) are written to the real stderr after the block."""
  out = []
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile(mode="w+b") as f:
    os.dup2(f.fileno(), 2)
    try:
      yield out
    finally:
      sys.stderr.flush()
      os.dup2(saved, 2)
      os.close(saved)
      f.seek(0)
      text = f.read().decode("utf-8", "replace")
      out.append(text)
      rest = [line for line in text.splitlines() if line and not line.startswith("I")]
      if rest:
        print("\n".join(rest), file=sys.stderr, flush=True)


# the line XLA logs as a pass starts ("  HLO pass priority-fusion") or ends (_PASS)
_STARTED = re.compile(r"\] +HLO pass (\S+)$")


def running_pass(text: str | None = None) -> str:
  """``in pass <name>``: the innermost HLO pass XLA's log says was started and has not
  ended, or ``in no HLO pass``. ``text``: the log (default: file descriptor 2's file,
  which ``stderr_captured`` makes the log)."""
  if text is None:
    try:
      with open("/proc/self/fd/2", errors="replace") as f:
        text = f.read()
    except OSError:
      return "pass unknown"
  running = []
  for line in text.splitlines():
    started, ended = _STARTED.search(line), _PASS.search(line)
    if started:
      running.append(started.group(1))
    elif ended and running and running[-1] == ended.group(1):
      running.pop()
  return f"in pass {running[-1]}" if running else "in no HLO pass"


def cpu_seconds() -> tuple[float, float]:
  """(this process's CPU seconds, its finished children's: ptxas)."""
  children = resource.getrusage(resource.RUSAGE_CHILDREN)
  return time.process_time(), children.ru_utime + children.ru_stime


@dataclasses.dataclass
class Compiled:
  """One program's deviceless compile: ``line`` as printed, ``record`` for ``--out``."""
  line: str
  record: dict


def compile_lowered(lowered, timeout_s: float | None, options: dict):
  """``((compiled, None) or (None, error), wall s, (XLA CPU s, ptxas CPU s), XlaTimes)``;
  exits the process with a line where the compile runs past ``timeout_s`` (an XLA compile
  cannot be stopped). A compile that raises is measured all the same: its error says
  how far it came with XLA's timers (``backend`` > 0: every pass and LLVM ran)."""
  done = threading.Event()
  if timeout_s:
    def watchdog():
      if not done.wait(timeout_s):
        spent = cpu_seconds()
        os.write(saved_stdout, (
            f"compile not finished after {timeout_s:.0f} s wall "
            f"({spent[0] - cpu0[0]:.0f} XLA CPU-s), {running_pass()}: stopped\n").encode())
        os._exit(3)
    saved_stdout = os.dup(1)
    threading.Thread(target=watchdog, daemon=True).start()
  cpu0 = cpu_seconds()
  t = time.perf_counter()
  compiled = error = None
  with stderr_captured() as log:
    try:
      compiled = lowered.compile(compiler_options=options or None)
    except Exception as err:  # noqa: BLE001 - reported with the timers XLA logged
      error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
  wall = time.perf_counter() - t
  done.set()
  cpu1 = cpu_seconds()
  return (compiled, error), wall, (cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]), parse_xla_log(
      log[0])


def stage(name: str, jitted, args, seen: dict, timeout_s, top: int,
          options: dict | None = None) -> Compiled:
  """Traces, lowers and compiles ``jitted`` at ``args`` (abstract), or names the earlier
  program of ``seen`` (fingerprint -> its name) it is the same module as."""
  t = time.perf_counter()
  with deviceless.as_gpu():
    traced = jitted.trace(*args)
  trace_s = time.perf_counter() - t
  t = time.perf_counter()
  lowered = traced.lower()
  lower_s = time.perf_counter() - t
  # the module as compiled, without its source locations: programs of one shape agree
  text = lowered.as_text(debug_info=False)
  fingerprint = hashlib.sha256(text.encode()).hexdigest()[:16]
  record = {"program": name, "trace_s": round(trace_s, 2), "lower_s": round(lower_s, 2),
            "fingerprint": fingerprint}
  if fingerprint in seen:
    record["same_as"] = seen[fingerprint]
    return Compiled(f"{name}: trace {trace_s:.1f} s, lower {lower_s:.1f} s, the same "
                    f"program as {seen[fingerprint]}: not compiled again", record)
  seen[fingerprint] = name
  options = deviceless.compiler_options() if options is None else options
  (compiled, error), wall, (xla_cpu, ptxas_cpu), times = compile_lowered(
      lowered, timeout_s, options)
  record.update(compile_s=round(wall, 2), xla_cpu_s=round(xla_cpu, 2),
                ptxas_cpu_s=round(ptxas_cpu, 2), hlo_passes_s=round(times.hlo_passes, 2),
                backend_s=round(times.backend, 2), llvm_s=round(times.llvm, 2),
                ptxas_s=round(times.ptxas, 2),
                top_passes={k: round(v, 2) for k, v in times.top(top)})
  if compiled is None:
    record["error"] = error
    kernels = f"no executable ({error})"
  else:
    count = hlo_size.kernels(compiled)
    record.update(fusions=count.fusions, distinct_kernels=count.distinct)
    kernels = str(count)
  passes = ", ".join(f"{k} {v:.1f} s" for k, v in times.top(top)) or "no pass timers read"
  return Compiled(
      f"{name}: trace {trace_s:.1f} s, lower {lower_s:.1f} s, compile {wall:.1f} s wall, "
      f"XLA {xla_cpu:.1f} CPU-s (+ ptxas {ptxas_cpu:.1f} CPU-s), HLO passes "
      f"{times.hlo_passes:.1f} s, backend {times.backend:.1f} s, {kernels} | top passes: "
      f"{passes}", record)


def run_programs(config, target_devices, seeds: int = 1):
  """``[(label, jitted, abstract args)]``: the init and the dispatch of ``config`` (with
  ``seeds`` > 1, of that many seeds on a replica axis), as a GPU run stages them."""
  configs = [config]
  for s in range(1, seeds):
    c = config.copy_and_resolve_references()
    c.seed = config.seed + s
    configs.append(c)
  with deviceless.as_gpu():
    exps = [deviceless.prepare(c, target_devices) for c in configs]
    exp = exps[0]
    fns = program.compile_fns(exp)
    mesh = exp.runtime.mesh
    key = deviceless.abstract_value(jax.random.PRNGKey(config.seed), mesh)
    if seeds == 1:
      axes, data = None, deviceless.abstract_data(exp.data, mesh)
      state = fns.abstract
    else:
      stacked, axes = data_lib.stack_replicas([e.data for e in exps])
      data = deviceless.abstract_data(stacked, mesh, replicas=True)
      state = deviceless.stacked(fns.abstract, seeds,
                                 program.state_shardings(fns.abstract, mesh, True))
    dispatch = program.compile_dispatch(exp, program.dispatch_rows(config.num_rounds), axes)
    n = deviceless.abstract_value(np.int32(1), mesh)
    schedule = deviceless.abstract_value(dispatch.schedule, mesh)
    mode = clients_lib.resolve_parallelism(exp.runtime.client_parallelism)
  return mode, [("init", fns.init, (key,)),
                (f"dispatch of {seeds} seed{'s' if seeds > 1 else ''}", dispatch.jitted,
                 (state, data, n, schedule))]


def runs_of(args) -> list:
  """``[(label, config)]``: ``--config``'s run, or each (setting, algorithm) of ``--sweep``
  at its first seed (``--algorithm`` keeps one row, ``--setting`` the columns whose name
  holds it)."""
  if args.config:
    return [(args.config, load(args))]
  return [(f"{os.path.basename(args.sweep)} {algorithm} [{setting}]", config)
          for setting, algorithm, config in _settings(args, args.algorithm)
          if args.setting in setting]


def _settings(args, algorithm=None) -> list:
  """Each (setting, algorithm, config) of ``--sweep``'s first seed, ``--set`` applied."""
  runs = plan_lib.plan(config_files.load_config_file(args.sweep), "unused",
                       configs_dir=args.configs_dir)
  first = runs[0].seed
  out = []
  for r in runs:
    if r.seed == first and (algorithm is None or r.algorithm == algorithm):
      apply_sets(r.config, args.set)
      validation.validate(r.config)
      out.append((r.setting, r.algorithm, r.config))
  return out


# what a compile on the GPU host may take against its deviceless figure on the 2-core CPU
# (``expected_limit``): autotuning, which a deviceless compile skips, gets a minute
EXPECT_FACTOR, AUTOTUNE_ALLOWANCE_S = 2.0, 60.0


def expected_limit(record: dict) -> float:
  """Seconds a compile on a GPU host may take, from its deviceless ``record``: twice its
  XLA and ptxas CPU seconds plus ``AUTOTUNE_ALLOWANCE_S``. A bound to stop a lease's call
  early where a compile goes wrong (FedMoE's took over 7 minutes), not a prediction."""
  return EXPECT_FACTOR * (record["xla_cpu_s"] + record["ptxas_cpu_s"]) + AUTOTUNE_ALLOWANCE_S


def load_expected(path: str, jax_version: str = jax.__version__) -> dict:
  """``{(program, seeds, target): record}`` of a ``--out`` file's compiled programs: the
  last record of each compiled with ``jax_version`` (the XLA that will compile it), else
  the last of any version."""
  expected = {}
  with open(path) as f:
    for line in f:
      r = json.loads(line)
      key = (r["program"], r["seeds"], r["target"])
      if "compile_s" in r and (r.get("jax") == jax_version
                               or expected.get(key, {}).get("jax") != jax_version):
        expected[key] = r
  return expected


def parallelisms_of(flag: str) -> list:
  """``--parallelism``'s comma-separated modes ([None]: each run's own), checked: a debug
  mode is refused (its clients run one by one in Python; no round program to compile)."""
  modes = [s.strip() for s in flag.split(",") if s.strip()] or [None]
  compiled = [m for m in clients_lib.PARALLELISM if not clients_lib.is_debug(m)]
  for mode in modes:
    if mode is not None and mode not in compiled:
      raise ValueError(f"--parallelism: {mode!r} is not one of {compiled}")
  return modes


def measure(runs, target: str, parallelisms, seeds: int, log=print, out=None,
            timeout_s=None, top: int = 5, on_device: bool = False,
            expected: dict | None = None) -> list[dict]:
  """Compiles every run's init and dispatch for ``target`` under each parallelism; logs a
  line per program (``stage``); appends each record to ``out`` (a JSON-lines path).

  ``on_device``: compiled for this machine's own GPU, autotuning on (the library's own
  options only), to set against the deviceless figures. ``expected``
  (``load_expected``): each program whose deviceless record is there compiles under
  ``expected_limit`` (the process stops past it) and its line says how the two compare.
  """
  if on_device:
    target_devices = [d for d in jax.devices() if d.platform == "gpu"]
    if not target_devices:
      raise RuntimeError(f"--on_device: no GPU here (devices: {jax.devices()})")
    options, how = {}, "on this device"
  else:
    with stderr_captured():  # the plugin's start logs at INFO
      target_devices = deviceless.devices(target)
    options, how = deviceless.compiler_options(), "deviceless"
  seen, records = {}, []
  log(f"compiling for {target} ({target_devices[0].device_kind}), {how}; dispatch options "
      f"{compile_options.dispatch_compiler_options('gpu')}, compile options {options}")
  for label, config in runs:
    for parallelism in parallelisms:
      c = config.copy_and_resolve_references()
      if parallelism:
        c.runtime.client_parallelism = parallelism
      with stderr_captured():
        mode, programs = run_programs(c, target_devices, seeds)
      for what, jitted, abstract in programs:
        name = f"{label} {mode} {what}"
        before = (expected or {}).get((name, seeds, target))
        limit = expected_limit(before) if before else timeout_s
        result = stage(name, jitted, abstract, seen, limit, top, options)
        record = dict(result.record, run=label, parallelism=mode, seeds=seeds,
                      target=target, on_device=on_device, jax=jax.__version__)
        records.append(record)
        line = result.line
        if before and "compile_s" in record:
          within = "within" if record["compile_s"] <= limit else "over"
          line += (f" | deviceless {before['xla_cpu_s']:.1f} + {before['ptxas_cpu_s']:.1f} "
                   f"CPU-s: limit {limit:.0f} s, {within}")
        log(line)
        if out:
          with open(out, "a") as f:
            f.write(json.dumps(record) + "\n")
  return records


def summary(records: list[dict]) -> str:
  """A markdown table of ``--out`` records by run file, jax and seeds: the programs, how many
  were compiled (the others the same module as one before), and its largest compile in
  XLA CPU seconds (with that program's ptxas CPU seconds)."""
  groups: dict = {}
  for r in records:
    key = (r["program"].split(" ")[0], r.get("jax", "?"), r["seeds"])
    groups.setdefault(key, []).append(r)
  rows = ["| runs of | jax | seeds | programs | compiled | largest: XLA CPU-s + ptxas | "
          "program |", "|---|---|---:|---:|---:|---|---|"]
  for (path, version, seeds), rs in groups.items():
    compiled = [r for r in rs if "compile_s" in r]
    top = max(compiled, key=lambda r: r["xla_cpu_s"], default=None)
    largest = (f"{top['xla_cpu_s']:.1f} + {top['ptxas_cpu_s']:.1f}"
               + (" (no executable)" if "error" in top else "")) if top else "-"
    name = top["program"].split(" ", 1)[1] if top else "-"
    rows.append(f"| {path} | {version} | {seeds} | {len(rs)} | {len(compiled)} | {largest} | "
                f"{name} |")
  return "\n".join(rows)


def table(records: list[dict]) -> str:
  """A markdown table of ``--out`` records, one row per compiled program (programs that
  were the same module as an earlier one are counted in its row's last column)."""
  same = collections.Counter(r["same_as"] for r in records if "same_as" in r)
  rows = ["| program | seeds | jax | XLA CPU-s | ptxas CPU-s | wall s | HLO passes s | "
          "backend s | fused computations | top passes | same module |",
          "|---|---:|---|---:|---:|---:|---:|---:|---:|---|---:|"]
  for r in records:
    if "compile_s" not in r:
      continue
    passes = ", ".join(f"{k} {v:.1f}" for k, v in list(r["top_passes"].items())[:3])
    rows.append(f"| {r['program']} | {r['seeds']} | {r.get('jax', '?')} | {r['xla_cpu_s']:.1f} | "
                f"{r['ptxas_cpu_s']:.1f} | {r['compile_s']:.1f} | {r['hlo_passes_s']:.1f} | "
                f"{r['backend_s']:.1f} | {r.get('fusions', 'no executable')} | {passes} | "
                f"{same.get(r['program'], 0)} |")
  return "\n".join(rows)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  environment = dict(ENVIRONMENT)
  if "--on_device" in argv:  # this machine's GPU: jax starts as it would for a run
    del environment["JAX_PLATFORMS"]
  if any(os.environ.get(k) != v for k, v in environment.items()):
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__)] + list(argv),
              dict(os.environ, **environment))
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  add_run_flags(p)
  p.add_argument("--setting", default="",
                 help="with --sweep: only the settings (columns) whose name holds this")
  p.add_argument("--target", default="h100", choices=sorted(deviceless.TARGETS),
                 help="the GPU compiled for (fedjax_het/training/gpu_targets/)")
  p.add_argument("--parallelism", default="",
                 help="comma-separated runtime.client_parallelism to compile each run "
                      "with (vmap, sequential, auto); default: the config's")
  p.add_argument("--seeds", type=int, default=1,
                 help="seeds on the dispatch's replica axis (sweep.py --seed_batch)")
  p.add_argument("--out", help="append one JSON line per program to this file")
  p.add_argument("--timeout_s", type=float, default=0,
                 help="stop the process when one compile runs longer (0: never)")
  p.add_argument("--top", type=int, default=5, help="how many passes each line names")
  p.add_argument("--on_device", action="store_true",
                 help="compile for this machine's GPU instead (autotuning on), to set "
                      "against the deviceless figures")
  p.add_argument("--expect", help="a --out file of deviceless figures: each program found "
                 "there must compile within twice its CPU seconds + 60 s, or the process "
                 "stops (status 3)")
  p.add_argument("--table", help="print a --out file as a markdown table and exit")
  args = p.parse_args(argv)
  if args.table:
    with open(args.table) as f:
      records = [json.loads(line) for line in f]
    print(summary(records) + "\n\n" + table(records))
    return
  try:
    if args.seeds < 1:
      raise ValueError(f"--seeds={args.seeds}: must be >= 1")
    parallelisms = parallelisms_of(args.parallelism)
    if not args.config and not args.sweep:
      raise ValueError("give --config, or --sweep (with --algorithm for one row)")
    if args.config and args.sweep:
      raise ValueError("give --config or --sweep, not both")
    runs = runs_of(args)
    if not runs:
      raise ValueError(f"--algorithm={args.algorithm!r} --setting={args.setting!r} name no "
                       f"run of {args.sweep}")
    deviceless.target_config(args.target)
    expected = load_expected(args.expect) if args.expect else None
  except (ValueError, FileNotFoundError) as err:
    cli_lib.fail(err)
  try:
    measure(runs, args.target, parallelisms, args.seeds,
            log=lambda line: print(line, flush=True), out=args.out,
            timeout_s=args.timeout_s or None, top=args.top, on_device=args.on_device,
            expected=expected)
  except RuntimeError as err:
    cli_lib.fail(err)


if __name__ == "__main__":
  main()
