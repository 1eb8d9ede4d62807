"""pFedMoE's equations (Yi et al., arXiv 2402.01350) recomputed by hand on fixed params.

Per sample (Eq. 1-3): R_i = alpha_{i,G} G(x_i; theta) + alpha_{i,F} F_ex(x_i; omega);
y_hat_i = F_hd(R_i); loss CE; theta and omega stepped at eta_omega, the gate at its own
eta_phi; theta (and nothing else) uploaded. Through the protocol of ONE client; the
server's average with the partition's unequal counts (Eq. 6) and that FedMoE learns are
checked in tests/test_fedmoe.py's round test. The gate's weights come from the gating
network's own module (a model, tested in tests/test_models_gating.py); everything the
algorithm does with them is written out here.
"""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from by_hand import assert_close
from by_hand import ce
from by_hand import dense
from by_hand import normalized
from by_hand import one_batch
from by_hand import pool
from by_hand import rep
from by_hand import runtime

from fedjax_het import models
from fedjax_het.algorithms import fedmoe

pytestmark = pytest.mark.usefixtures("compile_bound")

B, LR, GATE_LR, HIDDEN = 6, 0.1, 0.03, 8
LOCAL = models.get_model("tiny2", num_classes=10, rep_dim=500)
GATE = models.GatingNetwork(hidden=HIDDEN)


def expert_rep(theta, x):
  """G(x; theta): the global expert, an extractor (the tiny CNN's without its header)."""
  return models.get_extractor("tiny", rep_dim=500).apply({"params": theta}, x)[0]


def forward(params, model_state, x, train):
  """(logits, alpha [B, 2], the gate's new batch statistics) of Eq. 1-3."""
  variables = {"params": params["gate"], "batch_stats": model_state["gate"]}
  if train:
    alpha, new = GATE.apply(variables, x, train=True, mask=jnp.ones(x.shape[0], bool),
                            mutable=["batch_stats"])
    stats = {"gate": new["batch_stats"]}
  else:
    alpha, stats = GATE.apply(variables, x, train=False), model_state
  mixed = (alpha[:, 0:1] * expert_rep(params["global_ex"], x)
           + alpha[:, 1:2] * rep(LOCAL, params["local"], x))
  return dense(mixed, params["local"]["header"]["fc"]), alpha, stats


def loss(params, model_state, x, y):
  logits, _, stats = forward(params, model_state, x, train=True)
  return ce(logits, y), stats


@pytest.fixture(scope="module")
def setup():
  proto = fedmoe.fedmoe(runtime(archs=("tiny2",), batch_size=B), learning_rate=LR,
                        gating_learning_rate=GATE_LR, gating_hidden=HIDDEN,
                        global_arch="tiny").protocol
  client = jax.jit(proto.init_client, static_argnums=0)(0, jax.random.PRNGKey(0))
  theta = jax.jit(lambda k: jax.tree.map(lambda a: 0.9 * a, proto.init_server(k)))(
      jax.random.PRNGKey(1))
  return proto, client, theta


def test_one_step_mixes_experts_per_sample_and_steps_the_gate_at_its_own_rate(setup):
  proto, client, theta = setup
  data = pool(B, seed=1)
  idx, mask = one_batch(B)
  new, upload, aux = jax.jit(proto.client_update, static_argnums=0)(
      0, client, theta, data, idx, mask, jax.random.PRNGKey(2))
  start = dict(client.params, global_ex=theta)  # theta downloaded
  x = normalized(data.x)
  (value, stats), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(
      start, client.model_state, x, data.y)
  np.testing.assert_allclose(aux["loss"], value, rtol=1e-5)
  expected = {k: jax.tree.map(lambda p, g, k=k: p - (GATE_LR if k == "gate" else LR) * g,
                              start[k], grads[k]) for k in start}
  assert_close(new.params, expected, rtol=1e-4, atol=1e-6)
  assert_close(new.model_state, stats, rtol=1e-5, atol=1e-6)  # the gate's batch statistics
  # the upload is the trained theta_k, and only it
  assert_close(upload, expected["global_ex"], rtol=1e-4, atol=1e-6)
  assert jax.tree.structure(upload) == jax.tree.structure(theta)
  for block in start:  # every block moved, the gate too
    moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
        jax.tree.leaves(new.params[block]), jax.tree.leaves(start[block])))
    assert moved > 1e-6, block


def test_predict_is_the_header_of_the_per_sample_mixture(setup):
  proto, client, theta = setup
  x = normalized(pool(5, seed=4).x)
  logits = jax.jit(lambda c, t, x: proto.predict(0, c, t)(x))(client, theta, x)
  params = dict(client.params, global_ex=theta)  # the server's latest theta
  expected, alpha, _ = jax.jit(forward, static_argnums=3)(params, client.model_state, x,
                                                          False)
  np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)
  alpha = np.asarray(alpha)
  np.testing.assert_allclose(alpha.sum(-1), 1.0, rtol=1e-5)
  assert alpha[:, 0].std() > 1e-4  # per sample, not one mixture for the batch
  assert np.all((alpha > 0.01) & (alpha < 0.99))  # both experts count
