r"""Seconds per round: our compiled round vs per-client jax.jit loops vs a PyTorch loop.

Every implementation runs the same round on the same shapes: each sampled client (CNN-1
clients; FedMRL / FedMoE add their shared CNN-5-sized part) starts from the global shared
weights, runs E=1 epoch of SGD (lr 0.01, batch B) over its examples, and the server
averages the shared part weighted by example counts. Data are synthetic CIFAR-10-shaped
images already on the device.

Implementations (rows of the table):

- ``ours-auto``: ``program.compile_fns``' ``run_rounds`` with ``client_parallelism='auto'``
  (vmap on accelerators, a ``lax.map`` over clients on CPU); the label shows what auto
  chose, and when that equals another requested row the program is timed once.
- ``ours-vmap`` / ``ours-sequential``: the same with the parallelism forced.
- ``jit-per-client``: the plain per-client ``jax.jit`` loop: one client's
  ``clients.local_train`` (scan over its steps) is jitted and called in a Python loop
  over the sampled clients; the server average is another jitted call.
- ``jit-per-step``: the plainest JAX loop: one SGD step is jitted and called in Python
  for every client and minibatch (shuffling on the host).
- ``torch``: ``benchmarks/torch_reference.py`` (per-client Python loop, eager PyTorch).

Columns: seconds per round (median of ``--repeats``, after a compiling/warm-up call),
examples/s, achieved TFLOP/s and the speed-up over ``torch`` (torch s / row s). FLOPs are
counted analytically from the layer sizes, the same count for every row (see
``train_flops_per_example``).

  python benchmarks/compare.py --size=small                    # CPU: N=10, 20 x 100 ex.
  python benchmarks/compare.py --size=paper --algorithms=fedmrl   # H100: the issue's round
  python benchmarks/compare.py --size=paper --dtype=bfloat16 --skip_torch
  python benchmarks/compare.py --size=paper --memory             # peak device memory
  python benchmarks/compare.py --size=paper --experiment         # 500 rounds + evals
  python benchmarks/compare.py --protocol=experiments/fedmrl.py:cpu --torch_threads=1,2
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import round_time  # noqa: E402

from fedjax_het import clients as cl  # noqa: E402
from fedjax_het import config as config_lib  # noqa: E402
from fedjax_het import config_files  # noqa: E402
from fedjax_het import models  # noqa: E402
from fedjax_het import packing  # noqa: E402
from fedjax_het import validation  # noqa: E402
from fedjax_het.algorithms import base  # noqa: E402
from fedjax_het.algorithms import fedmoe  # noqa: E402
from fedjax_het.algorithms import fedmrl  # noqa: E402
from fedjax_het.algorithms.shared import LOCAL_REP_DIM  # noqa: E402
from fedjax_het.algorithms.shared import classifier_loss  # noqa: E402
from fedjax_het.algorithms.shared import init_models  # noqa: E402
from fedjax_het.training import estimate  # noqa: E402
from fedjax_het.training import experiment  # noqa: E402
from fedjax_het.training import loop  # noqa: E402
from fedjax_het.training import program  # noqa: E402
from fedjax_het.training import runfiles  # noqa: E402

ALGORITHMS = ("fedavg", "fedmrl", "fedmoe")
IMPLS = ("ours-auto", "ours-vmap", "ours-sequential", "jit-per-client", "jit-per-step",
         "torch")
COLUMNS = ("setting", "algorithm", "implementation", "s/round", "examples/s", "TFLOP/s",
           "vs torch")


class Setting(NamedTuple):
  """One federation shape: N clients, participation C, examples per client, batch B."""
  clients: int
  participation: float
  examples: int
  batch: int

  @property
  def sampled(self) -> int:
    return cl.num_sampled(self.clients, self.participation)

  def label(self) -> str:
    return (f"N={self.clients} C={self.participation:.0%} n={self.examples} "
            f"B={self.batch}")


class Size(NamedTuple):
  """A preset of ``--size``."""
  settings: tuple
  memory_clients: tuple  # N of the --memory runs (participation of the last setting)
  experiment: tuple  # (N, C, rounds) of --experiment


SIZES = {
    # The settings (H100).
    "paper": Size((Setting(100, 0.1, 500, 50), Setting(100, 1.0, 500, 50),
                   Setting(1000, 0.1, 500, 50)), (100, 300, 1000), (100, 0.1, 500)),
    # A CPU-friendly version for 2-core CI machines.
    "small": Size((Setting(10, 1.0, 100, 50), Setting(20, 0.5, 100, 50)), (10, 20, 40),
                  (10, 0.2, 20)),
    # Tests only.
    "tiny": Size((Setting(2, 1.0, 20, 10),), (2, 4), (2, 1.0, 2)),
}


class Row(NamedTuple):
  """One line of the table; ``seconds`` is the median seconds per round."""
  setting: str
  algorithm: str
  implementation: str
  seconds: float
  examples_per_s: float
  tflops: float
  vs_torch: float  # torch seconds / these seconds; nan without a torch row


# ---------------------------------------------------------------- analytic FLOPs


def extractor_macs(arch: str, rep_dim: int) -> tuple[int, int]:
  """(multiply-adds of one image through a CNN extractor, those of its first conv)."""
  spec = models.arch_spec(arch)
  side, c_in, macs, first = 32, 3, 0, None
  for c in spec.conv_features:
    side -= 4  # 5x5 VALID
    macs += side * side * c * 25 * c_in
    first = macs if first is None else first
    side, c_in = side // 2, c  # 2x2 max-pool
  width = side * side * c_in
  for f in spec.fc_features + (rep_dim,):
    macs, width = macs + width * f, f
  return macs, first


def train_flops_per_example(algorithm: str, *, arch: str = "cnn1", d1: int = 100,
                            small_arch: str = "cnn5", gating_hidden: int = 64,
                            num_classes: int = 10) -> int:
  r"""FLOPs of one training example: conv and dense layers only.

  .. math:: 2 \cdot (3 \cdot \mathrm{MACs}_{fwd} - \mathrm{MACs}_{first\ convs})

  forward, weight gradients and input gradients (2 FLOPs per multiply-add), less the
  input gradient of each extractor's first convolution, which nobody computes.
  Elementwise work (ReLU, pooling, normalization, softmax, SGD update) is not counted.
  """
  big, big_first = extractor_macs(arch, LOCAL_REP_DIM)
  header = LOCAL_REP_DIM * num_classes
  if algorithm == "fedavg":
    macs, first = big + header, big_first
  elif algorithm == "fedmrl":
    small, small_first = extractor_macs(small_arch, d1)
    proj = (d1 + LOCAL_REP_DIM) * LOCAL_REP_DIM
    macs, first = big + small + proj + d1 * num_classes + header, big_first + small_first
  elif algorithm == "fedmoe":
    expert, expert_first = extractor_macs(small_arch, LOCAL_REP_DIM)
    gate = 32 * 32 * 3 * gating_hidden + gating_hidden * 2
    macs, first = big + expert + header + gate, big_first + expert_first
  else:
    raise ValueError(f"algorithm={algorithm!r}; valid: {ALGORITHMS}")
  return 2 * (3 * macs - first)


# ---------------------------------------------------------------- per-client JAX loops


class ClientProblem(NamedTuple):
  """One client of an algorithm, as the per-client jax.jit loops train it.

  Attributes:
    loss_fns: per architecture group, a ``clients.LossFn``.
    optimizer: the algorithm's optax transform.
    start: ``(client_state, server) -> (params, model_state, opt_state)`` (download).
    finish: ``(client_state, params, model_state, opt_state) -> (client_state, upload)``.
  """
  loss_fns: tuple
  optimizer: optax.GradientTransformation
  start: Callable
  finish: Callable


def client_problem(exp) -> ClientProblem:
  """The ``ClientProblem`` of ``exp``'s algorithm, with the algorithm module's own loss.

  FedAvg: ``shared.classifier_loss`` (``shared.local_update``'s); FedMRL:
  ``fedmrl.loss_fn`` (Eq. 3); FedMoE: ``fedmoe.loss_fn``. Download and upload mirror
  each module's ``client_update``.
  """
  c, rt = exp.config, exp.runtime
  name, archs, classes = c.algorithm, rt.layout.archs, rt.layout.num_classes
  if name == "fedavg":
    opt = base.sgd(c.learning_rate, c.momentum)
    losses = tuple(classifier_loss(net) for net in init_models(rt, num_classes=classes))
    return ClientProblem(losses, opt, lambda cs, s: (s, None, opt.init(s)),
                         lambda cs, p, ms, os: (cs + 1, p))
  if name == "fedmrl":
    a = c.algo
    opt = base.sgd(c.learning_rate, c.momentum)
    nets = [fedmrl.FedMRLNets(arch, small_arch=a.small_arch, d1=a.d1, num_classes=classes,
                              use_mrl=a.use_mrl, dtype=rt.compute_dtype) for arch in archs]
    return ClientProblem(
        tuple(fedmrl.loss_fn(n, m_lc=a.m_lc, m_hf=a.m_hf) for n in nets), opt,
        lambda cs, s: (dict(cs.params, **{"global": s}), None, cs.opt_state),
        lambda cs, p, ms, os: (base.ClientState(p, None, os), fedmrl.uplink(p)))
  if name == "fedmoe":
    a = c.algo
    opt = fedmoe.optimizer(c.learning_rate, a.gating_learning_rate, c.momentum)
    nets = [fedmoe.FedMoENets(arch, global_arch=a.global_arch, gating_hidden=a.gating_hidden,
                              num_classes=classes, dtype=rt.compute_dtype) for arch in archs]
    return ClientProblem(
        tuple(fedmoe.loss_fn(n) for n in nets), opt,
        lambda cs, s: (dict(cs.params, global_ex=s), cs.model_state, cs.opt_state),
        lambda cs, p, ms, os: (base.ClientState(p, ms, os), fedmoe.uplink(p)))
  raise ValueError(f"no per-client loop for algorithm {name!r}; valid: {ALGORITHMS}")


def client_trainer(problem: ClientProblem, group: int, rt) -> Callable:
  """jit of one client's whole local training (``clients.local_train``)."""
  loss_fn = problem.loss_fns[group]

  @jax.jit
  def train(client, server, x, y, idx, mask, key):
    params, model_state, opt_state = problem.start(client, server)
    r = cl.local_train(loss_fn, problem.optimizer, params, model_state, opt_state, x, y,
                       idx, mask, key, **rt.train_options())
    return problem.finish(client, r.params, r.model_state, r.opt_state)

  return train


def step_trainer(problem: ClientProblem, group: int, rt) -> Callable:
  """A Python loop over epochs and minibatches calling a jitted SGD step."""
  grad_fn = jax.value_and_grad(problem.loss_fns[group], has_aux=True)
  opt = problem.optimizer

  @jax.jit
  def step(params, model_state, opt_state, x, y, bidx):
    batch = cl.make_batch(x, y, bidx, jnp.ones(bidx.shape, bool), dtype=rt.compute_dtype)
    (_, model_state), grads = grad_fn(params, model_state, batch, None)
    updates, opt_state = opt.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), model_state, opt_state

  start, finish = jax.jit(problem.start), jax.jit(problem.finish)

  def train(client, server, x, y, idx: np.ndarray, rng: np.random.Generator):
    params, model_state, opt_state = start(client, server)
    for _ in range(rt.local_epochs):
      order = rng.permutation(idx)
      for b in range(0, len(order) - rt.batch_size + 1, rt.batch_size):
        params, model_state, opt_state = step(params, model_state, opt_state, x, y,
                                              order[b:b + rt.batch_size])
    return finish(client, params, model_state, opt_state)

  return train


