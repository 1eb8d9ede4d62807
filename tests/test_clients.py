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


def heterogeneous_groups(n):
  """Group sizes of ``models='heterogeneous'``: client k runs CNN-((k mod 5)+1)."""
  return tuple(len(range(g, n, 5)) for g in range(min(n, 5)))


@pytest.mark.parametrize("n,c,k", [(10, 1.0, 10), (50, 0.2, 10), (100, 0.1, 10),
                                   (10, 0.1, 1), (7, 0.5, 4), (3, 0.5, 2), (13, 0.3, 4)])
def test_exactly_k_clients_per_round_with_inclusion_probability_c(n, c, k):
  sizes = heterogeneous_groups(n)
  slots = cl.group_slots(sizes, c)
  counts = np.stack([np.asarray(cl.group_counts(jax.random.PRNGKey(r), sizes, c))
                     for r in range(400)])
  assert np.all(counts.sum(1) == k)
  assert np.all(counts <= np.asarray(slots)) and np.all(counts >= 0)
  # each client of group g is sampled with probability E[count_g] / n_g = k / n
  np.testing.assert_allclose(counts.mean(0) / np.asarray(sizes), k / n, atol=0.06)
  if k * 5 % n == 0:  # the papers' settings: every group sends exactly its share
    assert np.all(counts == counts[0]) and slots == tuple(counts[0])


def test_sample_clients_fills_the_first_num_slots():
  idx = np.asarray(cl.sample_clients(jax.random.PRNGKey(0), 4, jnp.int32(1), 2))
  assert idx[0] < 4 and idx[1] >= 4


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
  assert np.isfinite(float(res.loss))
  # one batch of all 3 examples per epoch: 3 steps of full-batch gradient descent on
  # mean_i (c_i w - y_i)^2, c_i the mean of example i's normalized pixels, by hand
  full = cl.local_train(_linear_loss, opt, params, None, opt.init(params), x, y,
                        jnp.array([1, 2, 3, 0], jnp.int32), jnp.array([1, 1, 1, 0], bool),
                        jax.random.PRNGKey(0), epochs=3, batch_size=4)
  mean, std = np.array([0.4914, 0.4822, 0.4465]), np.array([0.2470, 0.2435, 0.2616])
  c = np.array([np.mean((40 * i / 255 - mean) / std) for i in (1, 2, 3)])
  w = 0.5
  for _ in range(3):
    w -= 0.1 * np.mean(2 * c * (c * w - np.array([1, 2, 3])))
  assert int(full.steps) == 3
  np.testing.assert_allclose(float(full.params["w"]), w, rtol=1e-4)


def test_drop_last_masks_the_partial_batch():
  idx = jnp.arange(12, dtype=jnp.int32)
  mask = jnp.array([1] * 10 + [0] * 2, bool)
  _, keep = cl.epoch_batches(jax.random.PRNGKey(0), idx, mask, 4)
  np.testing.assert_array_equal(keep.sum(1), [4, 4, 2])
  bidx, drop = cl.epoch_batches(jax.random.PRNGKey(0), idx, mask, 4, drop_last=True)
  np.testing.assert_array_equal(drop.sum(1), [4, 4, 0])
  assert set(np.asarray(bidx[:2]).ravel().tolist()) < set(range(10))


def test_local_train_drop_last_steps_and_augmentation_keys():
  x, y = _pool()
  params = {"w": jnp.array(0.5)}
  opt = optax.sgd(0.1)
  args = (_linear_loss, opt, params, None, opt.init(params), x, y,
          jnp.array([1, 2, 3, 0], jnp.int32), jnp.array([1, 1, 1, 0], bool),
          jax.random.PRNGKey(0))
  res = cl.local_train(*args, epochs=3, batch_size=2, drop_last=True)
  assert int(res.steps) == 3  # one full batch of 2 per epoch, the single example dropped
  plain = cl.local_train(*args, epochs=3, batch_size=2)
  flipped = cl.local_train(*args, epochs=3, batch_size=2, augment="flip_crop")
  again = cl.local_train(*args, epochs=3, batch_size=2, augment="flip_crop")
  np.testing.assert_array_equal(flipped.params["w"], again.params["w"])  # same keys
  assert float(flipped.params["w"]) != float(plain.params["w"])  # crops see zero borders
