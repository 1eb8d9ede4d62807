r"""A run's programs compiled for a GPU on a machine without one (deviceless, ahead of time).

XLA compiles for a GPU it is only told about: jax's CUDA plugin (``pip install -e
'.[gpu-aot]'``: ``jax[cuda12]`` at the project's jax version) takes a target
description (``gpu_targets/``, XLA's ``GpuTargetConfig`` of a card) through
``jax.experimental.topologies.get_topology_desc`` and gives compile-only devices. A
program jitted over a mesh of them, with its arguments given as ``jax.ShapeDtypeStruct``
placed there, runs every HLO pass, LLVM and ptxas (XLA logs "Performing a deviceless
compilation"); only autotuning, which times candidate kernels, and CUB's radix sort,
which XLA sizes through the CUDA runtime, need a device (``DEVICELESS_OPTIONS``).

  with deviceless.as_gpu():                   # trace as a GPU run would
    exp = deviceless.prepare(config, deviceless.devices("h100"))
    fns = program.compile_fns(exp)
    key = deviceless.abstract_value(jax.random.PRNGKey(0), exp.runtime.mesh)
    compiled = fns.init.trace(key).lower().compile()

The program is the one a GPU run builds: ``as_gpu`` makes ``jax.default_backend()``
answer 'gpu' while the run is prepared and traced, so ``client_parallelism='auto'``
picks ``vmap``, the models take their GPU forms, and ``program`` compiles with the GPU's
options (``compile_options``). The plugin must be loaded beside the CPU backend without
a GPU: the process sets ``JAX_PLATFORMS=cpu`` before jax starts (the plugin then skips
its driver check and registers itself for compiling only). ``benchmarks/gpu_compile.py``
is the command; docs/performance.md ("Compiling for a GPU without one") its figures.
"""
from __future__ import annotations

import contextlib
import importlib.util
import os
from typing import Iterator
from unittest import mock

import jax
import numpy as np

from fedjax_het import data as data_lib
from fedjax_het import sharding
from fedjax_het.training import compile_options
from fedjax_het.training import experiment

# the cards a program can be compiled for: name -> XLA target description in gpu_targets/
TARGETS = {"h100": "h100_sxm.txtpb"}
TARGET_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_targets")
# What needs a device, off where there is none: XLA's autotuning times candidate kernels
# on it; its rewrite of a long 1-D sort into CUB's radix sort asks the CUDA runtime when
# the executable is made (a sort of 100,000 float32 compiled deviceless: every pass and
# LLVM ran, then "cudaErrorInvalidDevice"; Moss's one-seed N=100 dispatch did the same),
# so such a sort compiles to XLA's own kernel here (docs/performance.md)
DEVICELESS_OPTIONS = {"xla_gpu_autotune_level": 0, "xla_gpu_enable_cub_radix_sort": False}


def compiler_options(xla_flags: str | None = None) -> dict:
  """What a deviceless compile adds to a program's own options: ``DEVICELESS_OPTIONS``,
  but those ``XLA_FLAGS`` (default: the environment's) set themselves."""
  return compile_options.unset_by_flags(DEVICELESS_OPTIONS, xla_flags)


def target_config(target: str) -> str:
  """The text of ``target``'s XLA ``GpuTargetConfig`` (``TARGETS``).

  Raises:
    ValueError: ``target`` is not one of ``TARGETS``.
  """
  if target not in TARGETS:
    raise ValueError(f"--target={target!r}: valid targets are {sorted(TARGETS)}")
  with open(os.path.join(TARGET_DIR, TARGETS[target])) as f:
    return f.read()


# jax's CUDA plugins, one per CUDA major version (the gpu-aot extra installs CUDA 12's)
CUDA_PLUGINS = ("jax_plugins.xla_cuda12", "jax_plugins.xla_cuda13")


def plugin_installed() -> bool:
  """Whether one of jax's CUDA plugins (``CUDA_PLUGINS``; the ``gpu-aot`` extra) is
  importable."""
  for name in CUDA_PLUGINS:
    try:
      if importlib.util.find_spec(name) is not None:
        return True
    except ModuleNotFoundError:  # no jax_plugins namespace at all
      return False
  return False


def devices(target: str) -> list:
  """The compile-only devices of one ``target`` card (``TARGETS``).

  Raises:
    ValueError: an unknown target.
    RuntimeError: the CUDA plugin is not installed, or not loaded (the process started
      jax without ``JAX_PLATFORMS=cpu`` on a machine with no GPU driver), each with the
      line that says what to do.
  """
  config = target_config(target)
  if not plugin_installed():
    raise RuntimeError("deviceless GPU compiles need jax's CUDA plugin: pip install -e "
                       "'.[gpu-aot]' (jax[cuda12] at the installed jax's version)")
  from jax.experimental import topologies  # noqa: PLC0415 - only where compiling for a GPU
  try:
    topology = topologies.get_topology_desc(platform="cuda", target_config=config,
                                            topology="1x1x1")
  except NotImplementedError as err:
    raise RuntimeError(
        "jax's CUDA plugin is installed but not loaded: on a machine without a GPU "
        "driver start the process with JAX_PLATFORMS=cpu (benchmarks/gpu_compile.py "
        f"does) ({err})") from err
  return list(topology.devices)


@contextlib.contextmanager
def as_gpu() -> Iterator[None]:
  """Within: ``jax.default_backend()`` answers 'gpu', as in a run on a GPU.

  The library reads the backend where it chooses a program's form (``clients``'
  ``auto`` parallelism, the models' CPU kernels, ``compile_options``); jax's own
  dispatch does not read this name, so arrays still live on the CPU.
  """
  with mock.patch.object(jax, "default_backend", lambda: "gpu"):
    yield


def prepare(config, target_devices: list, **kwargs) -> experiment.Experiment:
  """``experiment.prepare`` on a mesh of ``target_devices``, its data left on the host.

  ``config.runtime.num_devices`` counts the target's devices (0: all of them). The data
  stay numpy (``place=False``): ``abstract_data`` gives the program's view of them.
  ``kwargs``: passed to ``experiment.prepare`` (``build``).
  """
  return experiment.prepare(config, place=False, devices=target_devices, **kwargs)


def _shaped(a, spec) -> jax.ShapeDtypeStruct:
  return jax.ShapeDtypeStruct(np.shape(a), a.dtype, sharding=spec)


def abstract_data(fed: data_lib.FederatedData, mesh,
                  replicas: bool = False) -> data_lib.FederatedData:
  """``fed`` as the program sees it placed on ``mesh`` (``experiment.place_data``), shapes only.

  ``replicas``: the client tables have a leading replica axis (``program.replica_data``).
  """
  rep = sharding.replicated(mesh)
  cli = sharding.client_sharding(mesh, replicas)
  return fed.replace(x=_shaped(fed.x, rep), y=_shaped(fed.y, rep),
                     groups=jax.tree.map(lambda a: _shaped(a, cli), fed.groups))


def abstract_value(value, mesh) -> jax.ShapeDtypeStruct:
  """A host value (a key, a scalar, a numpy array) as an argument replicated on ``mesh``."""
  return _shaped(np.asarray(value), sharding.replicated(mesh))


def stacked(abstract, num: int, shardings):
  """Abstract leaves with a leading axis of ``num`` (replicas), each with its sharding."""
  return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct((num,) + a.shape, a.dtype,
                                                        sharding=s), abstract, shardings)