@jax.jit
def average(uploads: list, weights: jax.Array):
  """The server's example-weighted mean of the uploaded shared parts."""
  return cl.weighted_mean(jax.tree.map(lambda *a: jnp.stack(a), *uploads), weights)


class PerClientLoop:
  """A federation trained by a Python loop over clients (``jit-per-client``/``-step``).

  Starts from the algorithm's own ``init``; every client's state is a separate pytree on
  the first device; sampling is host-side, C*N clients per group without replacement.
  """

  def __init__(self, exp, per_step: bool, seed: int = 0):
    rt, dev = exp.runtime, jax.devices()[0]
    self.rt, self.per_step = rt, per_step
    self.rng = np.random.default_rng(seed)
    state = program.jit_init(exp.algorithm.init)(jax.random.PRNGKey(seed))
    put = lambda t: jax.device_put(jax.device_get(t), dev)
    self.server = put(state.server)
    self.x, self.y = put(exp.data.x), put(exp.data.y)
    problem = client_problem(exp)
    self.groups = []
    for g, index in enumerate(exp.data.groups):
      n = len(rt.layout.client_ids[g])
      stacked = packing.as_tree(jax.device_get(state.clients[g]))
      idx, mask = np.asarray(index.train_idx), np.asarray(index.train_mask)
      self.groups.append(dict(
          clients=[put(jax.tree.map(lambda a, k=k: a[k], stacked)) for k in range(n)],
          idx=[put(idx[k]) for k in range(n)], mask=[put(mask[k]) for k in range(n)],
          real_idx=[idx[k][mask[k]] for k in range(n)],
          weights=np.asarray(index.num_train, np.float32)[:n],
          num=rt.slots(g)[0],
          train=(step_trainer if per_step else client_trainer)(problem, g, rt)))
    self.round_no = 0
    self.key = jax.random.PRNGKey(seed + 1)

  def round(self) -> None:
    """One round: every sampled client trains in turn, then the server averages."""
    uploads, weights = [], []
    for g in self.groups:
      for k in self.rng.choice(len(g["clients"]), g["num"], replace=False):
        if self.per_step:
          new, up = g["train"](g["clients"][k], self.server, self.x, self.y,
                               g["real_idx"][k], self.rng)
        else:
          key = jax.random.fold_in(self.key, self.round_no * 1_000_003 + int(k))
          new, up = g["train"](g["clients"][k], self.server, self.x, self.y, g["idx"][k],
                               g["mask"][k], key)
        g["clients"][k] = new
        uploads.append(up)
        weights.append(g["weights"][k])
    self.server = average(uploads, np.asarray(weights, np.float32))
    self.round_no += 1

  def block(self) -> None:
    jax.block_until_ready((self.server, [g["clients"] for g in self.groups]))


