"""The machinery's two ways of running a group's clients, and its debug round.

``rounds.train_group`` trains a group's sampled clients in place one after another
(``client_parallelism='sequential'`` on one device, the CPU's path) or gathers, maps
(``vmap``, an accelerator's path) and scatters them. Every algorithm's round is pinned
here on both, so a write-back fault in either branch fails a test; ``debug_round``
(clients one by one, outside any compiled round) is held against them too.
"""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from test_protocol import OVERRIDES

from fedjax_het import packing
from fedjax_het.algorithms import SPECS
from fedjax_het.algorithms import api
from fedjax_het.algorithms import rounds
from fedjax_het.training import experiment as experiment_lib
from fedjax_het.training import loop
from fedjax_het.training import program

pytestmark = pytest.mark.usefixtures("compile_bound")

# the two programs sum in other orders (a vmapped batch against one client at a time)
RTOL, ATOL = 1e-5, 1e-6


@pytest.fixture
def threefry():
  """Keys whose draws under ``vmap`` equal the same draws one key at a time (conftest's
  'unsafe_rbg' draws other bits under ``vmap``: the two paths would shuffle apart)."""
  with jax.default_prng_impl("threefry2x32"), jax.threefry_partitionable(False):
    yield


def prepare(tiny_config, name, parallelism, **overrides):
  """8 tiny clients in two groups (one for FedAvg), half of each sampled per round."""
  archs = "tiny" if SPECS[name].homogeneous_only else "tiny,tiny2"
  return experiment_lib.prepare(tiny_config(name, archs, {
      **OVERRIDES.get(name, {}), "participation": 0.5, "eval_sampled": True,
      "runtime.client_parallelism": parallelism, **overrides}))


def assert_close(actual, expected, what):
  actual, expected = packing.unpack_all(actual), packing.unpack_all(expected)
  assert jax.tree.structure(actual) == jax.tree.structure(expected), what
  for (path, a), e in zip(jax.tree_util.tree_leaves_with_path(actual),
                          jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=RTOL, atol=ATOL,
                               err_msg=f"{what}{jax.tree_util.keystr(path)}")


def two_rounds(round_fn, state, data):
  metrics = []
  for _ in range(2):
    state, m = round_fn(state, data)
    metrics.append(m)
  return state, metrics


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_vmapped_round_equals_the_in_place_sequential_round(tiny_config, threefry, name):
  seq = prepare(tiny_config, name, "sequential")
  vec = prepare(tiny_config, name, "vmap")
  assert seq.runtime.in_place and not vec.runtime.in_place  # the two branches
  state = program.compile_fns(seq).init(jax.random.PRNGKey(1))
  by_seq = two_rounds(jax.jit(seq.algorithm.round), state, seq.data)
  by_vec = two_rounds(jax.jit(vec.algorithm.round), state, vec.data)
  assert_close(by_vec, by_seq, f"{name}: ")
  # the rounds moved the sampled clients and kept the others: a write-back that drops
  # or misplaces a row differs between the branches, or leaves every client as it was
  before, after = packing.unpack_all(state.clients), packing.unpack_all(by_seq[0].clients)
  moved = [not np.array_equal(b, a) for b, a in zip(jax.tree.leaves(before),
                                                    jax.tree.leaves(after))]
  assert any(moved), name


@pytest.mark.parametrize("name", ["fedavg", "fedkd", "fedproto"])
def test_the_debug_round_equals_the_compiled_round(tiny_config, threefry, name):
  exp = prepare(tiny_config, name, "sequential")
  state = program.compile_fns(exp).init(jax.random.PRNGKey(2))
  compiled = two_rounds(jax.jit(exp.algorithm.round), state, exp.data)
  debugged = two_rounds(rounds.debug_round(exp.runtime, exp.algorithm.protocol), state,
                        exp.data)
  assert_close(debugged, compiled, f"{name}: ")


