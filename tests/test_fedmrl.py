"""FedMRL mechanics on tiny inputs: Matryoshka widths, uplink, aggregation, a round."""
import by_hand
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_server_holds_no_client_leaf

from fedjax_het import config as config_lib
from fedjax_het import validation
from fedjax_het.algorithms import fedmrl
from fedjax_het.algorithms.shared import weighted_average
from fedjax_het.training import experiment
from fedjax_het.training import program

# programs that compile far longer than they run: level 0 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("compile_bound")


def _nets(use_mrl=True, d1=20, dtype=jnp.float32):
  return fedmrl.FedMRLNets("tiny", small_arch="tiny", d1=d1, num_classes=10,
                           use_mrl=use_mrl, dtype=dtype)


def test_matryoshka_slices_have_config_widths():
  net = _nets(d1=20)
  params = net.init(jax.random.PRNGKey(0))
  x = jnp.ones((3, 32, 32, 3))
  rep = net.fused(params, x)
  chex.assert_shape(rep, (3, fedmrl.LOCAL_REP_DIM))
  chex.assert_shape(params["proj"]["kernel"], (20 + 500, 500))
  chex.assert_shape(params["global"]["header"]["fc"]["kernel"], (20, 10))
  small, large = net.heads(params, rep)
  chex.assert_shape([small, large], [(3, 10), (3, 10)])
  # the small header only reads the first d1 dims: changing the rest does not move it
  rep2 = rep.at[:, 20:].add(5.0)
  np.testing.assert_allclose(net.heads(params, rep2)[0], small, rtol=1e-6)
  assert not np.allclose(net.heads(params, rep2)[1], large)


def test_bf16_compute_keeps_projector_and_heads_in_float32():
  net, ref = _nets(d1=20, dtype=jnp.bfloat16), _nets(d1=20)
  params = net.init(jax.random.PRNGKey(0))
  chex.assert_trees_all_equal_structs(params, ref.init(jax.random.PRNGKey(0)))
  x = jnp.ones((3, 32, 32, 3))
  assert fedmrl.models.extract(net.small, params["global"], x).dtype == jnp.bfloat16
  rep = net.fused(params, x)
  assert rep.dtype == jnp.float32
  assert [h.dtype for h in net.heads(params, rep)] == [jnp.float32, jnp.float32]
  # the extractors' bf16 is the only difference from float32 compute
  np.testing.assert_allclose(rep, ref.fused(params, x), atol=0.05, rtol=0.05)


def test_without_mrl_heads_read_disjoint_slices():
  net = _nets(use_mrl=False, d1=20)
  params = net.init(jax.random.PRNGKey(0))
  rep = net.fused(params, jnp.ones((2, 32, 32, 3)))
  chex.assert_shape(rep, (2, 520))
  small, large = net.heads(params, rep)
  np.testing.assert_allclose(net.heads(params, rep.at[:, :20].add(3.0))[1], large, rtol=1e-6)
  np.testing.assert_allclose(net.heads(params, rep.at[:, 20:].add(3.0))[0], small, rtol=1e-6)


def test_uplink_holds_only_the_shared_model():
  net = _nets()
  params = net.init(jax.random.PRNGKey(1))
  up = fedmrl.uplink(params)
  assert jax.tree.structure(up) == jax.tree.structure(params["global"])
  private = jax.tree.leaves((params["local"], params["proj"]))
  for leaf in jax.tree.leaves(up):
    assert not any(leaf.shape == p.shape and np.array_equal(leaf, p) for p in private)


def test_aggregate_by_hand():
  ups = [{"w": jnp.array([[1.0], [3.0]])}, {"w": jnp.array([[5.0]])}]
  out = weighted_average(ups, [jnp.array([1.0, 1.0]), jnp.array([2.0])])
  np.testing.assert_allclose(out["w"], [(1 + 3 + 2 * 5) / 4])


@pytest.mark.parametrize("inference", fedmrl.INFERENCE)
def test_inference_modes_predict(inference):
  net = _nets()
  params = net.init(jax.random.PRNGKey(2))
  chex.assert_shape(net.predict(params, jnp.ones((2, 32, 32, 3)), inference), (2, 10))


