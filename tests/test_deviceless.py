"""Compiling for a GPU without one: fedjax_het.training.deviceless and benchmarks/gpu_compile.py.

Everything but the last test runs on the CPU without the CUDA plugin: the target files,
the options, the run prepared on a given list of devices and traced as a GPU run, the
timers parsed from a hand-written XLA log. ``test_compiles_for_an_h100_without_a_device``
compiles for an H100 target where jax's CUDA plugin is installed (``pip install -e
'.[gpu-aot]'``, several GB: CI does not install it) and is skipped where it is not
(docs/performance.md, "Compiling for a GPU without one").
"""
import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from fedjax_het import clients as clients_lib
from fedjax_het.models import cnn
from fedjax_het.training import compile_options
from fedjax_het.training import deviceless
from fedjax_het.training import program

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import gpu_compile  # noqa: E402

# a piece of XLA's INFO log as TF_CPP_VMODULE=hlo_pass_pipeline=1,gpu_compiler=1,
# nvptx_compiler=1 writes it: a pipeline holding two passes, one pass called twice
XLA_LOG = """\
I1207 13:29:38.4 6524 hlo_pass_pipeline.cc:303] Running HLO pass pipeline on module jit_f: fusion
I1207 13:29:38.4 6524 hlo_pass_pipeline.cc:176] HLO pass: priority-fusion time: 2.5 s (2500000 us) (cumulative: 3 s, max: 2.5 s, #called: 1)
I1207 13:29:38.4 6524 hlo_pass_pipeline.cc:176] HLO pass: dce time: 10 us (10 us) (cumulative: 3 s, max: 2.5 s, #called: 2)
I1207 13:29:38.4 6524 hlo_pass_pipeline.cc:176] HLO pass: fusion time: 2.6 s (2600010 us) (cumulative: 5.6 s, max: 2.6 s, #called: 3)
I1207 13:29:38.4 6524 hlo_pass_pipeline.cc:176] HLO pass: dce time: 30 us (30 us) (cumulative: 5.6 s, max: 2.6 s, #called: 4)
I1207 13:29:48.2 6741 gpu_compiler.cc:2152] GpuCompiler::RunHloPasses for jit_f time: 4.1 s (4100000 us) (cumulative: 4.1 s, max: 4.1 s, #called: 1)
I1207 13:29:48.4 6761 nvptx_compiler.cc:520] NVPTXCompiler::CompileTargetBinary - CompileToPtx for jit_f time: 15.3 ms (15000 us) (cumulative: 15.3 ms, max: 15.3 ms, #called: 1)
I1207 13:29:48.4 6762 nvptx_compiler.cc:520] NVPTXCompiler::CompileTargetBinary - CompileToPtx for jit_f time: 43.2 ms (45000 us) (cumulative: 58.5 ms, max: 43.2 ms, #called: 2)
I1207 13:29:48.5 6761 nvptx_compiler.cc:571] NVPTXCompiler::CompileTargetBinary - PtxToCubin for jit_f time: 79.1 ms (80000 us) (cumulative: 79.1 ms, max: 79.1 ms, #called: 1)
I1207 13:29:48.6 6741 gpu_compiler.cc:2817] GpuCompiler::RunBackend for jit_f time: 397 ms (400000 us) (cumulative: 397 ms, max: 397 ms, #called: 1)
"""


def test_xla_timers_are_summed_per_pass_and_pipelines_left_out():
  times = gpu_compile.parse_xla_log(XLA_LOG)
  assert times.passes == pytest.approx({"priority-fusion": 2.5, "dce": 40e-6})
  assert "fusion" not in times.passes  # a pipeline: its time is its passes'
  assert times.top(1) == [("priority-fusion", 2.5)]
  assert (times.hlo_passes, times.backend) == pytest.approx((4.1, 0.4))
  assert (times.llvm, times.ptxas) == pytest.approx((0.06, 0.08))
  empty = gpu_compile.parse_xla_log("no timers here\n")
  assert empty.passes == {} and empty.hlo_passes == 0 and empty.top(3) == []


