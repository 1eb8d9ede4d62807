"""Tests of the CNNs, the registry and preprocessing (fedjax_het.models)."""
import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import models

# programs that compile far longer than they run: level 0 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("compile_bound")

B = 2
REP = 16  # the tiny test model's representation width
TINY = models.get_model("tiny", num_classes=10, rep_dim=REP)

# Random-number programs compile slowly on CPU (threefry: seconds), so the tests draw
# inputs with numpy, initialise real parameters once (`_tiny_params`) from an 'rbg' key
# (same initializers, a program that compiles ~5x faster) and otherwise use eval_shape.
KEY = jax.random.key(1, impl="rbg")


def _x(batch=B, seed=0):
  return np.random.default_rng(seed).normal(size=(batch, 32, 32, 3)).astype(np.float32)


def _shapes(name, num_classes, rep_dim=500):
  """(abstract variables, abstract (logits, features)) without computing anything."""
  net = models.get_model(name, num_classes=num_classes, rep_dim=rep_dim)
  x = jax.ShapeDtypeStruct((B, 32, 32, 3), jnp.float32)
  variables = jax.eval_shape(net.init, jax.random.key(0), x)
  out = jax.eval_shape(net.apply, variables, x)
  return variables, out


@functools.cache
def _tiny_params():
  return jax.jit(TINY.init)(KEY, _x())["params"]


@jax.jit
@chex.assert_max_traces(n=1)
def _tiny_forward(params, x):
  """Full call, extract, classify and a fused representation through the header."""
  logits, feats = TINY.apply({"params": params}, x)
  rep = models.extract(TINY, params, x)
  via_method = TINY.apply({"params": params}, x, method=models.CNN.extract)
  fused = 0.5 * rep + 0.5 * jnp.ones_like(rep)
  return dict(logits=logits, feat_rep=feats["rep"], rep=rep, via_method=via_method,
              classified=models.classify(TINY, params, rep),
              fused_logits=models.classify(TINY, params, fused))


@pytest.mark.parametrize("num_classes", [10, 100])
@pytest.mark.parametrize("name", list(models.ARCHITECTURES))
def test_output_shapes(name, num_classes):
  _, (logits, feats) = _shapes(name, num_classes)
  convs, fcs = models.ARCHITECTURES[name]
  chex.assert_shape(logits, (B, num_classes))
  chex.assert_shape(feats["conv1"], (B, 28, 28, convs[0]))  # before pooling
  chex.assert_shape(feats["conv2"], (B, 10, 10, convs[1]))
  chex.assert_shape(feats["fc1"], (B, fcs[0]))
  chex.assert_shape(feats["rep"], (B, 500))
  chex.assert_shape(feats["logits"], (B, num_classes))
  assert set(feats) == {"conv1", "conv2", "fc1", "rep", "logits"}


def _conv(c_in, c_out):
  return 5 * 5 * c_in * c_out + c_out


def _fc(d_in, d_out):
  return d_in * d_out + d_out


def test_param_counts_by_hand():
  # conv1 (3->16) and the header 500->10 are common; conv2 outputs 5x5xc2 -> fc1.
  conv1 = 5 * 5 * 3 * 16 + 16                    # 1_216
  head = 500 * 10 + 10                           # 5_010
  expected = {
      "cnn1": conv1 + (5 * 5 * 16 * 32 + 32) + (800 * 2000 + 2000) + (2000 * 500 + 500)
              + head,                            # 1216+12832+1602000+1000500+5010
      "cnn2": conv1 + (5 * 5 * 16 * 16 + 16) + (400 * 2000 + 2000) + (2000 * 500 + 500)
              + head,                            # 1216+6416+802000+1000500+5010
      "cnn3": conv1 + (5 * 5 * 16 * 32 + 32) + (800 * 1000 + 1000) + (1000 * 500 + 500)
              + head,                            # 1216+12832+801000+500500+5010
      "cnn4": conv1 + (5 * 5 * 16 * 32 + 32) + (800 * 800 + 800) + (800 * 500 + 500)
              + head,                            # 1216+12832+640800+400500+5010
      "cnn5": conv1 + (5 * 5 * 16 * 32 + 32) + (800 * 500 + 500) + (500 * 500 + 500)
              + head,                            # 1216+12832+400500+250500+5010
  }
  assert expected["cnn1"] == 2_621_558
  assert expected["cnn5"] == 670_058
  for name in models.HETEROGENEOUS:
    variables, _ = _shapes(name, 10)
    assert models.count_params(variables["params"]) == expected[name], name
    assert models.count_params(variables["params"]["header"]) == head


