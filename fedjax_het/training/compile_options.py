"""How a run's programs are compiled on each platform: XLA options and jax's threefry lowering.

Each setting here changes how long a program takes to compile, not what it computes
(at most the float rounding of a different kernel), and each was measured
(docs/performance.md):

- ``init_compiler_options``: an init on CPU compiles at XLA's backend optimization
  level 1 (the same draws, a third of the compile), or at the level
  ``FEDJAX_HET_INIT_LEVEL`` names (0: a third again, the draws' last bits may differ).
- ``dispatch_compiler_options``: a dispatch on a GPU compiles without Triton's GEMM
  fusions (XLA's cuBLAS path instead), whose autotuning took 114 s of the Moss claims
  cell's 228 s compile on one H200, and without XLA's Triton softmax rewrite, which
  made FedMoE's dispatch compile for over 24 minutes.
- ``use_threefry_kernel``: on a GPU, jax lowers each threefry hash to one kernel call
  instead of 20 rounds unrolled inline: the claims cut's init compiled in 2 s instead of
  44 s on one H200, with the same bits in all 340 leaves.

A setting the user has made (in ``XLA_FLAGS``, ``FEDJAX_HET_INIT_LEVEL`` or
``JAX_THREEFRY_GPU_KERNEL_LOWERING``) is kept.
"""
from __future__ import annotations

import os
import re

import jax

# XLA's backend optimization level of an init program on CPU (``program.jit_init``)
INIT_OPTIMIZATION_LEVEL = 1
# the environment variable naming another level for CPU inits (``init_level``)
INIT_LEVEL_ENV = "FEDJAX_HET_INIT_LEVEL"

# the XLA options of a dispatch on a GPU (``dispatch_compiler_options``)
GPU_DISPATCH_OPTIONS = {"xla_gpu_enable_triton_gemm": False,
                        "xla_disable_hlo_passes": "triton-softmax-rewriter"}

THREEFRY_ENV = "JAX_THREEFRY_GPU_KERNEL_LOWERING"


def _xla_flags(xla_flags: str | None) -> str:
  return os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags


def unset_by_flags(options: dict, xla_flags: str | None = None) -> dict:
  """``options`` but those ``XLA_FLAGS`` (default: the environment's) set themselves
  (``--<name>``): the user's setting is kept."""
  flags = _xla_flags(xla_flags)
  return {k: v for k, v in options.items() if f"--{k}" not in flags}


def init_level(environ=None) -> int | None:
  """The CPU init level ``FEDJAX_HET_INIT_LEVEL`` names (0 to 3), or None where it is unset.

  Level 0 compiles an init about three times faster than level 1 (a tiny FedMRL of 8
  clients: 12.6 s -> 4.6 s on a 2-core machine) but runs its draws slower and may change
  their last bits (docs/performance.md): for many short runs, such as the test suite's.

  Raises:
    ValueError: the variable is set to anything but 0, 1, 2 or 3.
  """
  environ = os.environ if environ is None else environ
  value = environ.get(INIT_LEVEL_ENV, "").strip()
  if not value:
    return None
  if value not in ("0", "1", "2", "3"):
    raise ValueError(f"{INIT_LEVEL_ENV}={value!r}: an XLA backend optimization level, 0 to 3")
  return int(value)


