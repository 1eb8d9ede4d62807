"""FedMRL's equations (Yi et al., NeurIPS 2024) recomputed by hand on fixed params and a batch.

Eq. 1 (fusion through the projector), Eq. 2 (coarse and fine Matryoshka slices), Eq. 3
with m_lc != m_hf != 1 and one SGD step of theta, omega and phi against ``jax.grad`` of the
recomputed loss, the four inference modes: through the protocol of ONE client. Eq. 4 with
the example counts of a partition, and that FedMRL learns: through ``Algorithm.round``, in
tests/test_fedmrl.py (its compiled round serves both).
Nothing here calls FedMRL's own helpers (``FedMRLNets.fused/heads``, ``loss_fn``,
``weighted_average``) to make an expected value.
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
from by_hand import sgd

from fedjax_het import models
from fedjax_het.algorithms import fedmrl

pytestmark = pytest.mark.usefixtures("compile_bound")

D1, D2, B, LR = 6, 500, 4, 0.1
M_LC, M_HF = 0.3, 1.7
SMALL = models.get_model("tiny", num_classes=10, rep_dim=D1)
LARGE = models.get_model("tiny2", num_classes=10, rep_dim=D2)


def build(**kw):
  return fedmrl.fedmrl(runtime(archs=("tiny2",), batch_size=B), learning_rate=LR, d1=D1,
                       small_arch="tiny", m_lc=M_LC, m_hf=M_HF, **kw).protocol


def fused(params, x):
  """Eq. 1: R = P(concat(G_ex(x), F_ex(x))) [B, d2]."""
  both = jnp.concatenate([rep(SMALL, params["global"], x), rep(LARGE, params["local"], x)],
                         axis=-1)
  assert both.shape == (x.shape[0], D1 + D2)
  return dense(both, params["proj"])


def heads(params, x):
  """Eq. 2: G_hd(R[:d1]) and F_hd(R[:d2]) (R is d2 wide: the fine slice is all of it)."""
  r = fused(params, x)
  return (dense(r[:, :D1], params["global"]["header"]["fc"]),
          dense(r, params["local"]["header"]["fc"]))


def loss(params, x, y):
  """Eq. 3: m_lc CE(coarse) + m_hf CE(fine)."""
  small, large = heads(params, x)
  return M_LC * ce(small, y) + M_HF * ce(large, y)


@pytest.fixture(scope="module")
def client_and_theta():
  proto = build()
  client = jax.jit(proto.init_client, static_argnums=0)(0, jax.random.PRNGKey(0))
  # a theta other than the client's own copy: the step must start from the download
  theta = jax.jit(lambda k: jax.tree.map(lambda a: 0.9 * a, proto.init_server(k)))(
      jax.random.PRNGKey(1))
  return proto, client, theta


def test_one_sgd_step_of_theta_omega_phi_is_the_gradient_of_eq3(client_and_theta):
  proto, client, theta = client_and_theta
  data = pool(B)
  idx, mask = one_batch(B)
  new, upload, aux = jax.jit(proto.client_update, static_argnums=0)(
      0, client, theta, data, idx, mask, jax.random.PRNGKey(2))
  start = dict(client.params, **{"global": theta})
  x = normalized(data.x)
  value, grads = jax.jit(jax.value_and_grad(loss))(start, x, data.y)
  np.testing.assert_allclose(aux["loss"], value, rtol=1e-5)
  expected = sgd(start, grads, LR)
  assert_close(new.params, expected, rtol=1e-4, atol=1e-6)
  assert_close(upload, expected["global"], rtol=1e-4, atol=1e-6)  # theta_k goes up
  # each block really moved (a zero gradient would pass the comparison trivially)
  for block in ("global", "local", "proj"):
    moved = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(
        jax.tree.leaves(new.params[block]), jax.tree.leaves(start[block])))
    assert moved > 1e-5, block


def test_eq3_weighs_the_two_heads_by_m_lc_and_m_hf(client_and_theta):
  proto, client, theta = client_and_theta
  data = pool(B, seed=3)
  idx, mask = one_batch(B)
  params = dict(client.params, **{"global": theta})
  small, large = jax.jit(heads)(params, normalized(data.x))
  expected = M_LC * ce(small, data.y) + M_HF * ce(large, data.y)
  _, _, aux = jax.jit(proto.client_update, static_argnums=0)(
      0, client, theta, data, idx, mask, jax.random.PRNGKey(2))
  np.testing.assert_allclose(aux["loss"], expected, rtol=1e-5)
  # the two terms differ, so swapping or dropping a weight changes the loss
  assert abs(float(ce(small, data.y) - ce(large, data.y))) > 1e-3


@pytest.fixture(scope="module")
def four_modes(client_and_theta):
  """The four modes' logits by hand on 3 images: {mode: logits}."""
  _, client, theta = client_and_theta
  x = normalized(pool(3, seed=5).x)

  @jax.jit
  def expected(params, theta, x):
    params = dict(params, **{"global": theta})  # the server's latest theta
    small, large = heads(params, x)
    return {"mix-large": large, "mix-small": small,
            "single-large": dense(rep(LARGE, params["local"], x),
                                  params["local"]["header"]["fc"]),
            "single-small": dense(rep(SMALL, theta, x), theta["header"]["fc"])}
  return x, expected(client.params, theta, x)


@pytest.mark.parametrize("inference", fedmrl.INFERENCE)
def test_the_four_inference_modes(client_and_theta, four_modes, inference):
  _, client, theta = client_and_theta
  x, expected = four_modes
  proto = build(inference=inference)
  logits = jax.jit(lambda c, t, x: proto.predict(0, c, t)(x))(client, theta, x)
  np.testing.assert_allclose(logits, expected[inference], rtol=1e-4, atol=1e-5)
  for k in fedmrl.INFERENCE:  # the four modes really differ on this batch
    if k != inference:
      assert not np.allclose(expected[k], expected[inference], atol=1e-3), k
