"""What a run will cost before it runs: its FLOPs, and its time from a short calibration.

FLOPs come from XLA's cost analysis of the algorithm's own client step (its
``Protocol``), lowered on ONE minibatch: every loop of local training (epochs, steps) is
then one iteration, which XLA counts once, so the count is that of one SGD step on B
examples (augmentation, forward, backward, optimizer) and needs no compilation. Scaled by
the partition's real example counts, the rounds and the evaluations it gives the run's
useful FLOPs (padding and the server's aggregation are not counted):

- training: every round, each sampled client's train examples x E x its group's
  FLOPs per training example;
- protocol (a): every ``eval_every`` rounds (and the last), every client's test
  examples x the FLOPs of its model's prediction;
- protocol (b) (``eval_sampled``): every round, the sampled clients' test examples.

The time is estimated from a calibration: ``calibrate`` runs the run's own compiled
dispatch (``program.compile_dispatch``, the program ``loop.run`` uses, or for a batch of
seeds the replica-axis program of ``loop.run_seeds``, so with the persistent compilation
cache the run itself does not compile again) for one round (compilation) and then two
rounds (speed), giving seconds per round and the achieved FLOP/s; ``estimate_seconds``
applies them to any run.

Memory: on XLA:CPU a run peaks at about ``CPU_PEAK_PER_STATE`` times its state's bytes;
``memory_warning`` says so before a run whose states would not fit the memory available.
"""
from __future__ import annotations

import functools
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_het.models.preprocess import normalize
from fedjax_het.training import experiment
from fedjax_het.training import program


class Cost(NamedTuple):
  """The FLOPs of a run (useful work, see the module docstring).

  Attributes:
    train_flops_per_example: per group, one training example through one local step.
    predict_flops_per_example: per group, one test example through the client's model.
    round_flops: expected FLOPs of one round: local training plus, with
      ``eval_sampled``, the sampled clients' evaluation.
    eval_flops: one evaluation of every client (protocol (a)).
    total_flops: the whole run from round 0 (``num_rounds`` rounds, its evaluations).
    num_rounds: the run's rounds.
  """
  train_flops_per_example: tuple
  predict_flops_per_example: tuple
  round_flops: float
  eval_flops: float
  total_flops: float
  num_rounds: int


class Calibration(NamedTuple):
  """A measured dispatch of a run: compilation seconds, seconds and FLOP/s per round."""
  compile_s: float
  round_s: float
  flops_per_s: float


class _Data(NamedTuple):
  """The pooled-data argument of ``Protocol.client_update`` (``.x``, ``.y``)."""
  x: jax.ShapeDtypeStruct
  y: jax.ShapeDtypeStruct


# a CPU run's peak resident memory over its state's bytes, measured on the claims
# ledger's N = 100 FedMRL cell (2.36 GiB a seed) over 24 rounds checkpointed every 8,
# freed pages handed back after every dispatch (host_memory): one seed 5.21 GiB (2.2x),
# two on a replica axis 11.32 GiB (2.4x) (docs/performance.md, "Seeds on a replica axis")
CPU_PEAK_PER_STATE = 2.4


def tree_bytes(tree) -> int:
  """Bytes of the values of a tree of arrays or ``jax.ShapeDtypeStruct`` (a state)."""
  return int(sum(int(np.prod(a.shape)) * np.dtype(a.dtype).itemsize
                 for a in jax.tree.leaves(tree)))


def available_memory() -> int | None:
  """Bytes of memory available now (Linux's ``MemAvailable``), or None where unknown."""
  try:
    with open("/proc/meminfo") as f:
      for line in f:
        if line.startswith("MemAvailable:"):
          return int(line.split()[1]) * 1024
  except OSError:
    pass
  return None


def memory_warning(one_state: int, seeds: int, available: int | None) -> str | None:
  """A line warning that ``seeds`` states of ``one_state`` bytes may not fit in host
  memory (a CPU run: ``CPU_PEAK_PER_STATE`` x the states), or None if they fit or
  ``available`` is unknown."""
  need = CPU_PEAK_PER_STATE * seeds * one_state
  if available is None or need <= available:
    return None
  gib = lambda b: f"{b / 2**30:.1f} GiB"  # noqa: E731
  state = f"{one_state / 2**30:.2f} GiB"
  held = (f"{seeds} seeds on a replica axis hold {seeds} x {state} of state"
          if seeds > 1 else f"the run's state is {state}")
  advice = (f"run the seeds one at a time (a sweep's --seed_batch=1: about "
            f"{gib(CPU_PEAK_PER_STATE * one_state)} each)" if seeds > 1 else
            "free memory, or run fewer clients or smaller models")
  return (f"warning: {held}, and a CPU run peaks at about {CPU_PEAK_PER_STATE:g}x its "
          f"state (docs/performance.md): about {gib(need)}, more than the "
          f"{gib(available)} available now; it may be killed for memory: {advice}")