def init_compiler_options(platform: str, xla_flags: str | None = None,
                          environ=None) -> dict | None:
  """The XLA options ``program.jit_init`` compiles an init with on ``platform``, or None.

  An init draws every parameter of every client once: a program of many small threefry
  loops whose LLVM optimisation costs most of its compile and buys nothing (it runs
  once). On CPU it compiles at backend optimization level 1 instead of XLA's default:
  the claims ledger's FedMoE init (N = 100, CNN-1..5) 32.8 s -> 11.2 s, FedMRL ``:cpu``'s
  29.4 s -> 15.3 s on a 2-core machine, with the same bits in every leaf
  (``benchmarks/init_compile.py``, docs/performance.md). A level that ``XLA_FLAGS``
  already sets at or below it is kept (the test suite's 1, tests/conftest.py). Other
  platforms keep XLA's defaults: on one H200 levels 0 and 1 compiled that init slower
  than the default (81 and 87 s against 44 s, each beside other compiles); what pays
  there is jax's threefry kernel (``use_threefry_kernel``: 44 s -> 2 s).

  ``FEDJAX_HET_INIT_LEVEL`` (``init_level``), where set, is the level of a CPU init
  whatever ``XLA_FLAGS`` say.

  Args:
    platform: the devices' platform ('cpu', 'gpu', 'tpu').
    xla_flags: the ``XLA_FLAGS`` to respect (default: the environment's).
    environ: the environment ``FEDJAX_HET_INIT_LEVEL`` is read from (default
      ``os.environ``).
  """
  if platform != "cpu":
    return None
  level = init_level(environ)
  if level is not None:
    return {"xla_backend_optimization_level": level}
  set_level = re.findall(r"--xla_backend_optimization_level=(\d+)", _xla_flags(xla_flags))
  if set_level and int(set_level[-1]) <= INIT_OPTIMIZATION_LEVEL:
    return None
  return {"xla_backend_optimization_level": INIT_OPTIMIZATION_LEVEL}


def dispatch_compiler_options(platform: str, xla_flags: str | None = None) -> dict | None:
  """The XLA options ``program.compile_dispatch`` compiles a run's rounds with, or None.

  On a GPU (``GPU_DISPATCH_OPTIONS``):

  - no Triton GEMM fusions: XLA autotunes each such fusion by compiling candidate
    kernels; in the Moss claims cell (N = 100, CNN-1..5, one seed, ``vmap``) that took
    114 s of a 228 s compile, and without the fusions the program compiled in 46.6 s
    and ran a round in 0.165 s against 0.161 s (one H200, 2026-11-28;
    ``--xla_gpu_autotune_level=0`` compiled in 58.5 s but ran 12x slower, since it also
    stops choosing the convolutions' algorithms);
  - XLA's ``triton-softmax-rewriter`` pass off: it makes a Triton fusion of every small
    reduce-then-broadcast (FedMoE's two-expert gate softmax, the gate's normalisation,
    each cross-entropy's log-softmax over the classes), and ``priority-fusion`` then
    searches Triton tilings for each: FedMoE's P1 dispatch did not finish compiling in
    24 min (deviceless, H100 target) and compiled in about 32 CPU-s without the pass
    (docs/performance.md, "Compiling for a GPU without one"). Those rows are at most a
    few hundred floats wide, where XLA's own fusions serve as well.

  Other platforms keep XLA's defaults, and an option that ``XLA_FLAGS`` set themselves
  (``--xla_gpu_enable_triton_gemm``, ``--xla_disable_hlo_passes``) is left to them.

  Args:
    platform: the devices' platform ('cpu', 'gpu', 'tpu').
    xla_flags: the ``XLA_FLAGS`` to respect (default: the environment's).
  """
  if platform != "gpu":
    return None
  return unset_by_flags(GPU_DISPATCH_OPTIONS, xla_flags) or None


def use_threefry_kernel(platform: str, environ=None) -> bool:
  """Turns on jax's threefry kernel lowering on a GPU; returns whether it is on.

  jax lowers each threefry hash on a GPU to 20 rounds unrolled inline unless
  ``jax_threefry_gpu_kernel_lowering`` is set; an init of the claims cut (340 leaves
  of 100 clients' parameters and optimizer states) is mostly such hashes and compiled
  in 44 s, in 2 s with the kernel, drawing the same bits in all 340 leaves (one H200).
  The setting is jax's, for the whole process; it is part of jax's compile cache keys.
  On other platforms, or where ``JAX_THREEFRY_GPU_KERNEL_LOWERING`` is in the
  environment (the user's choice, either way), nothing is changed.

  Args:
    platform: the devices' platform.
    environ: the environment to read (default ``os.environ``).
  """
  environ = os.environ if environ is None else environ
  if platform == "gpu" and THREEFRY_ENV not in environ:
    jax.config.update("jax_threefry_gpu_kernel_lowering", True)
  return bool(jax.config.jax_threefry_gpu_kernel_lowering)
