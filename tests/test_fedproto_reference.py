"""FedProto's keys for the reference implementations' choices (docs/fidelity.md).

The prototype rule over the client's own classes (FedProto's code), the global
prototype as the plain mean over clients (both codes), local prototypes gathered during
training (HtFLlib): each by hand, then in a round and through config validation.
"""
import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from fedjax_het import validation
from fedjax_het.algorithms import class_tables
from fedjax_het.algorithms import fedproto
from fedjax_het.training import experiment
from fedjax_het.training import program

pytestmark = pytest.mark.usefixtures("compile_bound")


def _uploads():
  # group a: a client holding classes 0 (1 example, mean 1) and 2 (3 examples, mean 6),
  # and a padding slot with garbage; group b: a client holding class 0 (3 examples, 5)
  up_a = {"means": jnp.array([[[1.0], [0.0], [6.0]], [[9.0], [9.0], [9.0]]]),
          "counts": jnp.array([[1.0, 0.0, 3.0], [0.0, 0.0, 0.0]])}
  up_b = {"means": jnp.array([[[5.0], [0.0], [0.0]]]), "counts": jnp.array([[3.0, 0.0, 0.0]])}
  return [up_a, up_b]


@pytest.mark.parametrize("weighting,class0", [("counts", (1 * 1 + 3 * 5) / 4),
                                              ("clients", (1 + 5) / 2)])
def test_prototype_weighting_by_hand(weighting, class0):
  out = class_tables.aggregate_classes(_uploads(), weighting)
  np.testing.assert_allclose(out["table"][:, 0], [class0, 0.0, 6.0])
  np.testing.assert_array_equal(out["valid"], [True, False, True])


def test_unknown_weighting_is_refused():
  with pytest.raises(ValueError, match="valid: \\('counts', 'clients'\\)"):
    class_tables.aggregate_classes(_uploads(), "uniform")


def test_features_gathered_during_training_by_hand():
  stats = class_tables.empty_stats(3, 2)
  feats = jnp.array([[1.0, 0.0], [3.0, 2.0], [5.0, 5.0]])
  # two epochs over the same 3 examples; the third is padding in the first batch only
  stats = class_tables.accumulate(stats, feats, jnp.array([0, 0, 2]),
                                  jnp.array([True, True, False]))
  stats = class_tables.accumulate(stats, 2 * feats, jnp.array([0, 0, 2]),
                                  jnp.array([True, True, True]))
  assert isinstance(stats, class_tables.ClassSums)  # the loss's carry, typed
  np.testing.assert_allclose(stats.counts, [4.0, 0.0, 1.0])
  np.testing.assert_allclose(stats.sums, [[12.0, 6.0], [0.0, 0.0], [10.0, 10.0]])
  up = class_tables.stats_upload(stats, epochs=2)
  np.testing.assert_allclose(up["counts"], [2.0, 0.0, 0.5])
  np.testing.assert_allclose(up["means"], [[(1 + 3 + 2 + 6) / 4, (0 + 2 + 0 + 4) / 4],
                                           [0.0, 0.0], [10.0, 10.0]])


def test_held_classes_are_the_union_over_rounds():
  held = class_tables.HeldClasses(jnp.array([False, True, False, False]))
  # a round whose upload holds classes 0 and 3 (per-epoch counts; 0: not sent)
  held = class_tables.held_after(held, jnp.array([2.0, 0.0, 0.0, 0.5]))
  assert isinstance(held, class_tables.HeldClasses) and held.held.dtype == jnp.bool_
  np.testing.assert_array_equal(held.held, [True, True, False, True])
  held = class_tables.held_after(held, jnp.zeros(4))  # nothing sent: nothing forgotten
  np.testing.assert_array_equal(held.held, [True, True, False, True])
  assert jax.tree.leaves(held) == [held.held]  # one leaf, as the dict {'held'} it replaced


def test_own_classes_rule_picks_only_held_classes():
  # class 0's prototype is nearest to both representations, but the client holds 1 and 2
  protos = {"table": jnp.array([[0.0, 0.0], [3.0, 3.0], [-3.0, -3.0]]),
            "valid": jnp.array([True, True, True])}
  rep = jnp.array([[0.5, 0.5], [-0.5, -0.5]])
  everyone = jnp.argmax(fedproto.nearest_prototype_scores(rep, protos), -1)
  np.testing.assert_array_equal(everyone, [0, 0])
  held = jnp.array([False, True, True])
  mine = jnp.argmax(fedproto.nearest_prototype_scores(
      rep, fedproto.own_classes(protos, held)), -1)
  np.testing.assert_array_equal(mine, [1, 2])


def test_own_classes_rule_falls_back_to_every_valid_class():
  # nothing known of the client yet (never visited), or none of its classes valid
  protos = {"table": jnp.zeros((3, 2)), "valid": jnp.array([True, False, True])}
  for held in ([False, False, False], [False, True, False]):
    out = fedproto.own_classes(protos, jnp.array(held))
    np.testing.assert_array_equal(out["valid"], [True, False, True])


@pytest.mark.parametrize("key,value", [("prototype_classes", "mine"),
                                       ("prototype_weighting", "uniform"),
                                       ("prototypes_from", "epochs")])
def test_unknown_choices_are_refused_before_any_data(tiny_config, key, value):
  c = tiny_config("fedproto", "tiny", {f"algo.{key}": value})
  with pytest.raises(ValueError, match=key):
    validation.validate(c)


def test_references_choices_in_a_round(tiny_config):
  """Own-class rule, plain client mean, prototypes from training: two rounds."""
  exp = experiment.prepare(tiny_config("fedproto", "tiny", {
      "participation": 0.5, "algo.prototype_classes": "own",
      "algo.prototype_weighting": "clients", "algo.prototypes_from": "during_training",
      "algo.prototype_memory": False}))
  round_fn = jax.jit(chex.assert_max_traces(exp.algorithm.round, n=1))
  state = program.compile_fns(exp).init(jax.random.PRNGKey(0))
  assert isinstance(state.clients[0].model_state, class_tables.HeldClasses)
  held0 = np.asarray(state.clients[0].model_state.held)
  assert held0.dtype == bool and held0.shape[1:] == (exp.runtime.layout.num_classes,)
  assert not held0.any()
  for _ in range(2):
    state, metrics = round_fn(state, exp.data)
  assert all(np.isfinite(np.asarray(v)).all() for v in jax.tree.leaves(metrics))
  assert bool(np.any(state.server["valid"]))
  # a visited client knows exactly the classes of its training data
  g = exp.data.groups[0]
  assert isinstance(state.clients[0].model_state, class_tables.HeldClasses)
  held = np.asarray(state.clients[0].model_state.held)
  for k in range(held.shape[0]):
    idx = np.asarray(g.train_idx[k])[np.asarray(g.train_mask[k])]
    labels = set(np.asarray(exp.data.y)[idx].tolist())
    if held[k].any():
      assert set(np.flatnonzero(held[k]).tolist()) == labels
  assert held.any()
  correct, total = exp.algorithm.evaluate(state, exp.data)[0]
  assert np.all(np.asarray(correct) <= np.asarray(total))
