"""Digest of P1's first cell's init (FedMoE, N=100, seed 0) under this process's threefry lowering.

  JAX_THREEFRY_GPU_KERNEL_LOWERING=1 python threefry_bits.py OUT.npz
Writes each leaf's bytes as a sha256 hex digest; run once with the switch and once
without, and compare the two files.
"""
import hashlib
import sys
import time

import jax
import numpy as np

sys.path.insert(0, "benchmarks")
from init_compile import load  # noqa: E402

from fedjax_het import cli as cli_lib  # noqa: E402
from fedjax_het.training import experiment  # noqa: E402


class A:
  config = None
  sweep = "experiments/claims/p1_classes.py"
  algorithm = "fedmoe"
  configs_dir = "experiments"
  set = []


cli_lib.quiet([""])
config = load(A)
exp = experiment.prepare(config, place=False)
key = jax.random.PRNGKey(config.seed)
t = time.perf_counter()
state = jax.block_until_ready(jax.jit(exp.algorithm.init)(key))
leaves = [np.asarray(x) for x in jax.tree.leaves(state)]
digests = [hashlib.sha256(x.tobytes()).hexdigest() for x in leaves]
np.savez(sys.argv[1], digests=np.array(digests))
print(f"threefry kernel {jax.config.jax_threefry_gpu_kernel_lowering}: {len(leaves)} leaves, "
      f"init compiled and run in {time.perf_counter() - t:.1f} s on {jax.default_backend()}",
      flush=True)