def test_the_h100_target_ships_with_the_library():
  text = deviceless.target_config("h100")
  assert "core_count: 132" in text and "major: 9" in text
  # jaxlib 0.10.2's GpuTargetConfig proto does not know this field (gpu_targets/README.md)
  fields = [line.split(":")[0].strip() for line in text.splitlines()
            if not line.lstrip().startswith("#")]
  assert "collective_memory_granularity" not in fields and "core_count" in fields
  with pytest.raises(ValueError, match=r"--target='a100'.*\['h100'\]"):
    deviceless.target_config("a100")


def test_a_debug_parallelism_is_refused_before_any_compile():
  assert gpu_compile.parallelisms_of("") == [None]  # each run's own
  assert gpu_compile.parallelisms_of("vmap, sequential") == ["vmap", "sequential"]
  # a debug run's clients run one by one in Python: there is no round program to compile
  with pytest.raises(ValueError, match=r"^--parallelism: 'debug' is not one of "
                                       r"\['auto', 'vmap', 'sequential'\]$"):
    gpu_compile.parallelisms_of("vmap,debug")


@pytest.mark.skipif(deviceless.plugin_installed(), reason="jax's CUDA plugin is installed")
def test_without_the_plugin_the_error_says_what_to_install():
  with pytest.raises(RuntimeError, match=r"pip install -e '\.\[gpu-aot\]'"):
    deviceless.devices("h100")


def test_deviceless_options_give_way_to_xla_flags():
  both = {"xla_gpu_autotune_level": 0, "xla_gpu_enable_cub_radix_sort": False}
  assert deviceless.compiler_options("") == both
  assert deviceless.compiler_options("--xla_gpu_autotune_level=4") == {
      "xla_gpu_enable_cub_radix_sort": False}
  # a copy: editing it leaves the next compile's options alone
  deviceless.compiler_options("")["xla_gpu_autotune_level"] = 3
  assert deviceless.DEVICELESS_OPTIONS == both


def test_traced_as_a_gpu_run_within_as_gpu():
  assert jax.default_backend() == "cpu"
  with deviceless.as_gpu():
    assert jax.default_backend() == "gpu"
    assert clients_lib.resolve_parallelism("auto") == "vmap"
    assert not cnn.cpu_kernels()
    assert compile_options.dispatch_compiler_options("gpu", "") == dict(
        compile_options.GPU_DISPATCH_OPTIONS)
  assert jax.default_backend() == "cpu"
  assert clients_lib.resolve_parallelism("auto") == "sequential"


def test_prepare_builds_the_mesh_of_the_given_devices_and_keeps_the_data_home(tiny_config):
  devices = jax.devices()[:2]
  exp = deviceless.prepare(tiny_config(overrides={"runtime.num_devices": 0}), devices)
  assert list(exp.runtime.mesh.devices.flat) == devices
  assert isinstance(exp.data.x, np.ndarray)  # not placed: only its shape is compiled for
  data = deviceless.abstract_data(exp.data, exp.runtime.mesh)
  assert data.x.shape == exp.data.x.shape and data.x.dtype == exp.data.x.dtype
  assert data.x.sharding.spec == jax.sharding.PartitionSpec()
  for a, b in zip(jax.tree.leaves(data.groups), jax.tree.leaves(exp.data.groups)):
    assert a.shape == b.shape and a.sharding.spec == jax.sharding.PartitionSpec("clients")
  with pytest.raises(ValueError, match=r"num_devices=3: must be 0 \(all\) or in \[1, 2\]"):
    deviceless.prepare(tiny_config(overrides={"runtime.num_devices": 3}), devices)


def test_run_programs_stage_a_gpu_runs_programs_and_same_modules_compile_once(tiny_config):
  # on the CPU's own device: the staging, not the GPU compile (the last test's)
  config = tiny_config(overrides={"runtime.client_parallelism": "auto"})
  mode, programs = gpu_compile.run_programs(config, jax.devices()[:1])
  assert mode == "vmap"  # auto, traced as on a GPU
  assert [p[0] for p in programs] == ["init", "dispatch of 1 seed"]
  seen = {}
  first = gpu_compile.stage("dispatch", *programs[1][1:], seen, None, 3)
  assert first.record["fusions"] > 0 and first.record["xla_cpu_s"] > 0
  assert "compile" in first.line and "fused computations" in first.line
  again = gpu_compile.stage("dispatch again", *programs[1][1:], seen, None, 3)
  assert again.record["same_as"] == "dispatch" and "compile_s" not in again.record
  # two seeds on a replica axis: a program of its own, every state leaf stacked
  mode, replicas = gpu_compile.run_programs(config, jax.devices()[:1], seeds=2)
  state = replicas[1][2][0]
  assert all(a.shape[0] == 2 for a in jax.tree.leaves(state))
  abstract = program.compile_fns(deviceless.prepare(config, jax.devices()[:1])).abstract
  assert jax.tree.structure(state) == jax.tree.structure(abstract)


