r"""Mutation check of the seed methods' equations: would the tests catch a wrong one?

  python benchmarks/mutations.py                 # every mutation (about 15 min, 1 core)
  python benchmarks/mutations.py --only=fedmrl   # those whose name contains 'fedmrl'
  python benchmarks/mutations.py --list          # the mutations, nothing run

Each mutation replaces ONE line of FedMRL's, FedMoE's or Moss's equations or
aggregations (``MUTATIONS``: the file, the exact text replaced, its replacement, and the
tests that should catch it). For each, the script writes the mutated line into a private
copy of the repository (``git archive <rev>`` into a ``tempfile.mkdtemp`` directory: the
working tree, which others edit, is never touched), runs those tests there with pytest
(``-x``, a timeout per mutation), restores the line (``try``/``finally``, Ctrl-C
included), and prints ``caught`` (a test failed), ``SURVIVED`` (all passed), ``timeout``
or ``error`` (pytest could not run them: a collection error, not a failed assertion).
First it runs every named test file on the unmutated copy: they must pass.

Exit status 0 when every mutation is caught. Not part of CI (docs/reliability.md has the
list and the last result). Hand-rolled rather than mutmut or cosmic-ray: those generate
thousands of operator mutations over whole modules and rerun a test command for each; at
JAX's compile times (10-60 s per test file on CPU) that is days, while the question here
is a short list of plausible wrong equations, each run against the tests that claim to
pin it.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import NamedTuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Mutation(NamedTuple):
  name: str
  path: str  # relative to the repository root
  old: str  # exact text, present once in the file
  new: str
  tests: tuple[str, ...]  # pytest arguments (files, -k)


A = "fedjax_het/algorithms/"
EQ_MRL = ("tests/test_equations_fedmrl.py",)
EQ_MOE = ("tests/test_equations_fedmoe.py",)
EQ_MOSS = ("tests/test_equations_moss.py",)
MUTATIONS = (
    # ---- the five (issue 79)
    Mutation("fedmrl: Eq. 3 coarse term x0 instead of m_lc", A + "fedmrl.py",
             "loss = (m_lc * cl.cross_entropy(small", "loss = (0.0 * cl.cross_entropy(small",
             EQ_MRL),
    Mutation("moss: uniform proxy weights instead of FILE", A + "moss.py",
             "a = file_weights(fid, aggregation)", 'a = file_weights(fid, "uniform")', EQ_MOSS),
    Mutation("shared: server average without example counts", A + "shared.py",
             "return cl.weighted_mean(stacked, jnp.concatenate(weights))",
             "return cl.weighted_mean(stacked, jnp.ones_like(jnp.concatenate(weights)))",
             ("tests/test_fedmrl.py", "-k", "round")),
    Mutation("fedmoe: gate softmax over the batch axis", "fedjax_het/models/gating.py",
             "return jax.nn.softmax(h.astype(jnp.float32), axis=-1)",
             "return jax.nn.softmax(h.astype(jnp.float32), axis=0)", EQ_MOE),
    Mutation("fedmrl: coarse head reads the last d1 dims", A + "fedmrl.py",
             "small_in = rep[:, :self.d1]", "small_in = rep[:, -self.d1:]", EQ_MRL),
    # ---- FedMRL
    Mutation("fedmrl: Eq. 1 concatenates F_ex before G_ex", A + "fedmrl.py",
             "rep = jnp.concatenate([rep_g, rep_f], -1)",
             "rep = jnp.concatenate([rep_f, rep_g], -1)", EQ_MRL),
    Mutation("fedmrl: Eq. 3 fine term weighted by m_lc", A + "fedmrl.py",
             "+ m_hf * cl.cross_entropy(large", "+ m_lc * cl.cross_entropy(large", EQ_MRL),
    Mutation("fedmrl: no download of theta before training", A + "fedmrl.py",
             'client.opt_state, {"global": theta})', "client.opt_state, {})", EQ_MRL),
    Mutation("fedmrl: mix-large predicts with the coarse head", A + "fedmrl.py",
             'return large if inference == "mix-large" else small',
             'return small if inference == "mix-large" else large', EQ_MRL),
    Mutation("fedmrl: inference with the client's own theta", A + "fedmrl.py",
             'params = dict(client.params, **{"global": theta})  # latest theta, as the '
             "reference", "params = dict(client.params)", EQ_MRL),
    # ---- FedMoE
    Mutation("fedmoe: gate weights swapped between the experts", A + "fedmoe.py",
             "mixed = w[:, :1] * rep_g + w[:, 1:] * rep_f",
             "mixed = w[:, 1:] * rep_g + w[:, :1] * rep_f", EQ_MOE),
    Mutation("fedmoe: the gate stepped at eta_omega", A + "fedmoe.py",
             '"gate": api.sgd(gating_learning_rate, momentum, weight_decay)',
             '"gate": api.sgd(learning_rate, momentum, weight_decay)', EQ_MOE),
    Mutation("fedmoe: no download of theta before training", A + "fedmoe.py",
             '{"global_ex": theta})  # download theta', "{})", EQ_MOE),
    Mutation("fedmoe: inference with the gate in train mode", A + "fedmoe.py",
             "logits(params, client.model_state, x, train=False)[0]",
             "logits(params, client.model_state, x, train=True)[0]",
             EQ_MOE),
    Mutation("fedmoe: server average without example counts", A + "shared.py",
             "return cl.weighted_mean(stacked, jnp.concatenate(weights))",
             "return cl.weighted_mean(stacked, jnp.ones_like(jnp.concatenate(weights)))",
             ("tests/test_fedmoe.py", "-k", "round")),
    # ---- Moss: the server
    Mutation("moss: type average without example counts", A + "moss.py",
             "cl.weighted_mean(uploads, weights), previous)",
             "cl.weighted_mean(uploads, jnp.ones_like(weights)), previous)", EQ_MOSS),
    Mutation("moss: fidelity cos(a, a) instead of cos(a, b)", A + "moss_wire.py",
             "num = jnp.sum(a * b, -1)", "num = jnp.sum(a * a, -1)", EQ_MOSS),
    Mutation("moss: FILE weights by squared fidelity", A + "moss.py",
             "pos = jnp.maximum(fid, 0.0)", "pos = jnp.maximum(fid, 0.0) ** 2", EQ_MOSS),
    Mutation("moss: reverse transfer from the old global proxy", A + "moss.py",
             "down = [(proxy_apply, proxy, applies[g], types[g])",
             'down = [(proxy_apply, server["proxy"], applies[g], types[g])', EQ_MOSS),
    Mutation("moss: proxies start from zeros, not the global proxy", A + "moss.py",
             'up = [(applies[g], types[g], proxy_apply, server["proxy"])',
             'up = [(applies[g], types[g], proxy_apply, jax.tree.map(jnp.zeros_like, '
             'server["proxy"]))', EQ_MOSS),
    # ---- Moss: WIRE
    Mutation("wire: meta-gradient without the look-ahead", A + "moss_wire.py",
             "return distillation(tgt_apply(ahead, x)[0], s_logits)",
             "return distillation(tgt_apply(theta, x)[0], s_logits)", EQ_MOSS),
    Mutation("wire: look-ahead steps up the gradient", A + "moss_wire.py",
             "ahead = jax.tree.map(lambda p, d: p - cfg.lr * d, theta, g)",
             "ahead = jax.tree.map(lambda p, d: p + cfg.lr * d, theta, g)", EQ_MOSS),
    Mutation("wire: L_wfm with absolute instead of squared errors", A + "moss_wire.py",
             "err = jnp.mean((r - s) ** 2, axis=1)", "err = jnp.mean(jnp.abs(r - s), axis=1)",
             EQ_MOSS),
    Mutation("wire: T_L normalized over target layers", A + "moss_wire.py",
             "return jax.nn.softmax(logits, axis=-1)", "return jax.nn.softmax(logits, axis=1)",
             EQ_MOSS),
    Mutation("wire: L = L_kd + L_wfm without beta", A + "moss_wire.py",
             "return distillation(logits, s_logits) + cfg.beta * wfm",
             "return distillation(logits, s_logits) + wfm", EQ_MOSS),
)


def copy_repo(rev: str) -> str:
  """A private copy of the repository at ``rev`` (``git archive``), its path."""
  tmp = tempfile.mkdtemp(prefix="fedjax_het_mutations_")
  archive = subprocess.run(["git", "-C", ROOT, "archive", rev], capture_output=True,
                           check=True)
  subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
  return tmp


def pytest(copy: str, args, timeout: float) -> str:
  """'passed', 'failed', 'timeout' or 'error' of pytest run in ``copy``."""
  cmd = [sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider",
         *args]
  env = dict(os.environ, PYTHONPATH=copy)
  try:
    out = subprocess.run(cmd, cwd=copy, env=env, capture_output=True, text=True,
                         timeout=timeout)
  except subprocess.TimeoutExpired:
    return "timeout"
  return {0: "passed", 1: "failed"}.get(out.returncode, "error")


def mutate(copy: str, m: Mutation) -> str:
  """The file's original text after writing the mutation into ``copy``."""
  path = os.path.join(copy, m.path)
  with open(path) as f:
    text = f.read()
  if text.count(m.old) != 1:
    raise ValueError(f"{m.name}: {m.old!r} occurs {text.count(m.old)} times in {m.path} "
                     "(the code changed: update MUTATIONS)")
  with open(path, "w") as f:
    f.write(text.replace(m.old, m.new))
  return text


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--only", default="", help="run the mutations whose name contains it")
  parser.add_argument("--rev", default="HEAD", help="the commit to copy and mutate")
  parser.add_argument("--timeout", type=float, default=600.0, help="seconds per pytest run")
  parser.add_argument("--list", action="store_true", help="list the mutations and exit")
  args = parser.parse_args(argv)
  chosen = [m for m in MUTATIONS if args.only in m.name]
  if args.list:
    for m in chosen:
      print(f"{m.name}: {m.path}: {m.old!r} -> {m.new!r}; {' '.join(m.tests)}")
    return 0
  copy = copy_repo(args.rev)
  try:
    files = sorted({a for m in chosen for a in m.tests if a.endswith(".py")})
    baseline = pytest(copy, files, args.timeout)
    print(f"unmutated {' '.join(files)}: {baseline}", flush=True)
    if baseline != "passed":
      return 2
    results = []
    for m in chosen:
      t0 = time.perf_counter()
      original = mutate(copy, m)
      try:
        outcome = pytest(copy, m.tests, args.timeout)
      finally:
        with open(os.path.join(copy, m.path), "w") as f:
          f.write(original)
      verdict = "caught" if outcome == "failed" else "SURVIVED" if outcome == "passed" else outcome
      results.append(verdict)
      print(f"{verdict:8s} {time.perf_counter() - t0:5.0f}s  {m.name}  ({' '.join(m.tests)})",
            flush=True)
    print(f"{results.count('caught')}/{len(results)} caught")
    return 0 if all(r == "caught" for r in results) else 1
  finally:
    shutil.rmtree(copy, ignore_errors=True)


if __name__ == "__main__":
  sys.exit(main())
