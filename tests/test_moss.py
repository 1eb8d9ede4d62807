"""Moss: WIRE meta-networks, FILE weights, the uplink, one compiled round."""
import by_hand
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from conftest import assert_server_holds_no_client_leaf

from fedjax_het import models
from fedjax_het.algorithms import moss as moss_lib
from fedjax_het.algorithms import moss_wire as wire
from fedjax_het.training import experiment
from fedjax_het.training import program

# programs that compile far longer than they run: level 0
pytestmark = pytest.mark.usefixtures("compile_bound")
LAYERS = ("conv1", "conv2", "rep")


def tiny_net(arch="tiny"):
  net = models.get_model(arch, num_classes=10, rep_dim=16)
  return net, (lambda p, x: net.apply({"params": p}, x))


def images(n, seed=0):
  return jax.random.normal(jax.random.PRNGKey(seed), (n, 32, 32, 3))


def test_file_weights_follow_fidelity():
  # logits of two proxies vs their sources, hand-computed cosines: 1.0 and 0.5.
  src = jnp.array([[1.0, 0.0], [0.0, 2.0]])
  close = jnp.array([[2.0, 0.0], [0.0, 1.0]])  # cos 1, 1
  far = jnp.array([[1.0, jnp.sqrt(3.0)], [jnp.sqrt(3.0), 1.0]])  # cos 0.5, 0.5
  fid = jnp.stack([wire.fidelity(close, src), wire.fidelity(far, src)])
  np.testing.assert_allclose(fid, [1.0, 0.5], atol=1e-6)
  np.testing.assert_allclose(moss_lib.file_weights(fid), [2 / 3, 1 / 3], atol=1e-6)
  np.testing.assert_allclose(moss_lib.file_weights(jnp.array([0.5, 1.5, -1.0])),
                             [0.25, 0.75, 0.0], atol=1e-6)
  np.testing.assert_allclose(moss_lib.file_weights(jnp.array([-1.0, 0.0])), [0.5, 0.5])
  np.testing.assert_allclose(moss_lib.file_weights(fid, "uniform"), [0.5, 0.5])


def test_location_rows_are_distributions_and_degree_too():
  net, apply = tiny_net()
  params = net.init(jax.random.PRNGKey(0), images(1))["params"]
  c = wire.channels(apply, params, LAYERS)
  meta = wire.init_meta(c, LAYERS)
  meta = jax.tree.map(lambda a: jax.random.normal(jax.random.PRNGKey(1), a.shape), meta)

  @jax.jit
  def nets(meta, params, x):
    src = wire.pooled_features(apply(params, x)[1], LAYERS)
    return wire.location(meta, src, LAYERS), wire.degree(meta, src, LAYERS)

  lam, deg = nets(meta, params, images(5))
  assert lam.shape == (5, 3, 3)
  assert np.all(np.asarray(lam) >= 0)
  np.testing.assert_allclose(jnp.sum(lam, -1), 1.0, atol=1e-5)
  for n in LAYERS:
    for m in LAYERS:
      assert deg[n][m].shape == (5, c[m])
      np.testing.assert_allclose(jnp.sum(deg[n][m], -1), 1.0, atol=1e-5)


def wire_start(num_images, src_scale=1.0):
  """A tiny source (its weights times ``src_scale``) and a fresh target of its
  architecture, public images, the meta optimizer and a fresh WIRE state."""
  net, apply = tiny_net()
  src = jax.tree.map(lambda p: src_scale * p,
                     net.init(jax.random.PRNGKey(0), images(1))["params"])
  tgt = net.init(jax.random.PRNGKey(7), images(1))["params"]
  c = wire.channels(apply, src, LAYERS)
  meta = wire.init_meta(c, LAYERS)
  opt = optax.adam(1e-3)
  ws = {"meta": meta, "meta_opt": opt.init(meta),
        "reg": wire.init_regressors(jax.random.PRNGKey(2), c, c, LAYERS)}
  return apply, src, tgt, images(num_images, seed=3), opt, ws