def _cost_device():
  """The device whose client lowers a program for its cost analysis: the CPU.

  XLA's cost analysis of an uncompiled program is offered by the CPU client: on a GPU
  (seen on an H200, jax 0.11.2), whose client sits behind PJRT's C API,
  ``Lowered.cost_analysis()`` returns None, and every run's FLOPs came out as 0. The
  unoptimised HLO and its count do not depend on the backend that would run it.
  None (the default device) where no CPU backend is loaded (``JAX_PLATFORMS``).
  """
  try:
    return jax.devices("cpu")[0]
  except RuntimeError:
    return None


def _flops(jitted, *args) -> float:
  """FLOPs of ``jitted(*args)`` (abstract args) from XLA's cost analysis, uncompiled."""
  device = _cost_device()
  with jax.default_device(device):
    analysis = jitted.lower(*args).cost_analysis()
  if isinstance(analysis, (list, tuple)):  # older JAX: one dict per program
    analysis = analysis[0]
  if not analysis or "flops" not in analysis:
    raise RuntimeError(
        f"XLA's cost analysis is unavailable: no FLOP count for a program lowered for "
        f"{device or jax.default_backend() + ' (no CPU backend loaded)'}; "
        "add 'cpu' to JAX_PLATFORMS, or run the sweep with --noestimate")
  return float(analysis["flops"])


def step_flops(exp) -> tuple[tuple, tuple]:
  """(train, predict) FLOPs per example of each group, from XLA's cost analysis.

  Lowers (does not compile) ``Protocol.client_update`` on one full minibatch and the
  client's ``predict`` on one batch of images, for the CPU whatever the backend
  (``_cost_device``).
  """
  proto, rt = exp.algorithm.protocol, exp.runtime
  if proto is None:
    raise ValueError(f"algorithm {exp.config.algorithm!r} has no Protocol: its FLOPs "
                     "cannot be estimated")
  b = rt.batch_size
  key = jax.random.PRNGKey(0)
  image = tuple(exp.data.x.shape[1:])
  data = _Data(jax.ShapeDtypeStruct((b,) + image, jnp.uint8),
               jax.ShapeDtypeStruct((b,), jnp.int32))
  idx = jax.ShapeDtypeStruct((b,), jnp.int32)
  mask = jax.ShapeDtypeStruct((b,), jnp.bool_)
  server = jax.eval_shape(proto.init_server, key)
  train, predict = [], []
  for g in range(rt.layout.num_groups):
    client = jax.eval_shape(functools.partial(proto.init_client, g), key)
    payload = jax.eval_shape(lambda s, g=g: proto.downlink(s, g), server)
    update = jax.jit(functools.partial(proto.client_update, g))
    train.append(_flops(update, client, payload, data, idx, mask, key) / b)

    def apply(client, payload, x, g=g):
      x = normalize(x, rt.normalization).astype(rt.compute_dtype)
      return proto.predict(g, client, payload)(x)
    predict.append(_flops(jax.jit(apply), client, payload, data.x) / b)
  return tuple(train), tuple(predict)