def test_param_count_100_classes_and_tiny():
  variables, _ = _shapes("cnn1", 100)
  assert models.count_params(variables["params"]["header"]) == _fc(500, 100)
  variables, _ = _shapes("tiny", 10, rep_dim=16)
  assert models.count_params(variables["params"]) == (
      _conv(3, 4) + _conv(4, 8) + _fc(5 * 5 * 8, 32) + _fc(32, 16) + _fc(16, 10))


@pytest.mark.parametrize("rep_dim", [100, 250])
def test_rep_dim_sets_representation_width(rep_dim):
  variables, (_, feats) = _shapes("cnn5", 10, rep_dim=rep_dim)
  chex.assert_shape(feats["rep"], (B, rep_dim))
  p = variables["params"]
  chex.assert_shape(p["extractor"]["fc2"]["kernel"], (500, rep_dim))
  chex.assert_shape(p["header"]["fc"]["kernel"], (rep_dim, 10))


def test_params_tree_layout():
  variables, _ = _shapes("cnn1", 10)
  assert set(variables) == {"params"}
  p = variables["params"]
  assert set(p) == {"extractor", "header"}
  assert set(p["extractor"]) == {"conv1", "conv2", "fc1", "fc2"}
  assert set(p["header"]) == {"fc"}
  chex.assert_shape(p["extractor"]["conv1"]["kernel"], (5, 5, 3, 16))
  chex.assert_shape(p["extractor"]["fc1"]["kernel"], (800, 2000))


def test_header_shapes_equal_across_heterogeneous_models():
  trees = [jax.tree.map(lambda a: (a.shape, a.dtype), _shapes(n, 10)[0]["params"]["header"])
           for n in models.HETEROGENEOUS]
  assert all(t == trees[0] for t in trees)