def time_per_client_loop(exp, *, per_step: bool, repeats: int) -> list[float]:
  """Seconds of each of ``repeats`` rounds after one compiling round."""
  fed = PerClientLoop(exp, per_step)
  fed.round()
  fed.block()
  times = []
  for _ in range(repeats):
    t = time.perf_counter()
    fed.round()
    fed.block()
    times.append(time.perf_counter() - t)
  return times


# ---------------------------------------------------------------- the table


def build(setting: Setting, algorithm: str, parallelism: str = "auto", *,
          arch: str = "cnn1", dtype: str = "float32", num_devices: int = 0,
          test_examples: int = 10):
  """``round_time.build`` for a ``Setting``; every client's own model is ``arch``."""
  return round_time.build(algorithm=algorithm, models=arch, clients=setting.clients,
                          examples=setting.examples, test_examples=test_examples,
                          batch=setting.batch, participation=setting.participation,
                          parallelism=parallelism, dtype=dtype, num_devices=num_devices)


def time_impl(impl: str, setting: Setting, algorithm: str, *, arch: str, dtype: str,
              repeats: int, rounds_per_dispatch: int, num_devices: int,
              torch_device, torch_threads: int = 0) -> float:
  """Median seconds per round of one implementation."""
  if impl == "torch":
    import torch_reference  # noqa: PLC0415 (torch is optional)
    return torch_reference.time_round(
        algorithm, clients=setting.clients, examples=setting.examples,
        participation=setting.participation, batch=setting.batch, device=torch_device,
        dtype=dtype, arch=arch, threads=torch_threads, repeats=repeats)
  if impl.startswith("ours-"):
    exp = build(setting, algorithm, impl.split("-", 1)[1], arch=arch, dtype=dtype,
                num_devices=num_devices)
    _, times, _ = round_time.time_rounds(exp, repeats=repeats,
                                         rounds_per_dispatch=rounds_per_dispatch)
    return statistics.median(times)
  if impl in ("jit-per-client", "jit-per-step"):
    exp = build(setting, algorithm, arch=arch, dtype=dtype, num_devices=num_devices)
    return statistics.median(time_per_client_loop(
        exp, per_step=impl == "jit-per-step", repeats=repeats))
  raise ValueError(f"implementation {impl!r}; valid: {IMPLS}")


