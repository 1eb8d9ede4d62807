"""FML, FedKD, FedAPEN: losses by hand, SVD compression, lambda, uplink, rounds, runs."""
import json
import os

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_server_holds_no_client_leaf

from fedjax_het import clients as cl
from fedjax_het import packing
from fedjax_het.algorithms import SPECS
from fedjax_het.algorithms import base
from fedjax_het.algorithms import fedapen
from fedjax_het.algorithms import fedkd
from fedjax_het.algorithms import fml
from fedjax_het.algorithms import mutual
from fedjax_het.training import checkpoint as ckpt_lib
from fedjax_het.training import experiment
from fedjax_het.training import loop
from fedjax_het.training import program
from fedjax_het.training import runfiles

# programs that compile far longer than they run: level 0 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("compile_bound")

SMALL = {"algo.small_arch": "tiny", "algo.rep_dim": 16}  # fast shared model, width != 500


def _np_kl(q_logits, p_logits):
  q = np.exp(q_logits) / np.exp(q_logits).sum(-1, keepdims=True)
  p = np.exp(p_logits) / np.exp(p_logits).sum(-1, keepdims=True)
  return np.sum(q * (np.log(q) - np.log(p)), -1)


def _np_ce(logits, y):
  logp = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
  return -logp[np.arange(len(y)), y]


LOGITS_A = np.array([[1.0, 0.0, -1.0], [0.5, 0.5, 2.0], [3.0, 0.0, 0.0]], np.float32)
LOGITS_B = np.array([[0.0, 1.0, 0.0], [1.0, -1.0, 0.0], [9.0, 9.0, 9.0]], np.float32)
LABELS = np.array([0, 2, 1])
MASK = np.array([True, True, False])


def test_kl_divergence_matches_hand_computation():
  got = mutual.kl_divergence(LOGITS_B, LOGITS_A, MASK)
  np.testing.assert_allclose(got, _np_kl(LOGITS_B, LOGITS_A)[:2].mean(), rtol=1e-5)
  # KL of a distribution to itself is 0; the teacher gets no gradient
  np.testing.assert_allclose(mutual.kl_divergence(LOGITS_A, LOGITS_A, MASK), 0.0, atol=1e-6)
  g = jax.grad(lambda t: mutual.kl_divergence(t, jnp.asarray(LOGITS_A), MASK))(LOGITS_B)
  np.testing.assert_array_equal(g, 0.0)


def test_fml_mutual_losses_match_hand_computation():
  loss_l, loss_g = fml.mutual_losses(LOGITS_A, LOGITS_B, LABELS, MASK, alpha=0.3, beta=0.8)
  ce_a, ce_b = _np_ce(LOGITS_A, LABELS)[:2].mean(), _np_ce(LOGITS_B, LABELS)[:2].mean()
  np.testing.assert_allclose(
      loss_l, 0.3 * ce_a + 0.7 * _np_kl(LOGITS_B, LOGITS_A)[:2].mean(), rtol=1e-5)
  np.testing.assert_allclose(
      loss_g, 0.8 * ce_b + 0.2 * _np_kl(LOGITS_A, LOGITS_B)[:2].mean(), rtol=1e-5)


def test_fedkd_distillation_losses_match_hand_computation():
  rep_t = np.array([[1.0, 2.0], [0.0, 1.0], [5.0, 5.0]], np.float32)
  rep_s = np.array([[1.0], [2.0], [7.0]], np.float32)
  w_h = np.array([[0.5, 1.0]], np.float32)
  loss_t, loss_s = fedkd.distillation_losses(LOGITS_A, rep_t, LOGITS_B, rep_s, w_h,
                                             LABELS, MASK)
  ce_t, ce_s = _np_ce(LOGITS_A, LABELS)[:2].mean(), _np_ce(LOGITS_B, LABELS)[:2].mean()
  hidden = np.mean([np.mean((rep_t[i] - rep_s[i] @ w_h) ** 2) for i in range(2)])
  d = ce_t + ce_s
  np.testing.assert_allclose(
      loss_t, ce_t + (_np_kl(LOGITS_B, LOGITS_A)[:2].mean() + hidden) / d, rtol=1e-5)
  np.testing.assert_allclose(
      loss_s, ce_s + (_np_kl(LOGITS_A, LOGITS_B)[:2].mean() + hidden) / d, rtol=1e-5)


def test_fedapen_ensemble_losses_match_hand_computation():
  lam = 0.25
  loss_l, loss_g = fedapen.ensemble_losses(LOGITS_A, LOGITS_B, lam, LABELS, MASK)
  ens = _np_ce(lam * LOGITS_A + (1 - lam) * LOGITS_B, LABELS)[:2].mean()
  np.testing.assert_allclose(loss_l, _np_ce(LOGITS_A, LABELS)[:2].mean()
                             + _np_kl(LOGITS_B, LOGITS_A)[:2].mean() + ens, rtol=1e-5)
  np.testing.assert_allclose(loss_g, _np_ce(LOGITS_B, LABELS)[:2].mean()
                             + _np_kl(LOGITS_A, LOGITS_B)[:2].mean() + ens, rtol=1e-5)