def test_transfer_to_same_architecture_reaches_high_fidelity():
  apply, src, tgt, x, opt, ws = wire_start(num_images=32)
  cfg = wire.WireConfig(LAYERS, steps=40, batch=16, lr=0.5, beta=0.1)
  run = jax.jit(lambda t, w: wire.transfer(cfg, opt, apply, src, apply, t, w, x,
                                           jax.random.PRNGKey(4)))
  before = wire.fidelity(apply(tgt, x)[0], apply(src, x)[0])
  new, ws2, loss = run(tgt, ws)
  after = wire.fidelity(apply(new, x)[0], apply(src, x)[0])
  assert np.isfinite(loss)
  assert after > 0.9 and after > before, (before, after)
  # the meta-networks moved (they received a meta-gradient)
  assert float(jnp.abs(ws2["meta"]["loc_b"]).sum()) > 0
  # a copy of the source stays a faithful copy
  same, _, _ = run(src, ws)
  assert wire.fidelity(apply(same, x)[0], apply(src, x)[0]) > 0.95


def test_wire_clip_bounds_each_step_and_keeps_a_diverging_transfer_finite():
  """A source with large features (its weights x10) makes L_wfm's SGD steps diverge to
  non-finite weights within 10 steps at lr=0.1, as Moss's WIRE did in one run of
  docs/claims.md; with ``clip`` each step moves lr * clip at most and the weights stay
  finite."""
  apply, src, tgt, x, opt, ws = wire_start(num_images=16, src_scale=10.0)

  def run(clip):
    cfg = wire.WireConfig(LAYERS, steps=10, batch=16, lr=0.1, beta=0.5, clip=clip)
    return jax.jit(lambda t, w: wire.transfer(cfg, opt, apply, src, apply, t, w, x,
                                              jax.random.PRNGKey(4)))(tgt, ws)

  finite = lambda tree: all(bool(jnp.all(jnp.isfinite(v))) for v in jax.tree.leaves(tree))
  assert not finite(run(0.0)[:2])
  new, ws10, loss = run(1.0)
  assert finite((new, ws10, loss))
  # theta and the regressors moved at most 10 steps of lr * clip
  step = jax.tree.map(lambda a, b: a - b, (new, ws10["reg"]), (tgt, ws["reg"]))
  moved = jnp.sqrt(sum(jnp.sum(jnp.square(v)) for v in jax.tree.leaves(step)))
  assert 0.1 < float(moved) <= 10 * 0.1 * 1.0 * (1 + 1e-5)
  with pytest.raises(ValueError, match="algo.wire_clip=-1.0 must be a number >= 0"):
    moss_lib.moss(None, learning_rate=0.1, wire_clip=-1.0)


def test_naive_copy_overlapping_slices():
  src = {"a": jnp.ones((2, 3)), "b": jnp.ones((4,)), "only_src": jnp.ones(1)}
  tgt = {"a": jnp.zeros((3, 2)), "b": jnp.zeros((2,)), "c": jnp.zeros(2)}
  out = wire.naive_copy(src, tgt)
  np.testing.assert_array_equal(out["a"], [[1, 1], [1, 1], [0, 0]])
  np.testing.assert_array_equal(out["b"], [1, 1])
  np.testing.assert_array_equal(out["c"], [0, 0])


def test_round_compiles_once_sends_the_device_model_and_learns(tiny_config):
  """5 rounds of one compiled round; the clients then beat twice the accuracy of their
  label prior. What a client uploads (its trained device model, whole) is checked by
  hand in tests/test_equations_moss.py."""
  c = tiny_config("moss", models="tiny,tiny2", overrides={
      "data.public": 32, "algo.public_size": 32, "algo.public_batch": 16, "algo.wire_steps": 1,
      "algo.wire_layers": "conv2,rep", **by_hand.LEARNS})
  exp = experiment.prepare(c)
  alg, rt = exp.algorithm, exp.runtime
  assert rt.layout.archs == ("tiny", "tiny2") and rt.layout.group_sizes == (4, 4)
  init = program.compile_fns(exp).init
  state = init(jax.random.PRNGKey(0))
  # proxy = the larger device architecture. On 16x16 images, rep_dim 500: tiny is conv
  # 5x5 3->4, 4->8, fc 8->32, 32->500, header 500->10; tiny2 conv 3->4, 4->6, fc 6->24, 24->500
  sizes = [models.count_params(state.server["types"][g]) for g in range(2)]
  tiny = (75 * 4 + 4) + (100 * 8 + 8) + (8 * 32 + 32) + (32 * 500 + 500) + (500 * 10 + 10)
  tiny2 = (75 * 4 + 4) + (100 * 6 + 6) + (6 * 24 + 24) + (24 * 500 + 500) + (500 * 10 + 10)
  assert sizes == [tiny, tiny2] == [22910, 18588]
  assert models.count_params(state.server["proxy"]) == tiny

  round_fn = jax.jit(chex.assert_max_traces(alg.round, n=1))
  for _ in range(5):
    state, m = round_fn(state, exp.data)
  assert int(state.round) == 5
  assert np.isfinite(float(m["train_loss"]))
  assert_server_holds_no_client_leaf(state)
  # every client takes part (C = 1): per participating client, the mean of its type's size
  assert float(m["uplink_params"]) == float(m["downlink_params"]) == (4 * tiny + 4 * tiny2) / 8
  np.testing.assert_allclose(jnp.sum(m["file_weights"]), 1.0, atol=1e-6)
  assert float(m["public_overlap"]) == 0.0  # data.public holds the set out of every client
  counts = alg.evaluate(state, exp.data)
  assert len(counts) == 2
  by_hand.assert_learned(exp, counts)


