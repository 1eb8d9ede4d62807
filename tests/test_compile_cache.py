"""The persistent compilation cache of runs and sweeps."""
import os
import subprocess
import sys

import jax
import jax.numpy as jnp

from fedjax_het.training import compile_cache


def test_settings_resolve(monkeypatch, tmp_path):
  monkeypatch.setenv("FEDJAX_HET_CACHE", str(tmp_path / "c"))
  assert compile_cache.resolve("default") == str(tmp_path / "c")
  assert compile_cache.resolve("") == str(tmp_path / "c")
  assert compile_cache.resolve("off") is None
  assert compile_cache.resolve("rel") == os.path.abspath("rel")
  monkeypatch.delenv("FEDJAX_HET_CACHE")
  monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
  assert compile_cache.default_dir() == str(tmp_path / "xdg" / "fedjax_het" / "xla")


PROGRAM = """
import sys
import jax, jax.numpy as jnp
from fedjax_het.training import compile_cache
assert compile_cache.enable(sys.argv[1], min_compile_secs=0) == sys.argv[1]
jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)(jnp.arange(7.0)).block_until_ready()
"""


def test_a_named_directory_receives_compiled_programs(tmp_path):
  # JAX opens its cache at the first compilation of a process: a fresh process, as the
  # entry points call ``enable`` before compiling anything.
  env = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
  path = str(tmp_path / "cache")
  subprocess.run([sys.executable, "-c", PROGRAM, path], check=True, env=env)
  assert os.listdir(path)


def test_enabled_holds_for_its_block_only(tmp_path):
  # a benchmark's main called inside the suite's processes (tests/test_benchmarks.py):
  # its cache directory (deleted after) and minimum compile time had outlived it there,
  # and a later test's 0.98 s compilation was then not stored
  before = compile_cache.settings()
  path = str(tmp_path / "block")
  jax.jit(lambda x: jnp.sin(x) - 1.0)(jnp.arange(4.0)).block_until_ready()  # JAX's opened
  with compile_cache.enabled(path, min_compile_secs=0) as used:
    assert used == path
    assert jax.config.jax_compilation_cache_dir == path
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    jax.jit(lambda x: jnp.cos(x) * 5.0 - 2.0)(jnp.arange(5.0)).block_until_ready()
  assert os.listdir(path)  # opened in a process that had compiled before the block
  assert compile_cache.settings() == before
  stored = set(os.listdir(path))
  jax.jit(lambda x: jnp.tan(x) + 4.0)(jnp.arange(3.0)).block_until_ready()
  assert set(os.listdir(path)) == stored  # the block's directory is closed after it