def test_round_compiles_once_sends_theta_averages_by_counts_and_learns(tiny_config):
  """Eq. 4 with the partition's unequal counts after round 1; after 5 rounds the clients
  beat twice the accuracy of their label prior (synthetic data whose classes are
  learnable); one compiled round throughout."""
  exp = experiment.prepare(tiny_config("fedmrl", overrides={
      "algo.d1": 20, "algo.small_arch": "tiny", **by_hand.LEARNS}))
  init = program.compile_fns(exp).init
  state = init(jax.random.PRNGKey(0))
  round_fn = jax.jit(chex.assert_max_traces(exp.algorithm.round, n=1))
  theta0 = state.server
  state, metrics = round_fn(state, exp.data)
  # Eq. 4: theta = sum_k n_k theta_k / sum_k n_k, n_k counted from the tables' masks
  by_hand.assert_weighted_by_counts(exp, state, lambda c: c.params["global"])
  for _ in range(4):
    state, metrics = round_fn(state, exp.data)
  assert np.isfinite(float(metrics["train_loss"]))
  assert_server_holds_no_client_leaf(state)
  # the tiny small model on 16x16 images, d1 = 20: conv 5x5 3->4, conv 5x5 4->8 (a 1x1
  # map after two valid convs and pools), fc 8->32, rep 32->20, header 20->10
  theta_size = (75 * 4 + 4) + (100 * 8 + 8) + (8 * 32 + 32) + (32 * 20 + 20) + (20 * 10 + 10)
  assert sum(x.size for x in jax.tree.leaves(theta0)) == theta_size
  assert float(metrics["uplink_params"]) == theta_size
  assert not np.allclose(jax.tree.leaves(state.server)[0], jax.tree.leaves(theta0)[0])
  counts = exp.algorithm.evaluate(state, exp.data)
  assert len(counts) == 2  # two architecture groups
  by_hand.assert_learned(exp, counts)


def test_projector_is_initialised_as_torch_linear():
  nets = fedmrl.FedMRLNets("cnn1", small_arch="tiny", d1=100, num_classes=10, use_mrl=True,
                           dtype=jnp.float32)
  proj = nets.init(jax.random.PRNGKey(0))["proj"]
  bound = 1.0 / np.sqrt(100 + fedmrl.LOCAL_REP_DIM)
  for leaf in (proj["kernel"], proj["bias"]):
    leaf = np.asarray(leaf)
    assert np.abs(leaf).max() <= bound * (1 + 1e-6)
    np.testing.assert_allclose(leaf.std(), bound / np.sqrt(3), rtol=0.05)  # U(-b, b)
  assert np.abs(np.asarray(proj["bias"])).min() > 0


def test_last_client_aggregation_returns_one_sampled_clients_theta():
  uploads = ({"w": jnp.array([[1.0], [2.0], [0.0]])}, {"w": jnp.array([[3.0], [0.0]])})
  weights = (jnp.array([5.0, 1.0, 0.0]), jnp.array([2.0, 0.0]))
  picked = {float(fedmrl.last_client(uploads, weights, jax.random.PRNGKey(s))["w"][0])
            for s in range(40)}
  assert picked == {1.0, 2.0, 3.0}  # any real slot, never padding, whatever its weight
  np.testing.assert_allclose(weighted_average(uploads, weights)["w"], [(5 + 2 + 6) / 8])


@pytest.mark.parametrize("key,value,match", [
    ("d1", 0, r"algo.d1=0 must be in \[1, 500\]"),
    ("d1", 501, r"algo.d1=501 must be in \[1, 500\]"),
    ("inference", "mix", r"algo.inference"),
    ("aggregation", "median", r"algo.aggregation"),
])
def test_bad_algo_values_fail_at_validation(key, value, match):
  """FedMRL's values are checked with the config (``Spec.check``), before any compute."""
  c = config_lib.base_config()
  c.algorithm = "fedmrl"
  c.algo[key] = value
  with pytest.raises(ValueError, match=match):
    validation.validate(c)
  with pytest.raises(ValueError, match=match):  # the hook alone, choices not consulted
    fedmrl.check(c)
