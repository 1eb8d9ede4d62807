"""Deployment pieces in one process: wire format, client rollback, the Flower strategy.

The multi-process runs over Flower are in test_deploy_flower.py.
"""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

from fedjax_het.deploy import federation as fed_lib

flower = pytest.importorskip("fedjax_het.deploy.flower")
from flwr.common import (Code, FitRes, GetPropertiesRes, Status,  # noqa: E402
                         EvaluateRes, ndarrays_to_parameters, parameters_to_ndarrays)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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
    ("fedmrl", "tiny,cnn5", lambda c: c.params["global"]),  # the small model theta
    ("fedmoe", "tiny,cnn5", lambda c: c.params["global_ex"]),  # the global expert
    ("lg_fedavg", "tiny,cnn5", lambda c: c.params["header"]),
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
  fed = small_fed(algorithm, "tiny,cnn5")
  for g in range(fed.runtime.layout.num_groups):
    upload = fed_lib.abstract_upload(fed, g)
    assert {k: v.shape for k, v in upload.items()} == {"means": (10, width), "counts": (10,)}


def test_standalone_sends_nothing(small_fed):
  fed = small_fed("standalone", "tiny,cnn5")
  for g in range(2):
    assert not jax.tree.leaves(fed_lib.abstract_upload(fed, g))
    assert not jax.tree.leaves(fed_lib.abstract_payload(fed, g))


def test_silo_with_its_own_arrays_needs_no_shared_data(small_fed, tiny_config):
  with_data = small_fed(models="tiny,cnn5")
  fed = fed_lib.prepare_federation(
      tiny_config("fedmrl", "tiny,cnn5", {"num_clients": 4, "data.path": "/nonexistent.npz"}),
      with_data=False)
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


class FakeProxy:
  """A connection to an in-process ClientNode, as Flower's ClientProxy is used."""

  def __init__(self, cid, node):
    self.cid, self.node = cid, node

  def get_properties(self, ins, timeout, group_id):
    return GetPropertiesRes(Status(Code.OK, ""), {"client_id": self.node.client_id})


class FakeManager:
  def __init__(self, proxies):
    self.proxies = {p.cid: p for p in proxies}

  def wait_for(self, num_clients, timeout):
    return len(self.proxies) >= num_clients

  def all(self):
    return dict(self.proxies)


def fit_all(strategy, instructions):
  out = []
  for proxy, ins in instructions:
    client = flower.FlowerClient(proxy.node, log=lambda s: None)
    arrays, n, metrics = client.fit(parameters_to_ndarrays(ins.parameters), ins.config)
    out.append((proxy, FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays), n,
                              metrics)))
  return out


