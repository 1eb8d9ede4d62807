"""Client runtime: sampling, batching, masked local SGD, client mapping, aggregation."""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from fedjax_het import clients as cl


def test_weighted_mean_by_hand():
  stacked = {"w": jnp.array([[1.0, 2.0], [3.0, 0.0], [9.0, 9.0]])}
  out = cl.weighted_mean(stacked, jnp.array([1.0, 3.0, 0.0]))
  np.testing.assert_allclose(out["w"], [2.5, 0.5])  # (1*1+3*3)/4, (1*2+3*0)/4


def test_weighted_mean_on_sharded_client_axis():
  mesh = jax.make_mesh((4,), ("clients",), axis_types=(jax.sharding.AxisType.Auto,))
  x = jax.device_put(jnp.arange(8.0).reshape(4, 2),
                     jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("clients")))
  out = jax.jit(cl.weighted_mean)(x, jnp.array([1.0, 1.0, 0.0, 2.0]))
  np.testing.assert_allclose(out, [(0 + 2 + 2 * 6) / 4, (1 + 3 + 2 * 7) / 4])


def test_sample_clients_is_pure_and_padded():
  key = jax.random.PRNGKey(3)
  a = cl.sample_clients(key, 10, 3, 4)
  b = cl.sample_clients(key, 10, 3, 4)
  np.testing.assert_array_equal(a, b)
  assert len(set(np.asarray(a[:3]).tolist())) == 3 and np.all(np.asarray(a[:3]) < 10)
  assert a[3] >= 10  # padding slot is out of range
  c = cl.sample_clients(jax.random.PRNGKey(4), 10, 3, 4)
  assert not np.array_equal(a, c)


def test_num_sampled():
  assert cl.num_sampled(20, 0.1) == 2
  assert cl.num_sampled(2, 0.1) == 1
  assert cl.num_sampled(10, 1.0) == 10


def test_gather_fills_and_scatter_drops_out_of_range():
  tree = {"p": jnp.arange(6.0).reshape(3, 2)}
  idx = jnp.array([2, 0, 1000], jnp.int32)
  got = cl.gather_clients(tree, idx)
  np.testing.assert_allclose(got["p"], [[4, 5], [0, 1], [0, 0]])
  back = cl.scatter_clients(tree, idx, {"p": -got["p"] - 1})
  np.testing.assert_allclose(back["p"], [[-1, -2], [2, 3], [-5, -6]])


def test_epoch_batches_real_examples_first():
  idx = jnp.arange(8, dtype=jnp.int32)
  mask = jnp.array([1, 1, 1, 0, 1, 0, 0, 0], bool)
  bidx, bmask = cl.epoch_batches(jax.random.PRNGKey(0), idx, mask, 4)
  chex.assert_shape(bidx, (2, 4))
  np.testing.assert_array_equal(bmask, [[1, 1, 1, 1], [0, 0, 0, 0]])
  assert set(np.asarray(bidx[0]).tolist()) == {0, 1, 2, 4}


@pytest.mark.parametrize("mode", ["vmap", "sequential"])
def test_map_clients_modes_agree(mode):
  fn = lambda a, b: (a * 2 + b.sum(), {"s": a.sum()})
  a = jnp.arange(8.0).reshape(8, 1)
  b = jnp.ones((8, 3))
  out = cl.map_clients(fn, a, b, parallelism=mode, num_shards=4)
  np.testing.assert_allclose(out[0], a * 2 + 3)
  np.testing.assert_allclose(out[1]["s"], a[:, 0])


def test_map_clients_rejects_unknown_mode():
  with pytest.raises(ValueError, match="client_parallelism"):
    cl.map_clients(lambda a: a, jnp.ones(2), parallelism="pmap")


def _linear_loss(params, model_state, batch, rng):
  pred = batch.x.reshape(batch.x.shape[0], -1).mean(-1) * params["w"]
  return cl.masked_mean((pred - batch.y) ** 2, batch.mask), model_state


def _pool():
  x = (jnp.arange(6, dtype=jnp.uint8)[:, None, None, None] * 40
       * jnp.ones((1, 32, 32, 3), jnp.uint8))
  return x, jnp.arange(6, dtype=jnp.int32)


def test_local_train_all_padding_changes_nothing():
  x, y = _pool()
  params = {"w": jnp.array(0.5)}
  opt = optax.sgd(0.1)
  res = cl.local_train(_linear_loss, opt, params, None, opt.init(params), x, y,
                       jnp.zeros(4, jnp.int32), jnp.zeros(4, bool), jax.random.PRNGKey(0),
                       epochs=2, batch_size=2)
  np.testing.assert_allclose(res.params["w"], 0.5)
  assert int(res.steps) == 0


def test_local_train_counts_steps_and_moves_params():
  x, y = _pool()
  params = {"w": jnp.array(0.5)}
  opt = optax.sgd(0.1)
  res = cl.local_train(_linear_loss, opt, params, None, opt.init(params), x, y,
                       jnp.array([1, 2, 3, 0], jnp.int32), jnp.array([1, 1, 1, 0], bool),
                       jax.random.PRNGKey(0), epochs=3, batch_size=2)
  assert int(res.steps) == 6  # ceil(3 / 2) steps x 3 epochs
  assert float(res.params["w"]) != 0.5
  assert np.isfinite(float(res.loss))
