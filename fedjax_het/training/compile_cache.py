"""JAX's persistent compilation cache for runs and sweeps.

A round of a heterogeneous federation compiles for tens of seconds on CPU (minutes for
the largest GPU programs). With the cache on, every later run of the same program (a
resumed run, the other seeds of a sweep cell, a rerun) loads the executable instead.

``--compile_cache`` of ``experiments/main.py`` and ``experiments/sweep.py``: a
directory, ``default`` (``$FEDJAX_HET_CACHE`` or ``$XDG_CACHE_HOME/fedjax_het/xla``,
``~/.cache/fedjax_het/xla`` by default) or ``off``.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import jax
from jax.experimental.compilation_cache import compilation_cache as jax_cache

OFF = "off"
DEFAULT = "default"
# The process-wide JAX settings ``enable`` changes (``enabled`` puts them back).
SETTINGS = ("jax_compilation_cache_dir", "jax_persistent_cache_min_compile_time_secs",
            "jax_persistent_cache_min_entry_size_bytes")


def settings() -> dict:
  """The process's current values of the JAX settings ``enable`` changes (``SETTINGS``)."""
  return {name: getattr(jax.config, name) for name in SETTINGS}


def default_dir() -> str:
  """The user cache directory of compiled programs."""
  if os.environ.get("FEDJAX_HET_CACHE"):
    return os.environ["FEDJAX_HET_CACHE"]
  root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
  return os.path.join(root, "fedjax_het", "xla")


def resolve(setting: str) -> str | None:
  """The cache directory a ``--compile_cache`` value names, or None for ``off``."""
  if not setting or setting == DEFAULT:
    return default_dir()
  if setting == OFF:
    return None
  return os.path.abspath(os.path.expanduser(setting))


def enable(setting: str = DEFAULT, *, min_compile_secs: float = 1.0) -> str | None:
  """Turns the persistent cache on (every compiled program is stored) or leaves it off.

  Call it before the process compiles anything: JAX opens its cache once, at the first
  compilation.

  A cache directory already set in the environment (``JAX_COMPILATION_CACHE_DIR``, as the
  test suite does) is kept unless ``setting`` names another directory.

  Args:
    setting: a directory, ``'default'`` or ``'off'``.
    min_compile_secs: programs that compile faster than this are not stored.

  Returns:
    the directory in use, or None when off.
  """
  path = resolve(setting)
  if path is None:
    return None
  if setting in ("", DEFAULT) and os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    path = os.environ["JAX_COMPILATION_CACHE_DIR"]
  os.makedirs(path, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", path)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", min_compile_secs)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
  return path


@contextlib.contextmanager
def enabled(setting: str = DEFAULT, *,
            min_compile_secs: float = 1.0) -> Iterator[str | None]:
  """``enable`` for the block, then the process's previous cache settings again.

  For entry points whose ``main`` is also called inside another process (a benchmark
  under the test suite): the cache they time into, or its minimum compile time, must not
  outlive them there. JAX's cache is reset on entry and on exit, so the first
  compilation in the block opens its directory (even in a process that has compiled
  before), and the first after it the restored one.

  Yields:
    the directory in use, or None when off.
  """
  saved = settings()
  jax_cache.reset_cache()
  try:
    yield enable(setting, min_compile_secs=min_compile_secs)
  finally:
    for name, value in saved.items():
      jax.config.update(name, value)
    jax_cache.reset_cache()
