"""Per-platform compile settings: XLA options of inits and dispatches, jax's threefry kernel."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het.training import compile_options
from fedjax_het.training import experiment
from fedjax_het.training import program

THREEFRY = "jax_threefry_gpu_kernel_lowering"


def test_init_compiler_options_lower_only_the_cpu_level_not_set_lower(monkeypatch):
  monkeypatch.delenv(compile_options.INIT_LEVEL_ENV, raising=False)  # conftest's 0
  assert compile_options.init_compiler_options("cpu", "") == {"xla_backend_optimization_level": 1}
  assert compile_options.init_compiler_options("cpu", "--xla_cpu_use_thunk_runtime=true") == {
      "xla_backend_optimization_level": 1}
  assert compile_options.init_compiler_options("cpu", "--xla_backend_optimization_level=3") == {
      "xla_backend_optimization_level": 1}
  # the suite's level 0 (conftest) and a level 1 are the user's: kept
  for level in (0, 1):
    assert compile_options.init_compiler_options(
        "cpu", f"--xla_backend_optimization_level={level} --foo") is None
  assert compile_options.init_compiler_options("gpu", "") is None
  assert compile_options.init_compiler_options("tpu", "") is None


def test_the_init_level_variable_sets_a_cpu_inits_level_whatever_xla_flags_say():
  env = {compile_options.INIT_LEVEL_ENV: "0"}
  for flags in ("", "--xla_backend_optimization_level=1", "--xla_backend_optimization_level=3"):
    assert compile_options.init_compiler_options("cpu", flags, env) == {
        "xla_backend_optimization_level": 0}
  assert compile_options.init_compiler_options("cpu", "", {compile_options.INIT_LEVEL_ENV: " 2"}
                                               ) == {"xla_backend_optimization_level": 2}
  assert compile_options.init_compiler_options("cpu", "", {compile_options.INIT_LEVEL_ENV: ""}
                                               ) == {"xla_backend_optimization_level": 1}
  assert compile_options.init_compiler_options("gpu", "", env) is None
  for bad in ("4", "-1", "fast", "1.0"):
    with pytest.raises(ValueError, match=rf"FEDJAX_HET_INIT_LEVEL='{bad}'.*0 to 3"):
      compile_options.init_compiler_options("cpu", "", {compile_options.INIT_LEVEL_ENV: bad})


def test_dispatch_options_on_gpus_leave_to_the_user_what_xla_flags_set():
  both = {"xla_gpu_enable_triton_gemm": False,
          "xla_disable_hlo_passes": "triton-softmax-rewriter"}
  assert compile_options.dispatch_compiler_options("gpu", "") == both
  assert compile_options.dispatch_compiler_options(
      "gpu", "--xla_gpu_autotune_level=4 --foo") == both
  for flags in ("--xla_gpu_enable_triton_gemm=true", "--xla_gpu_enable_triton_gemm=false"):
    assert compile_options.dispatch_compiler_options("gpu", flags) == {
        "xla_disable_hlo_passes": "triton-softmax-rewriter"}
  # the user's own list of passes to skip replaces the library's (the pass left on)
  assert compile_options.dispatch_compiler_options(
      "gpu", "--xla_disable_hlo_passes=no-such-pass") == {"xla_gpu_enable_triton_gemm": False}
  assert compile_options.dispatch_compiler_options(
      "gpu", "--xla_gpu_enable_triton_gemm=true --xla_disable_hlo_passes=x") is None
  assert compile_options.dispatch_compiler_options("cpu", "") is None
  assert compile_options.dispatch_compiler_options("tpu", "") is None
  # a copy: a caller editing it leaves the next run's options alone
  compile_options.dispatch_compiler_options("gpu", "")["xla_gpu_enable_triton_gemm"] = True
  assert compile_options.GPU_DISPATCH_OPTIONS == both


def test_the_gpu_dispatch_options_are_options_this_xla_knows():
  # XLA checks an option's name against its DebugOptions on every client (the CPU's
  # too): a misspelt one is refused, so these compile only if the GPU will take them
  x = jnp.arange(3.0)
  f = jax.jit(lambda a: a * 2, compiler_options=dict(compile_options.GPU_DISPATCH_OPTIONS))
  np.testing.assert_array_equal(f(x), [0.0, 2.0, 4.0])
  with pytest.raises(Exception, match="xla_gpu_enable_triton_gemmm"):
    jax.jit(lambda a: a * 2, compiler_options={"xla_gpu_enable_triton_gemmm": False})(x)


def test_the_dispatch_is_compiled_with_the_platforms_options(tiny_config, monkeypatch):
  asked = []

  def options(platform, xla_flags=None):
    asked.append(platform)
    return {"xla_no_such_option_here": True}  # refused by the compiler: proves it arrives
  monkeypatch.setattr(compile_options, "dispatch_compiler_options", options)
  exp = experiment.prepare(tiny_config(models="tiny"), place=True)
  dispatch = program.compile_dispatch(exp, 1)
  abstract = program.compile_fns(exp).abstract
  with pytest.raises(Exception, match="xla_no_such_option_here"):
    dispatch.jitted.lower(abstract, exp.data, np.int32(1), dispatch.schedule).compile()
  assert asked == ["cpu"]


@pytest.fixture
def threefry_restored():
  before = jax.config.jax_threefry_gpu_kernel_lowering
  yield
  jax.config.update(THREEFRY, before)


def test_threefry_kernel_is_turned_on_for_gpus_only(threefry_restored):
  jax.config.update(THREEFRY, False)
  assert compile_options.use_threefry_kernel("cpu", environ={}) is False
  assert compile_options.use_threefry_kernel("tpu", environ={}) is False
  assert jax.config.jax_threefry_gpu_kernel_lowering is False
  assert compile_options.use_threefry_kernel("gpu", environ={}) is True
  assert jax.config.jax_threefry_gpu_kernel_lowering is True


def test_threefry_kernel_left_as_the_user_set_it(threefry_restored):
  jax.config.update(THREEFRY, False)  # as JAX_THREEFRY_GPU_KERNEL_LOWERING=0 would
  env = {compile_options.THREEFRY_ENV: "0"}
  assert compile_options.use_threefry_kernel("gpu", environ=env) is False
  assert jax.config.jax_threefry_gpu_kernel_lowering is False


def test_jit_init_sets_up_its_platform(monkeypatch):
  seen = []
  monkeypatch.setattr(compile_options, "use_threefry_kernel", seen.append)
  program.jit_init(lambda key: jax.random.normal(key, (2,)), "gpu")
  program.jit_init(lambda key: jax.random.normal(key, (2,)), "cpu")
  assert seen == ["gpu", "cpu"]