def run_cost(exp) -> Cost:
  """The FLOPs of ``exp``'s whole run (see the module docstring)."""
  config, rt = exp.config, exp.runtime
  train, predict = step_flops(exp)
  round_flops = eval_flops = 0.0
  for g, index in enumerate(exp.data.groups):
    n_g = rt.layout.group_sizes[g]
    share = rt.expected_sampled(g) / n_g  # each client's chance to train in a round
    num_train = float(np.sum(np.asarray(index.num_train)))
    num_test = float(np.sum(np.asarray(index.num_test)))
    round_flops += share * num_train * config.local_epochs * train[g]
    if config.eval_sampled:
      round_flops += share * num_test * predict[g]
    eval_flops += num_test * predict[g]
  # rounds r % eval_every == 0, and the last: ceil(T / eval_every) evaluations
  evals = -(-config.num_rounds // config.eval_every)
  total = config.num_rounds * round_flops + evals * eval_flops
  return Cost(train, predict, round_flops, eval_flops, total, config.num_rounds)


def calibrate(exps: experiment.Experiment | list[experiment.Experiment],
              cost: Cost | None = None) -> Calibration:
  """Times a run's own compiled dispatch: one round (compilation), then two rounds.

  ``exps``: one experiment, or the S experiments of a batch of seeds (equal but for
  ``seed``, prepared unplaced: ``prepare(place=False)``), timed on their replica axis as
  ``loop.run_seeds`` runs them. Runs on fresh initial states and writes nothing; the
  program is the one the run (or batch) compiles, so the persistent compilation cache
  serves it. A batch's FLOP/s counts the work of all its seeds.
  """
  batch = list(exps) if isinstance(exps, (list, tuple)) else [exps]
  exp = batch[0]
  cost = cost or run_cost(exp)
  init = program.compile_fns(exp).init
  max_rounds = program.dispatch_rows(exp.config.num_rounds)
  if len(batch) == 1:
    data, axes = exp.data, None
    state = init(jax.random.PRNGKey(exp.config.seed))
  else:
    data, axes = program.replica_data(batch)
    state = program.replica_state([init(jax.random.PRNGKey(e.config.seed)) for e in batch],
                                  exp.runtime.mesh)
  dispatch = program.compile_dispatch(exp, max_rounds, axes)
  t = time.perf_counter()
  state, rows, _ = dispatch(state, data, np.int32(1))
  jax.block_until_ready(rows)
  first = time.perf_counter() - t
  t = time.perf_counter()
  state, rows, _ = dispatch(state, data, np.int32(2))
  jax.block_until_ready(rows)
  round_s = (time.perf_counter() - t) / 2
  return Calibration(max(first - round_s, 0.0), round_s,
                     len(batch) * cost.round_flops / round_s)


def estimate_seconds(cost: Cost, calibration: Calibration, *, rounds_left: int | None = None,
                     compile_s: float | None = None) -> float:
  """Seconds of a run of ``cost`` at the calibration's FLOP/s, compilation included.

  Args:
    cost: the run's ``Cost``.
    calibration: measured on this run or another (its FLOP/s is applied).
    rounds_left: rounds still to run (default: all; the work scales with them).
    compile_s: the run's compilation (default: the calibration's; 0 when cached).
  """
  rounds_left = cost.num_rounds if rounds_left is None else rounds_left
  flops = cost.total_flops * rounds_left / max(cost.num_rounds, 1)
  compile_s = calibration.compile_s if compile_s is None else compile_s
  return compile_s + flops / max(calibration.flops_per_s, 1e-9)


def format_flops(flops: float) -> str:
  """``'3.2 PFLOP'``, ``'41.0 TFLOP'``, ``'512.0 GFLOP'``..."""
  for unit, scale in (("PFLOP", 1e15), ("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
    if flops >= scale:
      return f"{flops / scale:.1f} {unit}"
  return f"{flops:.0f} FLOP"


def evaluation_cost(config) -> dict:
  """Seconds per round with and without the per-round evaluations, and their share.

  Calibrates (``calibrate``) the config three ways: both evaluations every round (the
  papers' protocol: ``eval_every=1``, ``eval_sampled``), only the sampled clients'
  (protocol (b), ``eval_every=num_rounds``), and none (protocol (a) at the last round
  only, ``eval_sampled=False``). Each compiles its own program.

  Returns:
    ``{'both_s', 'sampled_only_s', 'none_s'}`` seconds per round, and
    ``'share_both'`` / ``'share_sampled'``: the fraction of a round's time the
    evaluations take (``1 - none_s / both_s``, ``1 - none_s / sampled_only_s``).
  """
  from fedjax_het import config as config_lib  # noqa: PLC0415
  ways = {"both_s": {"eval_every": 1, "eval_sampled": True},
          "sampled_only_s": {"eval_every": config.num_rounds, "eval_sampled": True},
          "none_s": {"eval_every": config.num_rounds, "eval_sampled": False}}
  out = {}
  for name, overrides in ways.items():
    c = config_lib.override(ml_collections.ConfigDict(config.to_dict()), overrides)
    out[name] = calibrate(experiment.prepare(c)).round_s
  out["share_both"] = 1.0 - out["none_s"] / out["both_s"]
  out["share_sampled"] = 1.0 - out["none_s"] / out["sampled_only_s"]
  return out