def test_strategy_aggregates_with_min_fit_clients_and_checkpoints(small_fed, tmp_path):
  fed = small_fed()
  nodes = [fed_lib.ClientNode(fed, k, fed.client_data(k)) for k in range(4)]
  proxies = [FakeProxy(f"conn{k}", n) for k, n in enumerate(nodes)]
  manager = FakeManager(proxies)
  logs = []
  server = fed_lib.ServerNode(fed, str(tmp_path / "server"))
  strategy = flower.HetStrategy(server, min_fit_clients=4, log=logs.append)
  instructions = strategy.configure_fit(1, None, manager)
  assert sorted(p.node.client_id for p, _ in instructions) == [0, 1, 2, 3]
  results = fit_all(strategy, instructions)
  # one client lost: 3 < min_fit_clients=4, the round is not aggregated
  strategy.aggregate_fit(1, results[:3], [RuntimeError("client gone")])
  assert server.round == 0 and "fewer than min_fit_clients=4" in logs[-1]
  strategy.min_fit = 3
  strategy.aggregate_fit(1, results[:3], [RuntimeError("client gone")])
  assert server.round == 1
  # theta is the example-weighted mean of the 3 uploads (Eq. 4)
  ups = [parameters_to_ndarrays(r.parameters) for _, r in results[:3]]
  w = np.array([r.num_examples for _, r in results[:3]], np.float64)
  got = fed_lib.encode(server.state.server)
  for leaf, rows in zip(got, zip(*ups)):
    want = np.tensordot(w / w.sum(), np.stack(rows).astype(np.float64), axes=1)
    np.testing.assert_allclose(leaf, want, rtol=1e-5, atol=1e-6)
  evals = strategy.configure_evaluate(1, None, manager)
  assert len(evals) == 4
  replies = []
  for proxy, ins in evals:
    loss, n, m = flower.FlowerClient(proxy.node).evaluate(
        parameters_to_ndarrays(ins.parameters), ins.config)
    replies.append((proxy, EvaluateRes(Status(Code.OK, ""), loss, n, m)))
  strategy.aggregate_evaluate(1, replies, [])
  row = strategy.rows.rows[-1]
  assert (row["round"], row["clients_trained"], row["clients_failed"],
          row["clients_evaluated"]) == (1, 3, 1, 4)
  assert row["uplink_params"] == fed_lib.num_scalars(ups[0])
  np.testing.assert_allclose(row["mean_test_acc"],
                             np.mean(list(strategy.last_accuracy.values())))
  assert server.ckpt.steps() == [1]  # checkpointed after the evaluation row
  server.close()
  resumed = fed_lib.ServerNode(fed, str(tmp_path / "server"))
  assert resumed.round == 1
  for a, b in zip(fed_lib.encode(resumed.state.server), got):
    np.testing.assert_array_equal(a, b)
  resumed.close()


@pytest.mark.parametrize("flags,message", [
    (["--client_id=7"], "client_id=7 must be in [0, config.num_clients=3)"),
    (["--client_id=0", "--config.data.path={tmp}/missing.npz"], "missing.npz"),
])
def test_client_cli_rejects_bad_input_before_compute(tmp_path, flags, message):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run(
      [sys.executable, f"{ROOT}/experiments/flower_client.py",
       f"--config={ROOT}/experiments/fedmrl.py:smoke", "--config.num_clients=3",
       f"--config.data.path={tmp_path}/missing.npz",
       *[f.format(tmp=tmp_path) for f in flags]],
      capture_output=True, text=True, env=env, timeout=120)
  assert out.returncode == 2
  assert message in out.stderr


def test_server_cli_rejects_negative_minimum(tmp_path):
  out = subprocess.run(
      [sys.executable, f"{ROOT}/experiments/flower_server.py",
       f"--config={ROOT}/experiments/fedmrl.py:smoke", f"--workdir={tmp_path}",
       "--min_fit_clients=-1"], capture_output=True, text=True, timeout=120,
      env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode != 0 and "--min_fit_clients=-1 must be >= 0" in out.stderr


def test_an_upload_that_does_not_decode_is_that_clients_failure(small_fed, tmp_path):
  fed = small_fed()
  nodes = [fed_lib.ClientNode(fed, k, fed.client_data(k)) for k in range(4)]
  proxies = [FakeProxy(f"conn{k}", n) for k, n in enumerate(nodes)]
  logs = []
  server = fed_lib.ServerNode(fed, str(tmp_path / "server"))
  strategy = flower.HetStrategy(server, min_fit_clients=3, log=logs.append)
  results = fit_all(strategy, strategy.configure_fit(1, None, FakeManager(proxies)))
  proxy, res = results[0]
  arrays = parameters_to_ndarrays(res.parameters)
  bad = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(arrays[:-1]), res.num_examples,
               res.metrics)  # one array missing
  strategy.aggregate_fit(1, [(proxy, bad)] + results[1:], [])
  assert server.round == 1  # the other three were aggregated; the server goes on
  assert any("upload does not decode" in line and "counted as its failure" in line
             for line in logs)
  assert strategy.pending_row["clients_trained"] == 3
  assert strategy.pending_row["clients_failed"] == 1
  server.close()