def test_svd_compression_reconstructs_low_rank_exactly():
  rng = np.random.default_rng(0)
  a = (rng.normal(size=(12, 2)) @ rng.normal(size=(2, 10))).astype(np.float32)  # rank 2
  recon, sent = jax.jit(fedkd.svd_compress, static_argnums=1)(a, 0.99)
  np.testing.assert_allclose(recon, a, atol=1e-4)
  assert float(sent) == 2 * (12 + 10 + 1)


@pytest.mark.parametrize("energy", [0.5, 0.9, 0.99])
def test_svd_compression_keeps_the_stated_energy(energy):
  a = np.random.default_rng(1).normal(size=(40, 30)).astype(np.float32)
  recon, sent = fedkd.svd_compress(a, energy)
  s = np.linalg.svd(a, compute_uv=False)
  rank = int(np.searchsorted(np.cumsum(s ** 2) / np.sum(s ** 2), energy) + 1)
  if rank * (40 + 30 + 1) < 40 * 30:
    assert float(sent) == rank * (40 + 30 + 1)
    kept = np.sum(np.asarray(recon) ** 2) / np.sum(a ** 2)
    assert energy <= kept + 1e-5 and kept < 1.0
  else:  # factors would not be smaller: the matrix goes whole
    assert float(sent) == 40 * 30
    np.testing.assert_array_equal(recon, a)


def test_compress_tree_sends_vectors_whole_and_is_off_at_zero():
  tree = {"kernel": jnp.ones((5, 5, 2, 8)), "bias": jnp.arange(8.0)}
  recon, sent = fedkd.compress_tree(tree, 0.9)
  assert float(sent) == 1 * (50 + 8 + 1) + 8  # rank-1 kernel as [50, 8], bias whole
  chex.assert_trees_all_close(recon, tree, atol=1e-4)
  same, size = fedkd.compress_tree(tree, 0.0)
  assert same is tree and float(size) == 5 * 5 * 2 * 8 + 8


def test_holdout_split_takes_the_last_real_examples():
  idx = jnp.arange(100, 116, dtype=jnp.int32)
  mask = jnp.arange(16) < 11  # 11 real examples; floor(0.2 * 11) = 2 held out
  train, hidx, hmask = fedapen.holdout_split(idx, mask, 0.2, 4)
  assert hidx.shape == (4,)  # ceil(0.2 * 16) = 4, rounded up to the batch size
  np.testing.assert_array_equal(np.asarray(hidx)[np.asarray(hmask)], [109, 110])
  np.testing.assert_array_equal(train, np.arange(16) < 9)


def test_learned_lambda_moves_towards_the_better_model_within_0_1():
  labels = jnp.array([0, 1, 2, 0])
  good = 5.0 * jax.nn.one_hot(labels, 3)  # the private model is right
  bad = 5.0 * jax.nn.one_hot((labels + 1) % 3, 3)
  mask = jnp.array([True, True, True, False])
  half = jnp.full((), 0.5)
  lam = fedapen.learn_lambda(half, good, bad, labels, mask, steps=50, learning_rate=10.0,
                             batch_size=2)
  assert float(lam) == 1.0  # clipped at 1
  lam = fedapen.learn_lambda(half, bad, good, labels, mask, steps=50, learning_rate=10.0,
                             batch_size=2)
  assert float(lam) == 0.0  # clipped at 0
  none = fedapen.learn_lambda(half, good, bad, labels, mask & False, steps=5,
                              learning_rate=10.0, batch_size=2)
  assert float(none) == 0.5


def test_lambda_takes_one_sgd_step_per_held_out_minibatch():
  labels = jnp.array([0, 1, 2, 0])
  logits_l = jnp.array([[1.0, 0, 0], [0, 2.0, 0], [0, 0, 0.5], [0.3, 0, 0]])
  logits_g = jnp.array([[0, 1.0, 0], [0, 0, 1.0], [1.0, 0, 0], [0, 0.2, 0]])
  mask = jnp.array([True, True, True, False])
  lam = jnp.float32(0.5)
  for b in range(2):  # by hand: two minibatches of 2, lr 0.1
    sl = slice(2 * b, 2 * b + 2)
    grad = jax.grad(lambda lam_, sl=sl: cl.cross_entropy(fedapen.ensemble(
        logits_l[sl], logits_g[sl], lam_), labels[sl], mask[sl]))(lam)
    lam = jnp.clip(lam - 0.1 * grad, 0, 1)
  out = fedapen.learn_lambda(jnp.float32(0.5), logits_l, logits_g, labels, mask, steps=1,
                             learning_rate=0.1, batch_size=2)
  np.testing.assert_allclose(out, lam, rtol=1e-6)


