"""What a run ran on: package versions, JAX backend and host CPU, for ``summary.json``.

Two runs of one config and seed give identical numbers on one machine, but can drift
apart after a few rounds on another (docs/reliability.md, "Determinism"): XLA:CPU
compiles for the host's vector instructions, and a fresh install may bring other
versions of the unpinned packages. ``describe()`` records both, so that two summaries
that differ say which of the two changed.
"""
from __future__ import annotations

import importlib.metadata
import platform
import sys

import jax

# the packages whose versions can change a run's numbers
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "chex", "numpy",
            "ml-collections")
# x86 and Arm vector extensions XLA:CPU may compile for (as /proc/cpuinfo names them)
VECTOR_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni",
                "avx512_bf16", "amx_tile", "asimd", "sve")


def package_versions(names=PACKAGES) -> dict[str, str | None]:
  """``{distribution: version}``; None for one that is not installed."""
  out = {}
  for name in names:
    try:
      out[name] = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      out[name] = None
  return out


def host_cpu(cpuinfo: str | None = None) -> dict:
  """The host CPU's model and the vector extensions of ``VECTOR_FLAGS`` it has.

  Args:
    cpuinfo: the text of /proc/cpuinfo (read on Linux when None; elsewhere the model is
      ``platform.processor()`` and the extensions are not known).

  Returns:
    ``{"model": str, "vector_extensions": [str] | None}``.
  """
  if cpuinfo is None:
    try:
      with open("/proc/cpuinfo") as f:
        cpuinfo = f.read()
    except OSError:
      return {"model": platform.processor() or platform.machine(), "vector_extensions": None}
  fields = {}
  for line in cpuinfo.splitlines():
    key, sep, value = line.partition(":")
    if sep:
      fields.setdefault(key.strip(), value.strip())  # the first processor's
  flags = set((fields.get("flags") or fields.get("Features") or "").split())
  model = (fields.get("model name") or fields.get("Model") or platform.processor()
           or platform.machine())
  return {"model": model, "vector_extensions": [f for f in VECTOR_FLAGS if f in flags]}


def describe() -> dict:
  """The ``environment`` block of ``summary.json`` (of the process that writes it)."""
  devices = jax.devices()
  return {"python": platform.python_version(),
          "packages": package_versions(),
          "backend": jax.default_backend(),
          "device_kind": devices[0].device_kind,
          "visible_devices": len(devices),
          "processes": jax.process_count(),
          "machine": platform.machine(),
          "system": sys.platform,
          "cpu": host_cpu()}
