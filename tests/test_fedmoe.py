"""FedMoE mechanics on tiny inputs: gate weights, uplink, a round, gate analysis."""
import by_hand
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_server_holds_no_client_leaf

from fedjax_het.algorithms import fedmoe
from fedjax_het.training import experiment
from fedjax_het.training import program

# programs that compile far longer than they run: level 0 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("compile_bound")


def _net():
  return fedmoe.FedMoENets("tiny", global_arch="tiny", gating_hidden=8, num_classes=10,
                           dtype=jnp.float32)


def test_gate_weights_sum_to_one_and_vary():
  net = _net()
  params, state = net.init(jax.random.PRNGKey(0))
  x = jax.random.normal(jax.random.PRNGKey(1), (6, 32, 32, 3))
  w, _ = net.gate_weights(params, state, x, train=True)
  chex.assert_shape(w, (6, 2))
  np.testing.assert_allclose(w.sum(-1), np.ones(6), rtol=1e-5)
  assert float(jnp.std(w[:, 0])) > 1e-4


def test_mixture_is_convex_combination_of_experts():
  net = _net()
  params, state = net.init(jax.random.PRNGKey(0))
  x = jax.random.normal(jax.random.PRNGKey(1), (4, 32, 32, 3))
  logits, _ = net.logits(params, state, x, train=False)
  w, _ = net.gate_weights(params, state, x, train=False)
  from fedjax_het import models
  rep_g = net.expert.apply({"params": params["global_ex"]}, x)[0]
  rep_f = models.extract(net.local, params["local"], x)
  expected = models.classify(net.local, params["local"], w[:, :1] * rep_g + w[:, 1:] * rep_f)
  np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-6)


def test_uplink_is_the_global_expert_only():
  net = _net()
  params, _ = net.init(jax.random.PRNGKey(3))
  up = fedmoe.uplink(params)
  assert jax.tree.structure(up) == jax.tree.structure(params["global_ex"])
  private = jax.tree.leaves((params["local"], params["gate"]))
  for leaf in jax.tree.leaves(up):
    assert not any(leaf.shape == p.shape and np.array_equal(leaf, p) for p in private)


def test_gate_gets_its_own_learning_rate():
  opt = fedmoe.optimizer(0.1, 0.0)
  params = {"gate": {"w": jnp.ones(2)}, "local": {"w": jnp.ones(2)}}
  updates, _ = opt.update(jax.tree.map(jnp.ones_like, params), opt.init(params), params)
  np.testing.assert_allclose(updates["gate"]["w"], [0.0, 0.0])
  np.testing.assert_allclose(updates["local"]["w"], [-0.1, -0.1])


def test_round_compiles_once_averages_by_counts_learns_and_gate_analysis(tiny_config):
  """Eq. 6 with the partition's unequal counts after round 1; after 5 rounds the clients
  beat twice the accuracy of their label prior; one compiled round throughout."""
  exp = experiment.prepare(tiny_config("fedmoe", overrides={
      "algo.global_arch": "tiny", "algo.gating_hidden": 8, **by_hand.LEARNS}))
  init = program.compile_fns(exp).init
  state = init(jax.random.PRNGKey(0))
  round_fn = jax.jit(chex.assert_max_traces(exp.algorithm.round, n=1))
  state, metrics = round_fn(state, exp.data)
  # theta = sum_k n_k theta_k / sum_k n_k, n_k counted from the tables' masks
  by_hand.assert_weighted_by_counts(exp, state, lambda c: c.params["global_ex"])
  for _ in range(4):
    state, metrics = round_fn(state, exp.data)
  assert np.isfinite(float(metrics["train_loss"]))
  assert_server_holds_no_client_leaf(state)
  by_hand.assert_learned(exp, exp.algorithm.evaluate(state, exp.data))
  gates = fedmoe.test_gate_weights(exp.runtime, state, exp.data, gating_hidden=8,
                                   global_arch="tiny")
  for g, (w, labels, mask) in enumerate(gates):
    index = exp.data.groups[g]
    chex.assert_shape(w, index.test_idx.shape + (2,))
    chex.assert_equal_shape([labels, mask])
    np.testing.assert_allclose(np.asarray(w).sum(-1)[np.asarray(mask)], 1.0, rtol=1e-5)
