"""The persistent compilation cache of runs and sweeps."""
import os
import subprocess
import sys

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
