r"""Wall time of one training round after compilation.

Default: 100 clients of CNN-1 (FedAvg-style local training), 500 examples each, batch
50, one local epoch, C=100% -- the round issue #2 compares with a per-client PyTorch loop
(~2 s on an H100) and a plain ``jax.vmap`` (~0.12 s).

  python benchmarks/round_time.py                       # the default round
  python benchmarks/round_time.py --clients=10 --algorithm=fedmrl --models=heterogeneous
  python benchmarks/round_time.py --parallelism=vmap    # force vmap (default: auto)

Prints one line per measurement: seconds per round (median of --repeats), examples/s.
Data are synthetic (class-dependent noise); shapes are those of CIFAR-10.
``build`` and ``time_rounds`` are reused by ``benchmarks/compare.py``.
"""
from __future__ import annotations

import argparse
import statistics
import time

import jax
import numpy as np

from fedjax_het import config as config_lib
from fedjax_het import data as data_lib
from fedjax_het import sharding
from fedjax_het import validation
from fedjax_het.algorithms import SPECS
from fedjax_het.clients import resolve_parallelism
from fedjax_het.models import client_archs
from fedjax_het.training import experiment
from fedjax_het.training import program


def build(*, algorithm: str = "fedavg", models: str = "cnn1", clients: int = 100,
          examples: int = 500, test_examples: int = 50, batch: int = 50, epochs: int = 1,
          participation: float = 1.0, parallelism: str = "auto", dtype: str = "float32",
          num_devices: int = 0, seed: int = 0):
  """A synthetic federation of equal-size clients, ready for ``program.compile_fns``.

  Args:
    algorithm: a key of ``SPECS``.
    models: the config key ``models`` ('cnn1', 'heterogeneous', ...).
    clients: N; every client holds ``examples`` train and ``test_examples`` test images.
    batch, epochs, participation: B, E, C.
    parallelism: ``runtime.client_parallelism``.
    dtype: ``runtime.compute_dtype``.
    num_devices: devices of the client mesh (0: all).
    seed: seed of the synthetic images.

  Returns:
    ``experiment.Experiment`` (config, runtime, algorithm, placed data; no class counts).
  """
  n, k, t = clients, examples, test_examples
  raw = data_lib.make_synthetic(n * (k + t), 0, 10, seed=seed)
  train = [np.arange(i * k, (i + 1) * k) for i in range(n)]
  test = [n * k + np.arange(i * t, (i + 1) * t) for i in range(n)]
  c = config_lib.base_config()
  c.algorithm, c.models, c.num_clients = algorithm, models, n
  c.batch_size, c.local_epochs, c.participation = batch, epochs, participation
  c.runtime.client_parallelism = parallelism
  c.runtime.compute_dtype = dtype
  c.runtime.num_devices = num_devices
  validation.validate(c)
  c = validation.with_algo_defaults(c)
  mesh = sharding.client_mesh(num_devices)
  archs = tuple(client_archs(c.models, n))
  fed, layout = data_lib.build_federated_data(
      raw.x_train, raw.y_train, train, test, archs, num_classes=10,
      pad_clients_to=mesh.size, pad_examples_to=c.batch_size)
  rt = experiment.make_runtime(c, layout, mesh)
  alg = SPECS[c.algorithm].build(c, rt)
  return experiment.Experiment(c, rt, alg, experiment.place_data(fed, mesh), None, archs)


def clients_per_round(rt) -> int:
  """Real clients that train in one round (padding slots excluded)."""
  return sum(rt.slots(g)[0] for g in range(rt.layout.num_groups))


def time_rounds(exp, *, repeats: int = 5, rounds_per_dispatch: int = 1):
  """Times ``run_rounds`` of ``program.compile_fns`` after a first (compiling) call.

  Args:
    exp: from ``build``.
    repeats: timed calls.
    rounds_per_dispatch: rounds per call (one ``lax.scan``, as ``loop.run`` does between
      evaluations).

  Returns:
    (seconds of the first call, list of seconds per round of each timed call, the
    metrics of the last call).
  """
  fns = program.compile_fns(exp)
  init, run_rounds = fns.init, fns.run_rounds
  state = init(jax.random.PRNGKey(0))
  t = time.perf_counter()
  state, m = run_rounds(state, exp.data, rounds_per_dispatch)
  jax.block_until_ready(state)
  first = time.perf_counter() - t
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    state, m = run_rounds(state, exp.data, rounds_per_dispatch)
    jax.block_until_ready(state)
    times.append((time.perf_counter() - t) / rounds_per_dispatch)
  return first, times, m


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--algorithm", default="fedavg", choices=sorted(SPECS),
                 help="the algorithm whose round is timed")
  p.add_argument("--models", default="cnn1",
                 help="config.models: one architecture, a comma list or 'heterogeneous'")
  p.add_argument("--clients", type=int, default=100, help="clients N")
  p.add_argument("--examples", type=int, default=500,
                 help="training examples per client")
  p.add_argument("--test_examples", type=int, default=50,
                 help="test examples per client")
  p.add_argument("--batch", type=int, default=50, help="batch size B")
  p.add_argument("--epochs", type=int, default=1, help="local epochs E")
  p.add_argument("--participation", type=float, default=1.0,
                 help="fraction C of the clients sampled per round")
  p.add_argument("--parallelism", default="auto", choices=["auto", "vmap", "sequential"],
                 help="runtime.client_parallelism (auto: lax.map on CPU, vmap elsewhere)")
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                 help="runtime.compute_dtype")
  p.add_argument("--rounds_per_dispatch", type=int, default=1,
                 help="rounds per compiled call (lax.scan)")
  p.add_argument("--repeats", type=int, default=5,
                 help="timed calls (the median is reported)")
  args = p.parse_args()
  exp = build(algorithm=args.algorithm, models=args.models, clients=args.clients,
              examples=args.examples, test_examples=args.test_examples, batch=args.batch,
              epochs=args.epochs, participation=args.participation,
              parallelism=args.parallelism, dtype=args.dtype)
  first, times, m = time_rounds(exp, repeats=args.repeats,
                                rounds_per_dispatch=args.rounds_per_dispatch)
  sec = statistics.median(times)
  clients = clients_per_round(exp.runtime)
  examples = clients * args.examples * args.epochs
  print(f"backend={jax.default_backend()} devices={jax.device_count()} "
        f"parallelism={resolve_parallelism(args.parallelism)} "
        f"algorithm={args.algorithm} models={args.models} clients/round={clients} "
        f"examples/client={args.examples} batch={args.batch} dtype={args.dtype} "
        f"rounds/dispatch={args.rounds_per_dispatch}")
  print(f"first call (compile + {args.rounds_per_dispatch} round(s)) {first:.2f} s; "
        f"round {sec:.4f} s (median of {args.repeats}, min {min(times):.4f}); "
        f"{examples / sec:,.0f} examples/s; train loss {float(m['train_loss'][-1]):.4f}")


if __name__ == "__main__":
  main()