def test_a_fedapen_client_learns_lambda_k_in_its_apen_state(tiny_config):
  # lr 0.1 (not 1e-3) so that one pass over the held-out minibatches visibly moves lambda
  exp = experiment.prepare(tiny_config("fedapen", "tiny", {
      **SMALL, "algo.lambda_learning_rate": 0.1}))
  rt, proto = exp.runtime, exp.algorithm.protocol
  client = proto.init_client(0, jax.random.PRNGKey(0))
  assert isinstance(client.model_state, fedapen.ApenState)
  lam = client.model_state.lam
  assert lam.shape == () and lam.dtype == jnp.float32 and float(lam) == 0.5
  assert jax.tree.leaves(client.model_state) == [lam]  # one leaf, as the dict {'lam'} was
  # a round: lambda_k takes SGD steps on the held-out examples with the private model and
  # the downloaded theta frozen (learning for adaptability), before either model trains
  theta = proto.downlink(proto.init_server(jax.random.PRNGKey(1)), 0)
  group = exp.data.groups[0]
  idx, mask = group.train_idx[0], group.train_mask[0]
  new, _, _ = jax.jit(proto.client_update, static_argnums=0)(
      0, client, theta, exp.data, idx, mask, jax.random.PRNGKey(2))
  assert isinstance(new.model_state, fedapen.ApenState)
  _, hidx, hmask = fedapen.holdout_split(idx, mask, 0.1, rt.batch_size)
  assert int(jnp.sum(hmask)) > 0
  batch = cl.make_batch(exp.data.x, exp.data.y, hidx, hmask, **rt.batch_options())
  nets = mutual.make_nets(rt, small_arch="tiny", rep_dim=16)
  (logits_l, _), (logits_g, _) = nets[0].forward(dict(client.params, **{"global": theta}),
                                                 batch.x)
  expected = fedapen.learn_lambda(lam, logits_l, logits_g, batch.y, hmask, steps=1,
                                  learning_rate=0.1, batch_size=rt.batch_size)
  assert abs(float(expected) - 0.5) > 1e-3
  np.testing.assert_allclose(new.model_state.lam, expected, rtol=1e-5)
  assert new.model_state.lam.shape == () and new.model_state.lam.dtype == jnp.float32


ALGOS = [("fml", {}), ("fedkd", {"algo.svd_energy_start": 0.9}), ("fedapen", {})]


@pytest.mark.parametrize("algorithm,algo", ALGOS)
def test_uplink_holds_only_the_shared_model(tiny_config, algorithm, algo):
  exp = experiment.prepare(tiny_config(algorithm, "tiny", {**SMALL, **algo}))
  state = jax.eval_shape(exp.algorithm.init, jax.random.PRNGKey(0))
  client = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype),
                        packing.as_tree(state.clients[0]))  # one client's tree
  theta = state.server["theta"] if algorithm == "fedkd" else state.server
  up = jax.eval_shape(fedkd.uplink, client.params, theta) if algorithm == "fedkd" else (
      mutual.uplink(client.params))
  assert jax.tree.structure(up) == jax.tree.structure(theta)
  chex.assert_trees_all_equal_shapes_and_dtypes(up, theta)
  assert set(client.params) - {"global"} >= {"local"}  # private parts exist but stay home
  private = [client.params[k] for k in client.params if k != "global"]
  assert base.count_params(up) == base.count_params(theta) < base.count_params(private)
  if algorithm != "fedkd":  # the very leaves of the shared model, nothing else
    assert up is client.params["global"]


