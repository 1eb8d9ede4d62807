r"""Wall time of one training round after compilation.

Default: 100 clients of CNN-1 (FedAvg-style local training), 500 examples each, batch
50, one local epoch, C=100% -- the round issue #2 compares with a per-client PyTorch loop
(~2 s on an H100) and a plain ``jax.vmap`` (~0.12 s).

  python benchmarks/round_time.py                       # the default round
  python benchmarks/round_time.py --clients=10 --algorithm=fedmrl --models=heterogeneous
  python benchmarks/round_time.py --parallelism=vmap    # force vmap (default: auto)

Prints one line per measurement: seconds per round (median of --repeats), examples/s.
Data are synthetic (class-dependent noise); shapes are those of CIFAR-10.
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from fedjax_het import config as config_lib
from fedjax_het import data as data_lib
from fedjax_het import models, sharding
from fedjax_het.clients import resolve_parallelism
from fedjax_het.algorithms import SPECS
from fedjax_het.training import loop


def build(args):
  """(experiment-like pieces) for a synthetic federation of equal-size clients."""
  n, k = args.clients, args.examples
  raw = data_lib.make_synthetic(n * k + n * args.test_examples, 0, 10, seed=0)
  train = [np.arange(i * k, (i + 1) * k) for i in range(n)]
  base = n * k
  test = [base + np.arange(i * args.test_examples, (i + 1) * args.test_examples)
          for i in range(n)]
  c = config_lib.base_config()
  c.algorithm, c.models = args.algorithm, args.models
  c.batch_size, c.local_epochs, c.participation = args.batch, args.epochs, args.participation
  c.runtime.client_parallelism = args.parallelism
  c.runtime.compute_dtype = args.dtype
  config_lib.validate(c)
  c = config_lib.with_algo_defaults(c)
  mesh = sharding.client_mesh(0)
  archs = models.client_archs(c.models, n)
  fed, layout = data_lib.build_federated_data(
      raw.x_train, raw.y_train, train, test, archs, num_classes=10,
      pad_clients_to=mesh.size, pad_examples_to=c.batch_size)
  rt = loop.make_runtime(c, layout, mesh)
  alg = SPECS[c.algorithm].build(c, rt)
  return rt, alg, loop.place_data(fed, mesh)


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--algorithm", default="fedavg", choices=sorted(SPECS))
  p.add_argument("--models", default="cnn1")
  p.add_argument("--clients", type=int, default=100)
  p.add_argument("--examples", type=int, default=500)
  p.add_argument("--test_examples", type=int, default=50)
  p.add_argument("--batch", type=int, default=50)
  p.add_argument("--epochs", type=int, default=1)
  p.add_argument("--participation", type=float, default=1.0)
  p.add_argument("--parallelism", default="auto", choices=["auto", "vmap", "sequential"])
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
  p.add_argument("--repeats", type=int, default=5)
  args = p.parse_args()
  rt, alg, fed = build(args)
  exp = loop.Experiment(None, rt, alg, fed, None, None)
  init, run_rounds, _, _ = loop.compile_fns(exp)
  state = init(jax.random.PRNGKey(0))
  t = time.perf_counter()
  state, m = run_rounds(state, fed, 1)
  jax.block_until_ready(state)
  compile_s = time.perf_counter() - t
  times = []
  for _ in range(args.repeats):
    t = time.perf_counter()
    state, m = run_rounds(state, fed, 1)
    jax.block_until_ready(state)
    times.append(time.perf_counter() - t)
  sec = statistics.median(times)
  clients = sum(rt.slots(g)[0] for g in range(rt.layout.num_groups))
  examples = clients * args.examples * args.epochs
  print(f"backend={jax.default_backend()} devices={jax.device_count()} "
        f"parallelism={resolve_parallelism(args.parallelism)} "
        f"algorithm={args.algorithm} models={args.models} clients/round={clients} "
        f"examples/client={args.examples} batch={args.batch} dtype={args.dtype}")
  print(f"first call (compile + 1 round) {compile_s:.2f} s; round {sec:.4f} s "
        f"(median of {args.repeats}, min {min(times):.4f}); {examples / sec:,.0f} examples/s; "
        f"train loss {float(m['train_loss'][-1]):.4f}")


if __name__ == "__main__":
  main()
