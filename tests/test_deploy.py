"""Deployment pieces in one process: wire format, client data, client rollback.

The Flower App is tested in test_flower_app.py (one process) and test_deploy_flower.py
(real Flower processes).
"""
import jax
import numpy as np
import pytest
from conftest import make_tiny_config

from fedjax_het.deploy import federation as fed_lib

# programs that compile far longer than they run: level 0 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("compile_bound")


@pytest.fixture
def small_fed(tiny_config):
  """FedMRL, 4 clients of one tiny architecture, synthetic data."""
  def make(algorithm="fedmrl", models="tiny", **overrides):
    c = tiny_config(algorithm, models, dict({"num_clients": 4, "num_rounds": 2}, **overrides))
    return fed_lib.prepare_federation(c)
  return make


def test_encode_decode_round_trip_and_errors():
  like = {"a": np.zeros((2, 3), np.float32), "b": (np.zeros((), np.int32),)}
  tree = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": (np.int32(7),)}
  arrays = fed_lib.encode(tree)
  assert fed_lib.num_scalars(arrays) == 7
  back = fed_lib.decode(arrays, like)
  np.testing.assert_array_equal(back["a"], tree["a"])
  assert int(back["b"][0]) == 7
  with pytest.raises(ValueError, match="received 1 arrays; expected 2"):
    fed_lib.decode(arrays[:1], like)
  with pytest.raises(ValueError, match=r"array 0: got float32\[3, 2\], expected float32\[2, 3\]"):
    fed_lib.decode([arrays[0].reshape(3, 2), arrays[1]], like)


def test_key_bytes_round_trip():
  key = jax.random.PRNGKey(3)
  np.testing.assert_array_equal(fed_lib.key_from_bytes(fed_lib.key_to_bytes(key)), key)


def test_client_data_from_arrays_pads_to_batches():
  x = np.zeros((5, 32, 32, 3), np.uint8)
  d = fed_lib.ClientData.from_arrays(x, np.arange(5), x[:2], np.arange(2), batch_size=4)
  assert d.train_idx.shape == (8,) and d.test_idx.shape == (4,)
  assert d.num_train == 5
  np.testing.assert_array_equal(d.test_idx[:2], [5, 6])
  np.testing.assert_array_equal(d.test_mask, [True, True, False, False])
  with pytest.raises(ValueError, match="6 examples do not fit a table of length 4"):
    fed_lib.ClientData.from_arrays(np.zeros((6, 32, 32, 3), np.uint8), np.arange(6), x[:1],
                                   np.arange(1), batch_size=4, train_len=4)


def test_client_data_holds_only_the_clients_examples(small_fed):
  fed = small_fed()
  for k in range(4):
    d = fed.client_data(k)
    g, j = fed.runtime.layout.group_of(k)
    index = fed.data.groups[g]
    own = np.asarray(index.train_idx[j])[np.asarray(index.train_mask[j])]
    np.testing.assert_array_equal(d.x[d.train_idx[d.train_mask]], fed.data.x[own])
    np.testing.assert_array_equal(d.y[d.train_idx[d.train_mask]], fed.data.y[own])
    assert len(d.y) == int(index.num_train[j]) + int(index.num_test[j])
    assert d.train_idx.shape == index.train_idx.shape[1:]  # the simulator's table length


@pytest.mark.parametrize("algorithm,models,sent", [
    ("fedmrl", "tiny,tiny2", lambda c: c.params["global"]),  # the small model theta
    ("fedmoe", "tiny,tiny2", lambda c: c.params["global_ex"]),  # the global expert
    ("lg_fedavg", "tiny,tiny2", lambda c: c.params["header"]),
])
def test_only_the_shared_part_crosses_the_wire(small_fed, algorithm, models, sent):
  fed = small_fed(algorithm, models)
  for g in range(fed.runtime.layout.num_groups):
    client = fed_lib.abstract_client(fed, g)
    upload = fed_lib.abstract_upload(fed, g)
    shapes = lambda t: jax.tree.map(lambda a: (a.shape, a.dtype), t)
    assert shapes(upload) == shapes(sent(client))
    assert shapes(fed_lib.abstract_payload(fed, g)) == shapes(sent(client))


@pytest.mark.parametrize("algorithm,width", [("fd", 10), ("fedproto", 500)])
def test_class_statistics_cross_the_wire(small_fed, algorithm, width):
  fed = small_fed(algorithm, "tiny,tiny2")
  for g in range(fed.runtime.layout.num_groups):
    upload = fed_lib.abstract_upload(fed, g)
    assert {k: v.shape for k, v in upload.items()} == {"means": (10, width), "counts": (10,)}


def test_standalone_sends_nothing(small_fed):
  fed = small_fed("standalone", "tiny,tiny2")
  for g in range(2):
    assert not jax.tree.leaves(fed_lib.abstract_upload(fed, g))
    assert not jax.tree.leaves(fed_lib.abstract_payload(fed, g))