@pytest.mark.parametrize("algorithm,algo", ALGOS)
def test_run_end_to_end_compiles_the_round_once(tiny_config, tmp_path, algorithm, algo):
  def build(c, rt):
    alg = SPECS[c.algorithm].build(c, rt)
    # traced twice in a whole run: once for the shapes of the per-round metric buffers,
    # once into the compiled dispatch loop (program.compile_dispatch); never again per round
    return alg._replace(round=chex.assert_max_traces(alg.round, n=2))

  config = tiny_config(algorithm, "tiny", {**SMALL, **algo})
  summary = loop.run(config, str(tmp_path), log=lambda s: None, build=build)
  with open(os.path.join(tmp_path, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  assert [r["round"] for r in rows] == [1, 2]
  assert all(np.isfinite(r["train_loss"]) and 0.0 <= r["mean_test_acc"] <= 1.0
             for r in rows)
  assert summary["rounds_completed"] == 2 and len(summary["per_client_test_acc"]) == 8

  exp = experiment.prepare(config)
  abstract = program.compile_fns(exp).abstract
  ckpt = ckpt_lib.Checkpointer(os.path.join(tmp_path, "checkpoints"), max_to_keep=2,
                               fingerprint=runfiles.fingerprint(exp))
  state, _ = ckpt.restore_latest(abstract)
  assert_server_holds_no_client_leaf(state)
  size = base.count_params(state.server)
  if algorithm == "fedkd":  # SVD: fewer parameters than the mentee, both ways
    assert 0 < rows[0]["uplink_params"] < size and 0 < rows[0]["downlink_params"] < size
  else:
    assert rows[0]["uplink_params"] == size == rows[0]["downlink_params"]
  if algorithm == "fedapen":
    assert all(isinstance(c.model_state, fedapen.ApenState) for c in state.clients)
    lam = np.concatenate([np.asarray(fedapen.weight(c)) for c in state.clients])
    assert np.all((lam >= 0) & (lam <= 1))
    assert np.any(np.abs(lam - 0.5) > 1e-4)  # clients learned their lambda


def test_fedkd_energy_is_annealed_from_start_to_end():
  from fedjax_het.algorithms import fedkd
  t = [float(fedkd.energy_at(jnp.int32(r), 0.95, 0.98, 10)) for r in (0, 4, 9, 20)]
  np.testing.assert_allclose(t, [0.95, 0.962, 0.977, 0.98], atol=1e-6)
  a = jax.random.normal(jax.random.PRNGKey(0), (20, 12))
  for energy in (0.5, 0.9, 0.99):
    recon, _ = fedkd.svd_compress(a, jnp.float32(energy))
    s_full = np.linalg.svd(np.asarray(a), compute_uv=False)
    s_kept = np.linalg.svd(np.asarray(recon), compute_uv=False)
    assert np.sum(s_kept ** 2) >= energy * np.sum(s_full ** 2) - 1e-4


def test_kl_mean_reduction_divides_by_the_classes():
  batchmean = mutual.kl_divergence(LOGITS_B, LOGITS_A, MASK)
  mean = mutual.kl_divergence(LOGITS_B, LOGITS_A, MASK, "mean")
  np.testing.assert_allclose(mean, batchmean / 3, rtol=1e-6)  # C = 3
  loss_l, _ = fml.mutual_losses(LOGITS_A, LOGITS_B, LABELS, MASK, alpha=0.3, beta=0.8,
                                kl_reduction="mean")
  np.testing.assert_allclose(loss_l, 0.3 * _np_ce(LOGITS_A, LABELS)[:2].mean()
                             + 0.7 * _np_kl(LOGITS_B, LOGITS_A)[:2].mean() / 3, rtol=1e-5)
  with pytest.raises(ValueError, match="kl reduction 'sum'"):
    mutual.kl_divergence(LOGITS_B, LOGITS_A, MASK, "sum")


@pytest.mark.parametrize("algorithm", ["fml", "fedkd"])
def test_evaluate_shared_tests_the_shared_model(tiny_config, algorithm):
  """``algo.evaluate='shared'``: protocol (a) predicts with the server's theta for every
  client (a client's private model does not matter); 'private' with its own model."""
  extra = {"algo.svd_energy_start": 0.0} if algorithm == "fedkd" else {}
  outs = {}
  for evaluate in ("private", "shared"):
    exp = experiment.prepare(tiny_config(algorithm, "tiny", {**SMALL, **extra,
                                                       "algo.evaluate": evaluate}))
    proto = exp.algorithm.protocol
    # jitted: op by op, the first test of a worker to run these models took 20 s
    state = jax.jit(exp.algorithm.init)(jax.random.PRNGKey(0))
    client = jax.tree.map(lambda a: a[0], packing.as_tree(state.clients[0]))
    payload = proto.downlink(state.server, 0)
    x = jnp.ones((2, *exp.data.x.shape[1:]), jnp.float32)
    scrambled = client.replace(params=dict(
        client.params, local=jax.tree.map(lambda a: a + 1.0, client.params["local"])))
    predict = jax.jit(lambda c, p, x, proto=proto: proto.predict(0, c, p)(x))
    outs[evaluate] = (predict(client, payload, x), predict(scrambled, payload, x))
  assert not np.allclose(*outs["private"])  # the private model decides
  np.testing.assert_array_equal(*outs["shared"])  # only theta decides
  assert not np.allclose(outs["private"][0], outs["shared"][0])


@pytest.mark.parametrize("algorithm", ["fml", "fedkd"])
def test_evaluate_and_kl_reduction_are_checked(tiny_config, algorithm):
  for key, value in (("algo.evaluate", "mentor"), ("algo.kl_reduction", "sum")):
    with pytest.raises(ValueError, match=key.split(".")[1]):
      experiment.prepare(tiny_config(algorithm, "tiny", {**SMALL, key: value}))
