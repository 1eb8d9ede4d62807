"""LG-FedAvg, FD and FedProto: what clients send, per-class aggregation, rounds, runs."""
import json

import by_hand
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import assert_server_holds_no_client_leaf

from fedjax_het import models
from fedjax_het.algorithms import class_tables
from fedjax_het.algorithms import fd
from fedjax_het.algorithms import fedproto
from fedjax_het.algorithms import lg_fedavg
from fedjax_het.algorithms.api import dummy_input
from fedjax_het.algorithms.shared import weighted_average
from fedjax_het.data.sources import IMAGE_SHAPE
from fedjax_het.training import experiment
from fedjax_het.training import loop
from fedjax_het.training import program

# programs that compile far longer than they run: level 0 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("compile_bound")


def test_lg_uplink_is_exactly_the_header():
  net = models.get_model("tiny", num_classes=10)
  params = net.init(jax.random.PRNGKey(0), dummy_input(IMAGE_SHAPE))["params"]
  up = lg_fedavg.uplink(params)
  assert jax.tree.structure(up) == jax.tree.structure(params["header"])
  assert set(up) == {"fc"} and set(up["fc"]) == {"kernel", "bias"}
  chex.assert_shape(up["fc"]["kernel"], (500, 10))


def test_lg_headers_of_cnn1_and_cnn5_average_by_examples():
  h = lambda v: {"fc": {"kernel": jnp.full((500, 10), v), "bias": jnp.full((10,), v)}}
  stack = lambda *hs: jax.tree.map(lambda *a: jnp.stack(a), *hs)
  out = weighted_average([stack(h(1.0), h(9.0)), stack(h(4.0))],
                         [jnp.array([1.0, 0.0]), jnp.array([3.0])])  # slot 2: padding
  np.testing.assert_allclose(out["fc"]["bias"], np.full(10, (1 + 3 * 4) / 4))


@pytest.mark.parametrize("name", ["fd", "fedproto"])
def test_class_table_uplink_holds_no_parameters(tiny_config, name):
  exp = experiment.prepare(tiny_config(name, "tiny"))
  rt, data = exp.runtime, exp.data
  net = models.get_model("tiny", num_classes=10)
  params = net.init(jax.random.PRNGKey(0), rt.dummy_input())["params"]
  idx, mask = data.groups[0].train_idx[0], data.groups[0].train_mask[0]
  up = jax.jit(lambda p: (fd if name == "fd" else fedproto).uplink(
      net, p, data, idx, mask, rt))(params)
  width = 10 if name == "fd" else 500
  assert set(up) == {"means", "counts"}
  chex.assert_shape([up["means"], up["counts"]], [(10, width), (10,)])
  labels = np.asarray(data.y)[np.asarray(idx)[np.asarray(mask)]]
  np.testing.assert_allclose(up["counts"], np.bincount(labels, minlength=10))
  unseen = np.asarray(up["counts"]) == 0
  assert np.all(np.asarray(up["means"])[unseen] == 0)


def test_class_stats_by_hand():
  x = jnp.zeros((6, 32, 32, 3), jnp.uint8)
  y = jnp.array([0, 0, 2, 2, 2, 1])
  feats = jnp.array([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0], [7.0, 5.0], [9.0, 5.0], [0.0, 0.0]])
  # one batch of the 6 pool examples in order; the last two are padding
  out = class_tables.class_stats(lambda xb: feats, x, y, jnp.arange(6),
                                 jnp.array([1, 1, 1, 1, 0, 0], bool), num_classes=3,
                                 batch_size=6)
  np.testing.assert_allclose(out["counts"], [2, 0, 2])
  np.testing.assert_allclose(out["means"], [[2, 1], [0, 0], [6, 5]])


def test_per_class_aggregation_by_hand():
  # two groups; class 1 held by nobody, class 2 by one client only; a padding slot
  up_a = {"means": jnp.array([[[1.0], [0.0], [0.0]], [[9.0], [9.0], [9.0]]]),
          "counts": jnp.array([[1.0, 0.0, 0.0], [0.0, 0.0, 0.0]])}
  up_b = {"means": jnp.array([[[4.0], [0.0], [6.0]]]), "counts": jnp.array([[3.0, 0.0, 2.0]])}
  out = class_tables.aggregate_classes([up_a, up_b])
  np.testing.assert_allclose(out["table"], [[(1 + 3 * 4) / 4], [0.0], [6.0]])
  np.testing.assert_array_equal(out["valid"], [True, False, True])
  sent = class_tables.mean_entries_sent([up_a, up_b],
                                        [jnp.array([5.0, 0.0]), jnp.array([2.0])], width=10)
  np.testing.assert_allclose(sent, (1 + 2) * 10 / 2)