def test_silo_with_its_own_arrays_needs_no_shared_data(synthetic_npz):
  # CIFAR-10's name: a federation without data is laid out from a built-in dataset's
  # shape and classes
  config = lambda path: make_tiny_config(path, "fedmrl", "tiny,tiny2", {"num_clients": 4})
  with_data = fed_lib.prepare_federation(config(synthetic_npz))
  fed = fed_lib.prepare_federation(config("/nonexistent.npz"), with_data=False)
  assert fed.data is None and fed.runtime.layout == with_data.runtime.layout
  rng = np.random.default_rng(0)
  x = rng.integers(0, 255, (20, 32, 32, 3), dtype=np.uint8)
  data = fed_lib.ClientData.from_arrays(x[:15], rng.integers(0, 10, 15), x[15:],
                                        rng.integers(0, 10, 5), batch_size=16)
  node = fed_lib.ClientNode(fed, 1, data)
  theta = jax.jit(fed.protocol.init_server)(jax.random.PRNGKey(0))
  upload, weight, aux = node.fit(1, fed_lib.encode(theta), jax.random.PRNGKey(1))
  assert weight == 15 and np.isfinite(aux["loss"])
  assert fed_lib.num_scalars(upload) == fed_lib.num_scalars(fed_lib.encode(theta))
  correct, total = node.evaluate(fed_lib.encode(theta))
  assert total == 5 and 0 <= correct <= 5


def test_client_rolls_back_state_ahead_of_the_server(small_fed, tmp_path):
  fed = small_fed()
  node = fed_lib.ClientNode(fed, 1, fed.client_data(1), str(tmp_path))
  payload = fed_lib.encode(jax.jit(fed.protocol.init_server)(jax.random.PRNGKey(0)))
  key = jax.random.PRNGKey(5)
  node.fit(1, payload, key)
  first, _, _ = node.fit(2, payload, key)
  assert node._ckpt.steps() == [1, 2]
  again, _, _ = node.fit(2, payload, key)  # the server resumed from round 1
  for a, b in zip(first, again):
    np.testing.assert_array_equal(a, b)
  node.close()
  restarted = fed_lib.ClientNode(fed, 1, fed.client_data(1), str(tmp_path))
  assert restarted.state_round == 2
  restarted.close()


def test_a_client_state_of_one_array_checkpoints(small_fed, tmp_path):
  fed = small_fed("fedavg")  # a FedAvg client keeps only its round counter (a scalar)
  node = fed_lib.ClientNode(fed, 1, fed.client_data(1), str(tmp_path))
  node.fit(1, fed_lib.encode(jax.jit(fed.protocol.init_server)(jax.random.PRNGKey(0))),
           jax.random.PRNGKey(5))
  node.close()
  restarted = fed_lib.ClientNode(fed, 1, fed.client_data(1), str(tmp_path))
  assert restarted.state_round == 1 and int(restarted.state) == 1
  restarted.close()


def test_prepare_client_reads_the_pool_once(tiny_config, tmp_path, monkeypatch):
  c = tiny_config("fedmrl", "tiny,tiny2", {"num_clients": 4, "num_rounds": 2})
  fed, data = fed_lib.prepare_client(c, 1, str(tmp_path))
  assert fed.data is not None
  calls = []
  monkeypatch.setattr(fed_lib, "prepare_federation", lambda *a, **k: calls.append(1))
  cached, again = fed_lib.prepare_client(c, 1, str(tmp_path))
  assert not calls and cached.data is None
  assert cached.runtime == fed.runtime and cached.client_archs == fed.client_archs
  for a, b in zip(fed_lib.encode(data), fed_lib.encode(again)):
    np.testing.assert_array_equal(a, b)
  monkeypatch.undo()
  c.learning_rate = 0.5  # another config: read again
  other, _ = fed_lib.prepare_client(c, 1, str(tmp_path))
  assert other.data is not None


def test_initial_and_restored_client_states_are_placed_alike(small_fed, tmp_path):
  """So a client's round compiles to one program whether its state is fresh or restored
  (one entry in the persistent compilation cache of a process per message)."""
  fed = small_fed()
  node = fed_lib.ClientNode(fed, 1, fed.client_data(1), str(tmp_path))
  fresh = [(a.sharding, a.committed) for a in jax.tree.leaves(node.state)]
  node.fit(1, fed_lib.encode(jax.jit(fed.protocol.init_server)(jax.random.PRNGKey(0))),
           jax.random.PRNGKey(5))
  node.close()
  restored = fed_lib.ClientNode(fed, 1, fed.client_data(1), str(tmp_path))
  assert [(a.sharding, a.committed) for a in jax.tree.leaves(restored.state)] == fresh
  restored.close()