@pytest.mark.skipif(not deviceless.plugin_installed(),
                    reason="jax's CUDA plugin is not installed (pip install -e '.[gpu-aot]')")
def test_compiles_for_an_h100_without_a_device(tmp_path):
  out = tmp_path / "programs.jsonl"
  env = dict(os.environ, FEDJAX_HET_DATA=os.environ.get(
      "FEDJAX_HET_DATA", os.path.join(ROOT, "..", "shared", "data")))
  proc = subprocess.run(
      [sys.executable, os.path.join(ROOT, "benchmarks", "gpu_compile.py"),
       "--config=experiments/fedavg.py:smoke", f"--out={out}"],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.splitlines()
  assert lines[0].startswith("compiling for h100 (NVIDIA H100")
  records = [json.loads(line) for line in out.read_text().splitlines()]
  assert [r["program"] for r in records] == [  # auto is vmap on a GPU
      "experiments/fedavg.py:smoke vmap init",
      "experiments/fedavg.py:smoke vmap dispatch of 1 seed"]
  for r in records:
    assert r["compile_s"] > 0 and r["fusions"] > 0 and r["hlo_passes_s"] > 0
    assert r["backend_s"] > 0 and r["top_passes"]  # XLA's GPU timers were read


# a long 1-D sort, compiled deviceless with and without the deviceless options
SORT_PROBE = """
import jax, jax.numpy as jnp
from fedjax_het.training import deviceless
device = deviceless.devices("h100")[0]
x = jax.ShapeDtypeStruct((100_000,), jnp.float32,
                         sharding=jax.sharding.SingleDeviceSharding(device))
lowered = jax.jit(jnp.sort).lower(x)
lowered.compile(compiler_options=deviceless.compiler_options(""))
print("with the options: compiled")
try:
  lowered.compile(compiler_options={"xla_gpu_autotune_level": 0})
  print("CUB's sort: compiled")
except Exception as err:
  print("CUB's sort:", type(err).__name__, err)
"""


@pytest.mark.skipif(not deviceless.plugin_installed(),
                    reason="jax's CUDA plugin is not installed (pip install -e '.[gpu-aot]')")
def test_a_long_sort_compiles_deviceless_without_cubs_radix_sort():
  proc = subprocess.run([sys.executable, "-c", SORT_PROBE], cwd=ROOT, capture_output=True,
                        text=True, timeout=300, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = proc.stdout.splitlines()
  assert lines[0] == "with the options: compiled"
  # the reason for the option: XLA's CUB rewrite asks the CUDA runtime for a device (when
  # an XLA no longer does, this line fails and the option can go)
  assert "cudaErrorInvalidDevice" in lines[1], lines[1]


def test_the_table_has_a_row_per_compiled_program_and_counts_the_same_modules():
  compiled = {"program": "p init", "seeds": 1, "jax": "0.10.2", "xla_cpu_s": 3.25,
              "ptxas_cpu_s": 1.0, "compile_s": 5.5, "hlo_passes_s": 2.0, "backend_s": 3.0, "fusions": 42,
              "top_passes": {"priority-fusion": 1.5, "dce": 0.25, "algsimp": 0.1,
                             "cse": 0.05}}
  lines = gpu_compile.table([compiled, {"program": "q init", "seeds": 1, "same_as": "p init"},
                             {"program": "r init", "seeds": 1, "same_as": "p init"}])
  rows = lines.splitlines()
  assert len(rows) == 3  # header, rule, one compiled program
  assert rows[2] == ("| p init | 1 | 0.10.2 | 3.2 | 1.0 | 5.5 | 2.0 | 3.0 | 42 | "
                     "priority-fusion 1.5, dce 0.2, algsimp 0.1 | 2 |")


def test_a_stopped_compile_names_the_pass_it_was_in():
  log = XLA_LOG.splitlines()
  started = "I1207 13:29:38.4 6524 hlo_pass_pipeline.cc:181]   HLO pass {}"
  text = "\n".join([log[0], started.format("fusion"), started.format("priority-fusion"),
                    log[1], started.format("dce"), log[2], started.format("multi_output_fusion")])
  assert gpu_compile.running_pass(text) == "in pass multi_output_fusion"
  assert gpu_compile.running_pass("\n".join(text.splitlines()[:-1])) == "in pass fusion"
  assert gpu_compile.running_pass(text.splitlines()[0]) == "in no HLO pass"


def test_a_lease_checks_against_the_figure_of_its_own_jax(tmp_path):
  def record(program, jax_version, xla, ptxas=1.0, **extra):
    return {"program": program, "seeds": 1, "target": "h100", "jax": jax_version,
            "compile_s": 1.0, "xla_cpu_s": xla, "ptxas_cpu_s": ptxas, **extra}
  path = tmp_path / "programs.jsonl"
  rows = [record("a", "0.11.2", 20.0), record("a", "0.10.2", 30.0),
          record("b", "0.10.2", 5.0), record("b", "0.10.2", 7.0),
          {"program": "c", "seeds": 1, "target": "h100", "same_as": "a"}]
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  expected = gpu_compile.load_expected(str(path), "0.11.2")
  assert set(expected) == {("a", 1, "h100"), ("b", 1, "h100")}  # c was not compiled
  assert expected[("a", 1, "h100")]["xla_cpu_s"] == 20.0  # its own jax's, though earlier
  assert expected[("b", 1, "h100")]["xla_cpu_s"] == 7.0  # the last of another jax's
  # twice the CPU seconds (XLA's and ptxas') and a minute for autotuning
  assert gpu_compile.expected_limit(expected[("a", 1, "h100")]) == 2 * 21.0 + 60.0


def test_a_compile_that_raises_is_reported_with_its_timers_and_the_sweep_goes_on():
  x = jax.ShapeDtypeStruct((3,), np.float32)
  seen = {}
  bad = gpu_compile.stage("bad", jax.jit(lambda a: a * 2), (x,), seen, None, 3,
                          options={"xla_no_such_option_here": True})
  assert "xla_no_such_option_here" in bad.record["error"] and "fusions" not in bad.record
  assert "no executable" in bad.line and bad.record["compile_s"] >= 0
  assert "| no executable |" in gpu_compile.table([dict(bad.record, seeds=1)])
  good = gpu_compile.stage("good", jax.jit(lambda a: a * 3), (x,), seen, None, 3, options={})
  assert "error" not in good.record and good.record["fusions"] >= 0


def test_the_summary_has_a_row_per_run_file_and_jax_with_its_largest_compile():
  def r(program, jax_version, xla=None, **extra):
    out = {"program": program, "seeds": 1, "jax": jax_version, **extra}
    if xla is not None:
      out.update(compile_s=1.0, xla_cpu_s=xla, ptxas_cpu_s=xla / 10)
    return out
  rows = gpu_compile.summary([
      r("a.py x [s] vmap init", "0.10.2", 2.0), r("a.py x [s] vmap dispatch", "0.10.2", 30.0),
      r("a.py y [s] vmap init", "0.10.2", same_as="a.py x [s] vmap init"),
      r("a.py x [s] vmap dispatch", "0.11.2", 20.0, error="JaxRuntimeError: ..."),
      r("b.py z [s] vmap init", "0.10.2", same_as="a.py x [s] vmap init")]).splitlines()[2:]
  assert rows == [
      "| a.py | 0.10.2 | 1 | 3 | 2 | 30.0 + 3.0 | x [s] vmap dispatch |",
      "| a.py | 0.11.2 | 1 | 1 | 1 | 20.0 + 2.0 (no executable) | x [s] vmap dispatch |",
      "| b.py | 0.10.2 | 1 | 1 | 0 | - | - |"]