def test_moss_without_a_held_out_public_set_is_refused_before_data(tiny_config):
  from fedjax_het import validation
  with pytest.raises(ValueError, match=r"data.public=0 is invalid: Moss needs a public set"):
    validation.validate(tiny_config("moss", "tiny"))
  with pytest.raises(ValueError, match=r"algo.public_size=500"):
    validation.validate(tiny_config("moss", "tiny", {"data.public": 100}))
  validation.validate(tiny_config("moss", "tiny", {"data.public": 500}))
  for bad in (-1.0, True):
    with pytest.raises(ValueError, match=r"algo.wire_clip=.* must be a number >= 0"):
      validation.validate(tiny_config("moss", "tiny", {"data.public": 500,
                                                       "algo.wire_clip": bad}))
  validation.validate(tiny_config("moss", "tiny", {"data.public": 500, "algo.wire_clip": 50}))


def test_synthetic_images_are_fixed_smooth_colour_fields():
  key = jax.random.PRNGKey(3)
  x = moss_lib.synthetic_images(key, 8, (32, 32, 3))
  chex.assert_shape(x, (8, 32, 32, 3))
  assert x.dtype == jnp.uint8
  np.testing.assert_array_equal(x, moss_lib.synthetic_images(key, 8, (32, 32, 3)))
  assert not np.array_equal(x, moss_lib.synthetic_images(jax.random.PRNGKey(4), 8,
                                                         (32, 32, 3)))
  f = np.asarray(x, np.float32)
  neighbour = np.abs(np.diff(f, axis=2)).mean()  # pixel to pixel: the noise, small
  spread = f.std(axis=(1, 2)).mean()  # across an image: the colour field, large
  assert neighbour < 15 and spread > 30, (neighbour, spread)


def test_synthetic_public_domain_needs_no_held_out_images(tiny_config):
  from fedjax_het import validation
  from fedjax_het.models.preprocess import normalize
  c = tiny_config("moss", models="tiny,tiny2", overrides={
      "algo.public_domain": "synthetic", "algo.public_size": 16,
      "algo.public_batch": 8, "algo.wire_steps": 1, "algo.wire_layers": "conv2,rep"})
  validation.validate(c)  # data.public = 0: no image of the dataset is public
  exp = experiment.prepare(c)
  rng = jax.random.PRNGKey(5)
  public, _ = exp.algorithm.protocol.server_data(exp.data, rng)
  expected = normalize(moss_lib.synthetic_images(
      jax.random.fold_in(rng, moss_lib.PUBLIC_SEED), 16, exp.runtime.layout.image_shape),
      exp.runtime.normalization)
  np.testing.assert_allclose(public, expected, rtol=1e-6)
  init = program.compile_fns(exp).init
  state, m = jax.jit(exp.algorithm.round)(init(jax.random.PRNGKey(0)), exp.data)
  assert float(m["public_overlap"]) == 0.0 and np.isfinite(float(m["train_loss"]))
  assert np.all(np.isfinite(np.asarray(m["fidelity"])))
  with pytest.raises(ValueError, match="public_domain"):
    validation.validate(tiny_config("moss", "tiny", {"algo.public_domain": "imagenet",
                                                     "data.public": 500}))