def raising(proto: api.Protocol, group: int, client: int | None) -> api.Protocol:
  """``proto`` whose ``client_update`` raises for one client of ``group`` (the one whose
  train table starts at pool index ``client``'s, seen only uncompiled), or for every
  client of ``group`` when it is traced (``client=None``)."""
  def client_update(g, c, payload, data, idx, mask, key):
    if g == group and (client is None or int(idx[0]) == client):
      raise FloatingPointError("the loss went non-finite on purpose")
    return proto.client_update(g, c, payload, data, idx, mask, key)
  return proto._replace(client_update=client_update)


def test_the_debug_round_names_the_client_that_raised(tiny_config):
  exp = prepare(tiny_config, "standalone", "sequential")
  rt, data = exp.runtime, exp.data
  state = program.compile_fns(exp).init(jax.random.PRNGKey(3))
  sample_key, train_key = rounds.round_keys(state)
  positions, _ = rounds.group_draw(rt, 1, sample_key, train_key)
  drawn = [p for p in np.asarray(positions).tolist() if p < rt.layout.group_sizes[1]]
  target = drawn[-1]  # the last client group 1 draws: the ones before it ran
  first_example = int(data.groups[1].train_idx[target][0])
  # uncompiled: the client's arrays are concrete, so one client can raise
  round_fn = rounds.debug_round(rt, raising(exp.algorithm.protocol, 1, first_example),
                                jit_clients=False)
  with pytest.raises(rounds.ClientError) as err:
    round_fn(state, data)
  client_id = rt.layout.client_ids[1][target]
  assert str(err.value) == (
      f"round 1, group 1 (tiny2), client {target} of the group (client id {client_id}): "
      "FloatingPointError: the loss went non-finite on purpose")
  assert isinstance(err.value.__cause__, FloatingPointError)
  # jitted per client: the first client of the group it traces raises
  round_fn = rounds.debug_round(rt, raising(exp.algorithm.protocol, 1, None))
  with pytest.raises(rounds.ClientError, match=(
      rf"^round 1, group 1 \(tiny2\), client {drawn[0]} of the group \(client id "
      rf"{rt.layout.client_ids[1][drawn[0]]}\): FloatingPointError")):
    round_fn(state, data)
  # and the compiled round raises it too, naming nothing: what the debug round is for
  with pytest.raises(FloatingPointError):
    jax.jit(rounds.from_protocol(rt, raising(exp.algorithm.protocol, 1, None)).round)(
        state, data)


def metric_rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [{k: v for k, v in json.loads(line).items() if "wall" not in k}
            for line in f]


def test_client_parallelism_debug_resumes_a_run_one_client_at_a_time(tiny_config, threefry,
                                                                     tmp_path):
  def run(mode, workdir, num_rounds=3):
    lines = []
    loop.run(tiny_config("fedproto", "tiny,tiny2", {
        "participation": 0.5, "num_rounds": num_rounds, "eval_every": 2,
        "eval_sampled": True, "runtime.client_parallelism": mode}), str(workdir),
        log=lines.append)
    return lines
  compiled = run("sequential", tmp_path / "compiled")
  # a compiled run's checkpoint after round 1, resumed in debug mode for rounds 2 and 3
  # (how a run that raised is rerun with its clients named)
  run("sequential", tmp_path / "debugged", num_rounds=1)
  debugged = run("debug", tmp_path / "debugged")
  assert debugged[0].startswith("resumed from round 1 in ")
  assert "1 cpu device, debug: clients one by one, each jitted on its own | rounds 2..3" in (
      debugged[1])
  assert "debug" not in compiled[0]
  # rows where a run evaluated: round 2 as due, round 3 its last (round 1 the last of
  # the run resumed); rounds 2 and 3 the same metrics as the compiled run's
  debugged, compiled = metric_rows(tmp_path / "debugged"), metric_rows(tmp_path / "compiled")
  assert [r["round"] for r in debugged] == [1, 2, 3]
  assert [r["round"] for r in compiled] == [2, 3]
  for d, c in zip(debugged[1:], compiled):
    assert d.keys() == c.keys()
    for k in c:
      np.testing.assert_allclose(d[k], c[k], rtol=RTOL, atol=ATOL, err_msg=k)