def impl_label(impl: str) -> str:
  """``ours-auto`` shows what auto resolves to on this backend."""
  if impl == "ours-auto":
    return f"ours-auto[{cl.resolve_parallelism('auto')}]"
  return impl


def compare(settings, algorithms, impls, *, arch: str = "cnn1", dtype: str = "float32",
            repeats: int = 3,
            rounds_per_dispatch: int = 1, num_devices: int = 0, torch_device=None,
            torch_threads: int = 0, log: Callable[[str], None] = lambda s: None) -> list[Row]:
  """Times every (setting, algorithm, implementation) and returns the table's rows.

  ``ours-auto`` is timed once and reused for the row of the parallelism it resolves to
  when that row is requested too (the same compiled program).
  """
  rows = []
  for s in settings:
    for alg in algorithms:
      secs = {}
      for impl in impls:
        same = "ours-" + cl.resolve_parallelism("auto")
        if impl == same and "ours-auto" in secs:
          secs[impl] = secs["ours-auto"]
          continue
        t = time.perf_counter()
        secs[impl] = time_impl(impl, s, alg, arch=arch, dtype=dtype, repeats=repeats,
                               rounds_per_dispatch=rounds_per_dispatch,
                               num_devices=num_devices, torch_device=torch_device,
                               torch_threads=torch_threads)
        log(f"  {s.label()} {alg} {impl}: {secs[impl]:.4f} s/round "
            f"({time.perf_counter() - t:.0f} s with compilation)")
      examples = s.sampled * s.examples
      flops = train_flops_per_example(alg, arch=arch) * examples
      ref = secs.get("torch", math.nan)
      rows += [Row(s.label(), alg, impl_label(i), sec, examples / sec, flops / sec / 1e12,
                   ref / sec) for i, sec in secs.items()]
  return rows