def test_extract_then_classify_equals_full_call():
  out = _tiny_forward(_tiny_params(), _x())
  np.testing.assert_allclose(out["rep"], out["feat_rep"], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(out["via_method"], out["rep"], rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(out["classified"], out["logits"], rtol=1e-6, atol=1e-6)
  assert float(jnp.min(out["rep"])) >= 0.0  # representation taken after ReLU
  assert float(jnp.max(out["rep"])) > 0.0
  chex.assert_shape(out["fused_logits"], (B, 10))


def test_jit_forward_traces_once():
  a = _tiny_forward(_tiny_params(), _x(seed=1))
  b = _tiny_forward(_tiny_params(), _x(seed=2))  # same shapes: no retrace (max_traces=1)
  assert not np.allclose(a["logits"], b["logits"])


def test_get_extractor_matches_model_extractor():
  params = _tiny_params()
  ex = models.get_extractor("tiny", rep_dim=REP)
  x = _x()
  chex.assert_trees_all_equal_shapes(
      jax.eval_shape(ex.init, jax.random.key(0), x)["params"], params["extractor"])
  rep, feats = jax.jit(ex.apply)({"params": params["extractor"]}, x)
  np.testing.assert_allclose(rep, _tiny_forward(params, x)["rep"], rtol=1e-6, atol=1e-6)
  assert set(feats) == {"conv1", "conv2", "fc1", "rep"}


def test_bf16_compute_keeps_float32_params():
  net = models.get_model("tiny", num_classes=10, rep_dim=REP, dtype=jnp.bfloat16)
  variables = jax.eval_shape(net.init, jax.random.key(0), _x())
  assert all(a.dtype == jnp.float32 for a in jax.tree.leaves(variables))
  logits, feats = jax.jit(net.apply)({"params": _tiny_params()}, _x())
  assert logits.dtype == jnp.bfloat16 and feats["rep"].dtype == jnp.bfloat16
  np.testing.assert_allclose(logits.astype(jnp.float32),
                             _tiny_forward(_tiny_params(), _x())["logits"], atol=0.1)


def test_torch_default_init_bounds():
  params = _tiny_params()
  for layer, fan_in in [(params["extractor"]["conv1"], 5 * 5 * 3),
                        (params["extractor"]["fc1"], 5 * 5 * 8),
                        (params["header"]["fc"], REP)]:
    bound = 1 / np.sqrt(fan_in)
    for a in (layer["kernel"], layer["bias"]):
      assert 0.5 * bound < float(jnp.max(jnp.abs(a))) <= bound  # not zero-initialised


def test_get_model_errors():
  with pytest.raises(ValueError, match="cnn1.*cnn5.*tiny"):
    models.get_model("resnet", num_classes=10)
  with pytest.raises(ValueError, match="rep_dim"):
    models.get_model("cnn1", num_classes=10, rep_dim=0)
  with pytest.raises(ValueError, match="num_classes"):
    models.get_model("cnn1", num_classes=0)
  with pytest.raises(ValueError, match="unknown architecture"):
    models.get_extractor("cnn9")


def test_client_archs():
  assert models.client_archs("heterogeneous", 7) == [
      "cnn1", "cnn2", "cnn3", "cnn4", "cnn5", "cnn1", "cnn2"]
  assert models.client_archs("cnn3", 3) == ["cnn3"] * 3
  assert models.client_archs("tiny", 0) == []
  with pytest.raises(ValueError, match=r"`models`.*heterogeneous.*cnn1"):
    models.client_archs("hetero", 4)


def test_count_params():
  assert models.count_params({"a": jnp.zeros((2, 3)), "b": [jnp.zeros(4)]}) == 10
  assert models.count_params(jax.ShapeDtypeStruct((5, 5), jnp.float32)) == 25


def test_normalize_values():
  x = np.array([[[[0, 255, 128]]]], np.uint8)  # [1, 1, 1, 3]
  y = models.normalize(x)
  assert y.dtype == jnp.float32
  chex.assert_shape(y, (1, 1, 1, 3))
  expected = [(0 - 0.4914) / 0.2470, (1 - 0.4822) / 0.2435, (128 / 255 - 0.4465) / 0.2616]
  np.testing.assert_allclose(y[0, 0, 0], expected, rtol=1e-6)
  batch = models.normalize(np.zeros((2, 32, 32, 3), np.uint8))
  chex.assert_shape(batch, (2, 32, 32, 3))
  np.testing.assert_allclose(batch[1, 5, 7], np.negative(models.CIFAR_MEAN) /
                             np.array(models.CIFAR_STD), rtol=1e-6)


def test_im2col_conv_equals_lax_conv_with_the_same_parameters():
  import flax.linen as nn

  from fedjax_het.models import cnn

  class One(nn.Module):
    im2col: bool

    @nn.compact
    def __call__(self, x):
      return cnn.conv(x, 6, name="conv1", dtype=jnp.float32, im2col=self.im2col)

  x = jax.random.normal(jax.random.PRNGKey(1), (3, 12, 12, 4))
  p_lax = One(False).init(jax.random.PRNGKey(0), x)
  p_col = One(True).init(jax.random.PRNGKey(0), x)
  chex.assert_trees_all_equal(p_lax, p_col)  # same names, shapes and initial values
  out = One(True).apply(p_lax, x)
  chex.assert_shape(out, (3, 8, 8, 6))
  np.testing.assert_allclose(out, One(False).apply(p_lax, x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("shape", [(2, 8, 6, 3), (1, 7, 9, 2)])
def test_reshape_max_pool_equals_nn_max_pool_with_its_gradient(shape):
  """Values and gradients equal ``nn.max_pool``'s, ties included (first maximum of a
  window in row-major order), odd sizes dropping the last row / column."""
  import flax.linen as nn

  from fedjax_het.models import cnn

  x = jax.random.normal(jax.random.PRNGKey(0), shape)
  x = jnp.where(x < 0, 0.0, jnp.round(x * 2) / 2)  # ReLU-like zeros and exact ties
  ref = lambda x: nn.max_pool(x, (2, 2), strides=(2, 2))
  ours = lambda x: cnn.max_pool(x, reshape=True)
  np.testing.assert_array_equal(ours(x), ref(x))
  # channels first ([C, B, H, W], pooled over axes 2, 3) is the same pool
  to_cf, from_cf = (lambda a: jnp.transpose(a, (3, 0, 1, 2))), (
      lambda a: jnp.transpose(a, (1, 2, 3, 0)))
  cf = lambda x: from_cf(cnn.pool_2x2(to_cf(x), 2))
  np.testing.assert_array_equal(cf(x), ref(x))
  g = jax.random.normal(jax.random.PRNGKey(1), ref(x).shape)
  grad = lambda f: jax.grad(lambda x: jnp.sum(f(x) * g))(x)
  np.testing.assert_array_equal(grad(ours), grad(ref))
  np.testing.assert_array_equal(grad(cf), grad(ref))
  # a window of four equal values sends its whole gradient to its top-left element
  one = jax.grad(lambda x: jnp.sum(cnn.max_pool(x, reshape=True)))(jnp.ones((1, 2, 2, 1)))
  np.testing.assert_array_equal(one[0, :, :, 0], [[1, 0], [0, 0]])


def test_channels_first_conv_and_its_gradient_equal_lax_conv():
  """``conv_cf`` (im2col loop, col2im loop) against ``lax.conv`` on odd sizes."""
  from fedjax_het.models import cnn

  x = jax.random.normal(jax.random.PRNGKey(0), (3, 11, 9, 4))  # NHWC
  k = jax.random.normal(jax.random.PRNGKey(1), (5, 5, 4, 6))
  b = jax.random.normal(jax.random.PRNGKey(2), (6,))
  ref = lambda x, k, b: jax.lax.conv_general_dilated(
      x, k, (1, 1), "VALID", dimension_numbers=("NHWC", "HWIO", "NHWC")) + b
  ours = lambda x, k, b: jnp.transpose(
      cnn.conv_cf(jnp.transpose(x, (3, 0, 1, 2)), k, b), (1, 2, 3, 0))
  np.testing.assert_allclose(ours(x, k, b), ref(x, k, b), rtol=1e-5, atol=1e-5)
  g = jax.random.normal(jax.random.PRNGKey(3), (3, 7, 5, 6))
  grads = lambda f: jax.grad(lambda *a: jnp.sum(f(*a) * g), argnums=(0, 1, 2))(x, k, b)
  for a, r in zip(grads(ours), grads(ref)):
    np.testing.assert_allclose(a, r, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("arch", ["cnn1", "cnn2"])
def test_channels_first_extractor_equals_nhwc_extractor(arch):
  """Same parameters, features and gradients (to float rounding) in both layouts."""
  from fedjax_het.models import cnn

  spec = models.arch_spec(arch)
  make = lambda cf: cnn.CNNExtractor(spec.conv_features, spec.fc_features, 500,
                                     channels_first=cf)
  x = jax.random.normal(jax.random.PRNGKey(0), (4, 32, 32, 3))
  # jitted: op by op, these took 11 s
  init = lambda cf: jax.jit(make(cf).init)(jax.random.PRNGKey(1), x)
  params = init(False)
  chex.assert_trees_all_equal(params, init(True))
  apply = lambda cf: jax.jit(make(cf).apply)(params, x)
  (rep_a, feats_a), (rep_b, feats_b) = apply(False), apply(True)
  chex.assert_trees_all_close((rep_a, feats_a), (rep_b, feats_b), rtol=1e-5, atol=1e-5)
  grad = lambda cf: jax.jit(jax.grad(lambda p: jnp.sum(make(cf).apply(p, x)[0] ** 2)))(
      params)
  chex.assert_trees_all_close(grad(True), grad(False), rtol=1e-4, atol=1e-5)
