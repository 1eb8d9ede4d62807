"""Tests of pFedMoE's gating network and switchable normalization."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models

HIDDEN = 8
GATE = models.GatingNetwork(hidden=HIDDEN)


@jax.jit
@chex.assert_max_traces(n=1)
def _train(variables, x, mask):
  """Train-mode weights [B, 2] and the updated batch statistics."""
  return GATE.apply(variables, x, train=True, mask=mask, mutable=["batch_stats"])


@jax.jit
def _eval(variables, x):
  """Eval-mode weights, with the (unchanged) batch statistics."""
  return GATE.apply(variables, x, train=False, mutable=["batch_stats"])


BATCH = 6
ALL = np.ones(BATCH, bool)


def _images(seed=0):
  return np.random.default_rng(seed).normal(size=(BATCH, 32, 32, 3)).astype(np.float32)


@functools.cache
def _gate_variables():
  """Initial variables (one compiled init for the whole module)."""
  key = jax.random.key(0, impl="rbg")  # compiles much faster than threefry on CPU
  return jax.jit(GATE.init, static_argnames="train")(key, _images(), train=False)


def _perturbed_variables(seed=3):
  """Initial variables with params moved at random, so that outputs vary per sample."""
  v = _gate_variables()
  rng = np.random.default_rng(seed)
  params = jax.tree.map(lambda a: a + 0.3 * rng.normal(size=a.shape).astype(np.float32),
                        v["params"])
  return {"params": params, "batch_stats": v["batch_stats"]}


def test_gating_variables_layout():
  v = _gate_variables()
  d = 32 * 32 * 3
  assert set(v) == {"params", "batch_stats"}
  assert set(v["params"]) == {"norm", "fc1", "bn1", "fc2", "bn2"}
  assert set(v["batch_stats"]) == {"norm", "bn1", "bn2"}
  chex.assert_shape(v["params"]["norm"]["mean_weight"], (2,))
  chex.assert_shape(v["params"]["norm"]["scale"], (d,))
  chex.assert_shape(v["params"]["fc1"]["kernel"], (d, HIDDEN))
  chex.assert_shape(v["params"]["fc2"]["kernel"], (HIDDEN, 2))
  chex.assert_shape(v["batch_stats"]["norm"]["var"], (d,))
  chex.assert_shape(v["batch_stats"]["bn2"]["mean"], (2,))


@pytest.mark.parametrize("train", [True, False])
def test_gating_weights_sum_to_one_and_vary(train):
  x = _images()
  v = _perturbed_variables()
  w, _ = _train(v, x, ALL) if train else _eval(v, x)
  chex.assert_shape(w, (BATCH, 2))
  assert w.dtype == jnp.float32
  np.testing.assert_allclose(jnp.sum(w, axis=-1), np.ones(BATCH), rtol=1e-6)
  assert bool(jnp.all(w > 0))
  assert float(jnp.std(w[:, 0])) > 1e-3  # per-sample, not one weight for the batch


def test_batch_stats_update_in_train_mode_only():
  x = _images()
  v = _gate_variables()
  _, new = _train(v, x, ALL)
  for name in ("norm", "bn1", "bn2"):
    assert not np.allclose(new["batch_stats"][name]["mean"], v["batch_stats"][name]["mean"])
  _, same = _eval(v, x)
  chex.assert_trees_all_close(same["batch_stats"], v["batch_stats"])


def test_gating_train_step_traces_once():
  v = _gate_variables()
  w1, new = _train(v, _images(), ALL)
  w2, _ = _train({"params": v["params"], **new}, _images(seed=1), ALL)  # max_traces=1
  chex.assert_shape([w1, w2], (BATCH, 2))


def _sn_reference(x, mean_logits, var_logits, scale, bias, ra_mean=None, ra_var=None,
                  eps=1e-5):
  """Switchable norm of [B, D] over (layer, batch) statistics, by hand in numpy."""
  wm = np.exp(mean_logits) / np.exp(mean_logits).sum()
  wv = np.exp(var_logits) / np.exp(var_logits).sum()
  mu_ln, var_ln = x.mean(1, keepdims=True), x.var(1, keepdims=True)
  if ra_mean is None:
    mu_bn, var_bn = x.mean(0), x.var(0)
  else:
    mu_bn, var_bn = ra_mean, ra_var
  mu = wm[0] * mu_ln + wm[1] * mu_bn
  var = wv[0] * var_ln + wv[1] * var_bn
  return (x - mu) / np.sqrt(var + eps) * scale + bias


def _sn_setup(b=5, d=4):
  rng = np.random.default_rng(0)
  x = rng.normal(size=(b, d)).astype(np.float32) * 2 + 1
  sn = models.SwitchableNorm()
  v = sn.init(jax.random.key(0), x, use_running_average=False)
  params = {"mean_weight": np.log(np.array([3.0, 1.0], np.float32)),  # softmax [.75, .25]
            "var_weight": np.array([0.0, 0.0], np.float32),          # softmax [.5, .5]
            "scale": rng.normal(size=d).astype(np.float32),
            "bias": rng.normal(size=d).astype(np.float32)}
  return x, sn, params, v["batch_stats"]


def test_switchable_norm_init():
  x, sn, _, stats = _sn_setup()
  v = sn.init(jax.random.key(0), x, use_running_average=False)
  np.testing.assert_allclose(jax.nn.softmax(v["params"]["mean_weight"]), [0.5, 0.5])
  np.testing.assert_allclose(stats["mean"], np.zeros(4))
  np.testing.assert_allclose(stats["var"], np.ones(4))
  assert models.SN_STATISTICS == ("layer", "batch")


def test_switchable_norm_train_mixes_with_softmax_weights():
  x, sn, params, stats = _sn_setup()
  y, new = sn.apply({"params": params, "batch_stats": stats}, x,
                    use_running_average=False, mutable=["batch_stats"])
  ref = _sn_reference(x, params["mean_weight"], params["var_weight"], params["scale"],
                      params["bias"])
  np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
  # r <- 0.997 r + 0.003 batch, from (mean 0, var 1).
  np.testing.assert_allclose(new["batch_stats"]["mean"], 0.003 * x.mean(0), rtol=1e-5)
  np.testing.assert_allclose(new["batch_stats"]["var"], 0.997 + 0.003 * x.var(0), rtol=1e-5)


def test_switchable_norm_eval_uses_running_stats():
  x, sn, params, _ = _sn_setup()
  stats = {"mean": np.array([0.5, -1.0, 2.0, 0.0], np.float32),
           "var": np.array([1.0, 4.0, 0.25, 2.0], np.float32)}
  y = sn.apply({"params": params, "batch_stats": stats}, x, use_running_average=True)
  ref = _sn_reference(x, params["mean_weight"], params["var_weight"], params["scale"],
                      params["bias"], stats["mean"], stats["var"])
  np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-5)
  # Eval output of one sample does not depend on the rest of the batch.
  y0 = sn.apply({"params": params, "batch_stats": stats}, x[:1], use_running_average=True)
  np.testing.assert_allclose(y0, y[:1], rtol=1e-6, atol=1e-6)


def test_switchable_norm_mask_ignores_padding():
  x, sn, params, stats = _sn_setup()
  mask = np.array([True, True, True, False, False])
  v = {"params": params, "batch_stats": stats}
  y, new = sn.apply(v, x, use_running_average=False, mask=mask, mutable=["batch_stats"])
  ref = _sn_reference(x[:3], params["mean_weight"], params["var_weight"], params["scale"],
                      params["bias"])
  np.testing.assert_allclose(y[:3], ref, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(new["batch_stats"]["mean"], 0.003 * x[:3].mean(0), rtol=1e-5)


def test_gating_mask_ignores_padding():
  x = _images()
  v = _perturbed_variables()
  mask = np.array([True] * 4 + [False] * 2)
  x_other_pad = x.copy()
  x_other_pad[4:] = 7.0
  w1, s1 = _train(v, x, mask)
  w2, s2 = _train(v, x_other_pad, mask)
  np.testing.assert_allclose(w1[:4], w2[:4], rtol=1e-5, atol=1e-6)
  chex.assert_trees_all_close(s1, s2, rtol=1e-5, atol=1e-6)


def test_switchable_norm_rejects_non_2d():
  sn = models.SwitchableNorm()
  with pytest.raises(ValueError, match=r"\[B, D\]"):
    sn.init(jax.random.key(0), jnp.zeros((2, 3, 4)), use_running_average=False)