def markdown(head, body) -> str:
  """A GitHub-markdown table, columns padded to their widest cell (strings)."""
  widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]
  line = lambda vals: "| " + " | ".join(v.ljust(w) for v, w in zip(vals, widths)) + " |"
  sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
  return "\n".join([line(head), sep] + [line(b) for b in body])


def format_table(rows: list[Row]) -> str:
  """A GitHub-markdown table of ``rows`` with the ``COLUMNS`` header."""
  def cells(r):
    vs = "n/a" if math.isnan(r.vs_torch) else f"{r.vs_torch:.2f}x"
    return (r.setting, r.algorithm, r.implementation, f"{r.seconds:.4f}",
            f"{r.examples_per_s:,.0f}", f"{r.tflops:.4f}", vs)
  return markdown(COLUMNS, [cells(r) for r in rows])


def auto_vs_loop(rows: list[Row]) -> list[str]:
  """The issue's CPU check: ours-auto not slower than the jit-per-client loop."""
  out = []
  by = {(r.setting, r.algorithm, r.implementation.split("[")[0]): r.seconds for r in rows}
  for (s, a, i), sec in by.items():
    loop_s = by.get((s, a, "jit-per-client"))
    if i == "ours-auto" and loop_s:
      verdict = "OK" if sec <= loop_s else "SLOWER"
      out.append(f"{s} {a}: ours-auto {sec:.4f} s vs jit-per-client {loop_s:.4f} s "
                 f"-> {loop_s / sec:.2f}x ({verdict})")
  return out


# ---------------------------------------------------------------- --memory, --experiment


def memory_table(size: Size, algorithms, *, examples: int, batch: int, dtype: str,
                 num_devices: int, log=lambda s: None) -> str:
  """Device memory of one compiled round (auto parallelism) as N grows.

  Columns: state MiB (every client's state + server, counted from shapes), data MiB
  (pooled uint8 images), and on accelerators ``bytes_in_use`` after the round and
  ``peak_bytes_in_use`` so far (runs go in increasing N, so the peak is that of the
  largest run so far); n/a where the backend reports no memory statistics (CPU).
  """
  participation = size.settings[-1].participation
  head = ("algorithm", "N", "C", "state MiB", "data MiB", "in use MiB", "peak MiB")
  rows = []
  for alg in algorithms:
    for n in size.memory_clients:
      s = Setting(n, participation, examples, batch)
      exp = build(s, alg, dtype=dtype, num_devices=num_devices)
      fns = program.compile_fns(exp)
      state, _ = fns.run_rounds(fns.init(jax.random.PRNGKey(0)), exp.data, 1)
      jax.block_until_ready(state)
      stats = jax.devices()[0].memory_stats() or {}
      mib = lambda b: "n/a" if b is None else f"{b / 2**20:,.1f}"
      rows.append((alg, str(n), f"{participation:.0%}",
                   mib(estimate.tree_bytes(fns.abstract)), mib(estimate.tree_bytes(exp.data)),
                   mib(stats.get("bytes_in_use")), mib(stats.get("peak_bytes_in_use"))))
      log(f"  memory {alg} N={n}: {rows[-1]}")
      del state, exp
  return markdown(head, rows)