def test_client_parallelism_debug_eager_names_the_client_and_refuses_a_trace(tiny_config):
  exp = prepare(tiny_config, "standalone", "debug_eager")
  rt, data = exp.runtime, exp.data
  state = program.compile_fns(exp).init(jax.random.PRNGKey(3))
  # the switch alone makes every protocol's round the debug round, op by op
  target = int(data.groups[1].train_idx[rt.layout.group_sizes[1] - 1][0])
  alg = rounds.from_protocol(rt, raising(exp.algorithm.protocol, 1, target))
  with pytest.raises(rounds.ClientError, match=(
      r"^round 1, group 1 \(tiny2\), client \d+ of the group \(client id \d+\): "
      r"FloatingPointError: the loss went non-finite on purpose$")):
    alg.round(state, data)
  # a debug round cannot be compiled: one line, before any client ran
  with pytest.raises(TypeError, match="^debug_round runs the clients one by one in "
                                      "Python and cannot be traced"):
    jax.jit(exp.algorithm.round)(state, data)
  # nor can it run seeds on a replica axis (run_seeds): they run one by one
  with pytest.raises(ValueError, match="runs one seed at a time"):
    program.compile_dispatch(exp, 4, data_axes=0)
  # what the compiled parts of a debug run (evaluation) map clients with
  assert rt.in_place


def test_eager_runs_loops_op_by_op():
  seen = []

  def fn(xs):
    def body(total, x):
      seen.append(isinstance(x, jax.core.Tracer) or float(x))  # concrete only when eager
      return total + x, None
    return jax.lax.scan(body, jnp.zeros(()), xs)[0]
  assert float(rounds.eager(fn)(jnp.arange(3.0))) == 3.0
  assert seen == [0.0, 1.0, 2.0]
  seen.clear()
  jax.jit(fn)(jnp.arange(3.0))
  assert seen == [True]  # compiled: traced once, its values abstract


def test_map_group_sees_each_client_as_its_tree(tiny_config):
  exp = prepare(tiny_config, "standalone", "sequential")
  state = program.compile_fns(exp).init(jax.random.PRNGKey(4))
  assert packing.is_packed(state.clients[0])

  def first_leaf_sum(client, scale):
    assert isinstance(client, api.ClientState)  # a plain tree, not a packed row
    return scale * jnp.sum(jax.tree.leaves(client.params)[0])
  scales = jnp.arange(exp.runtime.layout.padded_sizes[0], dtype=jnp.float32)
  got = rounds.map_group(exp.runtime, first_leaf_sum, state.clients[0], scales)
  leaf = jax.tree.leaves(packing.unpack(state.clients[0]).params)[0]
  expected = np.asarray(scales) * np.asarray(leaf).reshape(leaf.shape[0], -1).sum(1)
  np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-5)


def test_a_batched_witness_runs_the_group_without_a_conditional():
  def step(x):
    return x * 2.0

  def grouped(x, witness):
    return rounds.own_computation(step, (x,), witness)

  def primitives(fn, *args):
    return {str(e.primitive) for e in jax.make_jaxpr(fn)(*args).jaxpr.eqns}
  x = jnp.ones((3, 2))
  # the state mapped, the witness shared: a conditional per replica, as run_seeds does
  shared = jax.vmap(grouped, in_axes=(0, None))
  np.testing.assert_array_equal(shared(x, jnp.int32(1)), 2 * np.ones((3, 2)))
  assert "cond" in primitives(shared, x, jnp.int32(1))
  assert not rounds.batched(jnp.int32(1))
  # a witness of each replica's own (pools of their own): no select of both branches
  own = jax.vmap(grouped)
  np.testing.assert_array_equal(own(x, jnp.arange(3)), 2 * np.ones((3, 2)))
  np.testing.assert_array_equal(jax.jit(own)(x, jnp.arange(3)), 2 * np.ones((3, 2)))
  assert "cond" not in primitives(own, x, jnp.arange(3))
  assert "select_n" not in primitives(own, x, jnp.arange(3))