def test_losses_skip_classes_without_a_global_entry():
  table = {"table": jnp.array([[1.0, 2.0], [0.0, 0.0]]), "valid": jnp.array([True, False])}
  rep = jnp.array([[0.0, 0.0], [5.0, 5.0], [3.0, 3.0]])
  y, mask = jnp.array([0, 1, 0]), jnp.array([True, True, False])
  # only sample 0 counts: mean((0-1)^2, (0-2)^2) = 2.5, over a batch of 2 real samples
  np.testing.assert_allclose(fedproto.proto_mse(rep, y, mask, table), 2.5 / 2)
  np.testing.assert_allclose(fd.distill_loss(rep, y, mask, table, "mse"), 2.5 / 2)
  ce = -np.sum(jax.nn.softmax(jnp.array([1.0, 2.0])) * jax.nn.log_softmax(rep[0]))
  np.testing.assert_allclose(fd.distill_loss(rep, y, mask, table, "ce"), ce / 2, rtol=1e-6)
  off = dict(table, valid=jnp.array([False, False]))
  assert float(fd.distill_loss(rep, y, mask, off)) == 0.0


def test_nearest_prototype_ignores_invalid_classes():
  protos = {"table": jnp.array([[0.0, 0.0], [1.0, 1.0], [0.1, 0.1]]),
            "valid": jnp.array([False, True, True])}
  scores = fedproto.nearest_prototype_scores(jnp.array([[0.0, 0.0], [2.0, 2.0]]), protos)
  np.testing.assert_array_equal(jnp.argmax(scores, -1), [2, 1])


# LG-FedAvg with every client, so that after round 1 the global header is the mean of
# every client's trained header weighted by its train examples, counted from the
# partition's tables (not handed in)
@pytest.mark.parametrize("name,algo", [("lg_fedavg", {"participation": 1.0}),
                                       ("fd", {"algo.distill": "mse"}), ("fedproto", {})])
def test_round_compiles_once_and_is_finite(tiny_config, name, algo):
  exp = experiment.prepare(tiny_config(name, "tiny", dict({"participation": 0.5}, **algo)))
  round_fn = jax.jit(chex.assert_max_traces(exp.algorithm.round, n=1))
  init = program.compile_fns(exp).init
  state = init(jax.random.PRNGKey(0))
  for r in range(2):
    state, metrics = round_fn(state, exp.data)
    if name == "lg_fedavg" and r == 0:
      by_hand.assert_weighted_by_counts(exp, state, lambda c: c.params["header"])
  assert int(state.round) == 2
  assert_server_holds_no_client_leaf(state)
  for v in jax.tree.leaves(metrics):
    assert np.all(np.isfinite(np.asarray(v)))
  if name != "lg_fedavg":
    assert bool(np.any(state.server["valid"]))
    assert 0 < float(metrics["uplink_params"]) <= float(metrics["downlink_params"])


# One architecture group keeps the file fast on CPU; cross-group header averaging is
# checked by hand above and by the :smoke configs (CNN-1..5).
@pytest.mark.parametrize("name,models,algo", [("lg_fedavg", "tiny", {}),
                                              ("fd", "tiny", {}),
                                              ("fedproto", "tiny", {"algo.inference": "header"})])
def test_run_end_to_end(tiny_config, tmp_path, name, models, algo):
  summary = loop.run(tiny_config(name, models, algo), str(tmp_path), log=lambda s: None)
  rows = [json.loads(line) for line in open(tmp_path / "metrics.jsonl")]
  assert [r["round"] for r in rows] == [1, 2]
  assert all(0.0 <= r["mean_test_acc"] <= 1.0 for r in rows)
  assert rows[1]["uplink_params"] > rows[0]["uplink_params"] > 0
  if name == "lg_fedavg":
    assert rows[0]["uplink_params"] == rows[0]["downlink_params"] == 500 * 10 + 10
  assert summary["rounds_completed"] == 2


def test_fedproto_keeps_the_last_known_prototype_of_a_class_nobody_sent():
  old = {"table": jnp.array([[1.0, 1.0], [2.0, 2.0], [0.0, 0.0]]),
         "valid": jnp.array([True, True, False])}
  # this round's clients hold class 0 and 2 only
  uploads = [{"means": jnp.array([[[5.0, 5.0], [0.0, 0.0], [7.0, 7.0]]]),
              "counts": jnp.array([[3.0, 0.0, 1.0]])}]
  new = class_tables.aggregate_classes(uploads)
  np.testing.assert_array_equal(new["valid"], [True, False, True])  # HtFLlib: class 1 lost
  kept = class_tables.remember(old, new)
  np.testing.assert_array_equal(kept["valid"], [True, True, True])
  np.testing.assert_allclose(kept["table"], [[5.0, 5.0], [2.0, 2.0], [7.0, 7.0]])