def time_experiment(setting: Setting, algorithm: str, rounds: int, *, eval_every: int = 10,
                    dtype: str = "float32", num_devices: int = 0) -> tuple[float, float, float]:
  """A whole run as ``loop.run`` does it, less checkpoints and file output.

  ``rounds`` rounds in ``lax.scan`` chunks of ``eval_every`` rounds, each chunk followed
  by the finiteness check and a per-client evaluation (results fetched to the host).

  Returns:
    (seconds after compilation, seconds of the compiling warm-up, final mean accuracy).
  """
  exp = build(setting, algorithm, dtype=dtype, num_devices=num_devices,
              test_examples=max(setting.examples // 4, setting.batch))
  fns = program.compile_fns(exp)
  init, run_rounds, evaluate = fns.init, fns.run_rounds, fns.evaluate
  archs = exp.runtime.layout.archs
  t = time.perf_counter()
  chunks = {min(eval_every, rounds)} | ({rounds % eval_every} if rounds > eval_every else set())
  for chunk in sorted(chunks - {0}):  # compile every chunk length the timed loop uses
    state, m = run_rounds(init(jax.random.PRNGKey(0)), exp.data, chunk)
    runfiles.check_finite(m, 0, archs)
    program.per_client_accuracy(exp, evaluate(state, exp.data))
  compile_s = time.perf_counter() - t
  state = init(jax.random.PRNGKey(0))
  jax.block_until_ready(state)
  t = time.perf_counter()
  r = 0
  while r < rounds:
    chunk = min(eval_every, rounds - r)
    state, m = run_rounds(state, exp.data, chunk)
    runfiles.check_finite(m, r, archs)
    r += chunk
    acc = program.per_client_accuracy(exp, evaluate(state, exp.data))
  return time.perf_counter() - t, compile_s, float(acc.mean())


# ---------------------------------------------------------------- --protocol


def protocol_clients(exp) -> list:
  """Every real client of a prepared experiment, by client id, as
  ``(arch, x_train, y_train, x_test, y_test)`` (uint8 NHWC images, as the pool)."""
  x, y = np.asarray(exp.data.x), np.asarray(exp.data.y)
  layout, out = exp.runtime.layout, {}
  for g, index in enumerate(exp.data.groups):
    for j, cid in enumerate(layout.client_ids[g]):
      tr = np.asarray(index.train_idx[j])[np.asarray(index.train_mask[j])]
      te = np.asarray(index.test_idx[j])[np.asarray(index.test_mask[j])]
      out[cid] = (layout.archs[g], x[tr], y[tr], x[te], y[te])
  return [out[k] for k in sorted(out)]


def time_protocol_ours(config, rounds: int, workdir: str) -> dict:
  """``loop.run`` of ``config`` (1 + ``rounds`` rounds, evaluation every round, no
  checkpoint but the last) in ``workdir``; seconds per round from its metrics rows.

  Returns:
    {'round_s': wall seconds between consecutive evaluation rows (train + evaluate +
    host work of a round), 'compile_s': the run's own compile figure,
    'first_s': wall time to the first row (compilation of the round and the evaluation
    and round one), 'acc': final mean test accuracy}.
  """
  import json  # noqa: PLC0415
  config = config_lib.override(config.copy_and_resolve_references(), {
      "num_rounds": rounds + 1, "eval_every": 1, "checkpoint_every": 0})
  summary = loop.run(config, workdir, fresh_start=True, log=lambda line: None)
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    walls = [json.loads(line)["wall_s"] for line in f]
  return {"round_s": [b - a for a, b in zip(walls, walls[1:])],
          "compile_s": summary["timing"].get("compile_s", math.nan),
          "first_s": walls[0], "acc": summary["final_mean_test_acc"]}


def protocol_table(spec, *, rounds: int, repeats: int, torch_threads: list,
                   skip_torch: bool = False, workdir: str | None = None,
                   log=lambda s: None) -> str:
  """Ours (``loop.run``) against the per-client PyTorch loop on an experiment's clients.

  Every repeat runs ours (compiling afresh) and then torch with each thread count, so
  the implementations alternate under the same machine load. Our config gets
  ``eval_every=1``; torch (``torch_reference.ProtocolFederation``) trains the same
  clients (architecture, examples, B, E, optimizer) and evaluates them every round.

  Args:
    spec: ``CONFIG[:variant]`` (a file with ``get_config``) or a config itself.
    rounds: timed rounds per run; repeats: runs of each implementation.
    torch_threads: the thread counts torch is timed with.
    skip_torch: ours only.
    workdir: where our runs write (default: a temporary directory).

  Returns:
    A markdown table, one row per implementation.
  """
  import tempfile  # noqa: PLC0415
  config = config_files.load_config_file(spec) if isinstance(spec, str) else spec
  spec = spec if isinstance(spec, str) else f"{config.algorithm} config"
  validation.validate(config)
  c = validation.with_algo_defaults(config)
  if c.participation != 1.0:
    raise ValueError("--protocol times every client each round (participation 1.0)")
  clients = protocol_clients(experiment.prepare(c))
  results = {"ours": {"wall": [], "compile": [], "first": [], "acc": []}}
  workdir = workdir or tempfile.mkdtemp(prefix="protocol_")
  for rep in range(repeats):
    r = time_protocol_ours(config, rounds, os.path.join(workdir, f"ours{rep}"))
    ours = results["ours"]
    ours["wall"] += r["round_s"]
    ours["compile"].append(r["compile_s"])
    ours["first"].append(r["first_s"])
    ours["acc"].append(r["acc"])
    log(f"  rep {rep} ours: {statistics.median(r['round_s']):.2f} s/round, compile "
        f"{r['compile_s']:.1f} s, load {os.getloadavg()[0]:.1f}")
    if skip_torch:
      continue
    import torch_reference  # noqa: PLC0415 (torch is optional)
    for threads in torch_threads:
      walls, cpus, acc = torch_reference.time_protocol(
          c.algorithm, clients, rounds=rounds, threads=threads, batch=c.batch_size,
          epochs=c.local_epochs, lr=c.learning_rate, momentum=c.momentum,
          weight_decay=c.weight_decay, grad_clip=c.grad_clip, device="cpu", seed=rep,
          **({"d1": c.algo.d1, "small_arch": c.algo.small_arch}
             if c.algorithm == "fedmrl" else {}))
      row = results.setdefault(f"torch-{threads}t", {"wall": [], "acc": []})
      row["wall"] += walls
      row["acc"].append(acc)
      log(f"  rep {rep} torch {threads} thread(s): {statistics.median(walls):.2f} s/round,"
          f" load {os.getloadavg()[0]:.1f}")
  ref = min((statistics.median(v["wall"]) for k, v in results.items()
             if k.startswith("torch")), default=math.nan)
  head = ("setting", "implementation", "s/round", "min s/round", "compile s",
          "first row s", "final acc", "vs best torch")
  n = len(clients)
  setting = (f"{spec} N={n} C=100% B={c.batch_size} E={c.local_epochs} eval every round")
  rows = []
  for name, v in results.items():
    sec = statistics.median(v["wall"])
    comp = f"{statistics.median(v['compile']):.1f}" if "compile" in v else "-"
    first = f"{statistics.median(v['first']):.1f}" if "first" in v else "-"
    rows.append((setting, name, f"{sec:.2f}", f"{min(v['wall']):.2f}", comp, first,
                 f"{statistics.median(v['acc']):.3f}",
                 "n/a" if math.isnan(ref) else f"{ref / sec:.2f}x"))
  return markdown(head, rows)


# ---------------------------------------------------------------- command line


def parse_args(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--size", default="small", choices=sorted(SIZES),
                 help="settings: paper = N=100/1000 clients of 500 examples (a GPU), small "
                      "= N=10/20 of 100 (a 2-core CPU), tiny = tests")
  p.add_argument("--settings", default="",
                 help="comma-separated positions (from 1) of the size's settings to time, "
                      "e.g. 2,3 (default: all)")
  p.add_argument("--algorithms", default="fedavg,fedmrl,fedmoe",
                 help="comma-separated algorithms to time")
  p.add_argument("--impls", default=",".join(IMPLS),
                 help=f"comma-separated subset of {','.join(IMPLS)}")
  p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                 help="compute dtype (bfloat16: torch autocast for the torch rows)")
  p.add_argument("--rounds_per_dispatch", type=int, default=1,
                 help="rounds per run_rounds call (lax.scan) for the ours-* rows")
  p.add_argument("--repeats", type=int, default=3,
                 help="timed rounds per row (the median is reported)")
  p.add_argument("--skip_torch", action="store_true", help="leave the torch row out")
  p.add_argument("--torch_device", default=None, help="cpu|cuda; unset: cuda if any")
  p.add_argument("--torch_threads", default="0",
                 help="torch CPU threads (0: torch's default); --protocol takes a "
                      "comma-separated list and times each, the other modes the first")
  p.add_argument("--num_devices", type=int, default=0, help="devices of the client mesh")
  p.add_argument("--memory", action="store_true", help="the memory table instead")
  p.add_argument("--experiment", action="store_true",
                 help="time a whole experiment (rounds + evaluation every 10) instead")
  p.add_argument("--experiment_rounds", type=int, default=0, help="0: the size's preset")
  p.add_argument("--protocol", default="",
                 help="CONFIG[:variant], e.g. experiments/fedmrl.py:cpu: time loop.run of "
                      "that experiment (evaluation every round) against the per-client "
                      "PyTorch loop on the same clients, instead")
  p.add_argument("--protocol_rounds", type=int, default=5,
                 help="--protocol: timed rounds per run (after one compiling round)")
  p.add_argument("--protocol_workdir", default="",
                 help="--protocol: where our runs write (default: a temporary directory)")
  args = p.parse_args(argv)
  args.torch_threads = [int(t) for t in args.torch_threads.split(",")]
  args.algorithms = args.algorithms.split(",")
  count = len(SIZES[args.size].settings)
  try:
    args.settings = ([int(k) for k in args.settings.split(",")] if args.settings
                     else list(range(1, count + 1)))
  except ValueError:
    p.error(f"--settings={args.settings!r}: comma-separated integers")
  for k in args.settings:
    if not 1 <= k <= count:
      p.error(f"--settings: {k} is not between 1 and {count} (--size={args.size} has "
              f"{count}: {'; '.join(x.label() for x in SIZES[args.size].settings)})")
  args.impls = [i for i in args.impls.split(",") if not (args.skip_torch and i == "torch")]
  for a in args.algorithms:
    if a not in ALGORITHMS:
      p.error(f"--algorithms: {a!r} is not one of {ALGORITHMS}")
  for i in args.impls:
    if i not in IMPLS:
      p.error(f"--impls: {i!r} is not one of {IMPLS}")
  return args


def describe_device(torch_device, torch_threads: int = 0) -> str:
  d = jax.devices()[0]
  return (f"jax {jax.__version__} backend={jax.default_backend()} device={d.device_kind} "
          f"x{jax.device_count()}; host CPUs={os.cpu_count()}; torch device="
          f"{torch_device or 'default (cuda if available)'} threads="
          f"{torch_threads or 'default'}")


def main(argv=None):
  args = parse_args(argv)
  size = SIZES[args.size]
  log = lambda s: print(s, file=sys.stderr, flush=True)
  if args.protocol:
    print(describe_device("cpu", ",".join(map(str, args.torch_threads))))
    print(f"load average at start {os.getloadavg()[0]:.2f}")
    print(protocol_table(args.protocol, rounds=args.protocol_rounds, repeats=args.repeats,
                         torch_threads=args.torch_threads, skip_torch=args.skip_torch,
                         workdir=args.protocol_workdir or None, log=log))
    print(f"load average at end {os.getloadavg()[0]:.2f}; s/round: median over repeats "
          f"x {args.protocol_rounds} rounds; vs best torch: the faster torch row's "
          "s/round / this row's")
    return
  args.torch_threads = args.torch_threads[0]
  print(describe_device(args.torch_device, args.torch_threads))
  if args.memory:
    ref = size.settings[-1]
    print(memory_table(size, args.algorithms, examples=ref.examples, batch=ref.batch,
                       dtype=args.dtype, num_devices=args.num_devices, log=log))
    return
  if args.experiment:
    n, c, rounds = size.experiment
    rounds = args.experiment_rounds or rounds
    s = Setting(n, c, size.settings[0].examples, size.settings[0].batch)
    for alg in args.algorithms:
      sec, comp, acc = time_experiment(s, alg, rounds, dtype=args.dtype,
                                       num_devices=args.num_devices)
      print(f"experiment {alg} {s.label()} rounds={rounds} eval_every=10 "
            f"dtype={args.dtype}: {sec:.2f} s after compilation "
            f"(compilation + warm-up {comp:.1f} s; final mean test acc {acc:.3f})")
    return
  rows = compare([size.settings[k - 1] for k in args.settings], args.algorithms,
                 args.impls, dtype=args.dtype,
                 repeats=args.repeats, rounds_per_dispatch=args.rounds_per_dispatch,
                 num_devices=args.num_devices, torch_device=args.torch_device,
                 torch_threads=args.torch_threads, log=log)
  print(f"dtype={args.dtype} rounds_per_dispatch={args.rounds_per_dispatch} "
        f"median of {args.repeats}; FLOPs analytic (train_flops_per_example)")
  print(format_table(rows))
  for line in auto_vs_loop(rows):
    print(line)


if __name__ == "__main__":
  main()
