"""Each algorithm's protocol, run the way a deployment runs it, against the simulator.

A deployment (``fedjax_het.deploy``) calls ``Algorithm.protocol`` in separate processes:
each client holds only its own examples and state, the server only the server state.
Here one round is run that way, in one process, and compared with the simulator's
compiled ``round`` and ``evaluate``; small hand-computed cases check aggregation rules.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SHARDED

from fedjax_het import clients as cl
from fedjax_het import packing
from fedjax_het.algorithms import SPECS
from fedjax_het.algorithms import base
from fedjax_het.algorithms import fedavg
from fedjax_het.algorithms import fedkd
from fedjax_het.algorithms import moss
from fedjax_het.algorithms import standalone
from fedjax_het.data.federated import Layout
from fedjax_het.training import experiment as experiment_lib
from fedjax_het.training import program

# programs that compile far longer than they run (one round at most): level 0
pytestmark = pytest.mark.usefixtures("compile_bound")

SMALL_SHARED = {"algo.small_arch": "tiny", "algo.rep_dim": 16}
OVERRIDES = {  # keep every model tiny; the default (none) suits the rest
    "fedmrl": {"algo.small_arch": "tiny", "algo.d1": 16},
    "fedmoe": {"algo.global_arch": "tiny", "algo.gating_hidden": 8},
    "fml": SMALL_SHARED,
    "fedkd": {**SMALL_SHARED, "algo.svd_energy_start": 0.9},
    "fedapen": SMALL_SHARED,
    # WIRE's look-ahead step at 1.0: the meta-gradient through the look-ahead (T_L's and
    # T_D's) is then well above Adam's eps (its first moment 4e-8..1.4e-5 per leaf here).
    # At 0.01 (the default) and 0.1 it is of eps' order on these tiny models, and Adam's
    # first step turns the two programs' rounding differences into differences of up to
    # 2 % and 67 % of those parameters with XLA:CPU's classic emitters (conftest); the
    # MLIR fusion emitters had rounded both programs alike.
    "moss": {"data.public": 32, "algo.public_size": 32, "algo.public_batch": 16,
             "algo.wire_steps": 1, "algo.wire_lr": 1.0,
             "algo.wire_layers": "conv2,rep"},
}
# The simulator maps the sampled clients inside one program (blocks of a device-sharded
# client axis) and its server contractions run over slots padded with zero-weight rows;
# a deployment jits one client at a time and stacks only the real uploads. XLA may order
# the float sums differently, so the two agree to rounding (about 1e-7 here), not bit for
# bit.
RTOL, ATOL = 1e-5, 1e-6


class OwnData(NamedTuple):
  """What a deployed client holds: its own examples only (no pool, no other client)."""
  x: np.ndarray  # uint8 [n_max, 32, 32, 3], zeros past its real examples
  y: np.ndarray  # int32 [n_max]


def own_data(data, idx, mask):
  """A client's examples gathered from the pool and its table remapped into them.

  Everything here and below is host numpy, as in a client's process (and eager
  indexing of arrays sharded over the 4 test devices is avoided).

  Args:
    data: the pooled ``FederatedData`` (host).
    idx, mask: int32 / bool [n_max] the client's table (real entries first).

  Returns:
    (``OwnData``, local idx int32 [n_max], mask): the table keeps its length, so the
    shuffles of local SGD draw the same orders as in the simulator.
  """
  x = np.where(mask[:, None, None, None], data.x[idx], 0).astype(data.x.dtype)
  y = np.where(mask, data.y[idx], 0).astype(data.y.dtype)
  return OwnData(x, y), np.where(mask, np.arange(len(idx)), 0).astype(idx.dtype), mask


def row(tree, j):
  """Client j's state (a tree) out of a group's stacked state (packed or a tree)."""
  return packing.as_tree(jax.tree.map(lambda a: a[j], tree))


def set_row(tree, j, value):
  """A group's stacked state with client j's state (a tree) replaced (host copies)."""
  if packing.is_packed(tree):
    value = packing.pack_like(tree.spec, value)

  def put(a, v):
    a = np.array(a)
    a[j] = v
    return a
  return jax.tree.map(put, tree, value)


def stack(trees):
  """Uploads of one group stacked on a new leading client axis."""
  return jax.tree.map(lambda *a: np.stack(a), *trees)


def assert_trees_close(actual, expected, rtol=RTOL, atol=ATOL):
  """Same structure and every leaf within tolerance (0, 0: equal)."""
  assert jax.tree.structure(actual) == jax.tree.structure(expected)
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)


@pytest.fixture
def vmap_invariant_prng():
  """Threefry keys, whose draws under ``vmap`` equal the same draws one key at a time.

  conftest's 'unsafe_rbg' lacks that property: with it neither a client's ``init_client`` nor
  the shuffles of a client trained alone would reproduce the simulator's batched ones.
  The non-partitionable threefry layout (JAX's default until 0.5) compiles twice as fast
  on CPU as the partitionable one and is vmap-invariant too.
  """
  with jax.default_prng_impl("threefry2x32"), jax.threefry_partitionable(False):
    yield


@pytest.mark.parametrize("partitionable", [True, False])
def test_threefry_draws_the_same_batched_or_not(partitionable):
  def draw(key):
    return jax.random.normal(jax.random.split(key)[1], (3,))
  with jax.threefry_partitionable(partitionable):
    keys = jax.random.split(jax.random.key(0, impl="threefry2x32"), 4)
    np.testing.assert_array_equal(jax.vmap(draw)(keys), np.stack([draw(k) for k in keys]))


@pytest.fixture
def experiment(tiny_config):
  """``make(name) -> experiment_lib.Experiment`` of 8 clients with tiny models.

  Two architecture groups (one for FedAvg); half of each group is sampled per round, so
  sampling and the simulator's padding slots matter.
  """

  def make(name):
    archs = "tiny" if SPECS[name].homogeneous_only else "tiny,tiny2"
    overrides = {**OVERRIDES.get(name, {}), "participation": 0.5, **SHARDED}
    return experiment_lib.prepare(tiny_config(name, archs, overrides))
  return make


def deployed_round(rt, proto, state, data):
  """One round as a deployment runs it: clients alone, then the server.

  Every sampled client runs ``client_update`` on its own examples only; the server
  ``aggregate``s the real uploads stacked per group.

  Args:
    rt, proto: the runtime and protocol.
    state, data: host copies (``jax.device_get``) of the state and the pooled data.

  Returns:
    the new ``State``.
  """
  sample_key, train_key = base.keys_of_round(state.rng, state.round)
  update = jax.jit(proto.client_update, static_argnums=0)
  clients, uploads, weights = list(state.clients), [], []
  for g, index in enumerate(data.groups):
    payload = proto.downlink(state.server, g)
    positions, keys = base.group_draw(rt, g, sample_key, train_key)
    sent, counts = [], []
    for p, key in zip(np.asarray(positions), keys):
      if p >= rt.layout.group_sizes[g]:
        continue  # a padding slot of the simulator: no client
      own, idx, mask = own_data(data, index.train_idx[p], index.train_mask[p])
      new, upload, _ = update(g, row(state.clients[g], p), payload, own, idx, mask, key)
      clients[g] = set_row(clients[g], p, new)
      sent.append(upload)
      counts.append(index.num_train[p])
    uploads.append(stack(sent))
    weights.append(np.asarray(counts, np.float32))
  server_data = jax.jit(proto.server_data)(data, state.rng) if proto.server_data else None
  server, _ = jax.jit(proto.aggregate)(state.server, tuple(uploads), tuple(weights),
                                       train_key, server_data)
  return state.replace(round=state.round + 1, clients=tuple(clients), server=server)


def deployed_test_counts(rt, proto, state, data):
  """Test counts of ``predict`` with the downlink, one client alone at a time.

  Returns:
    per group (correct float32 [n_g], total float32 [n_g]) over its real clients.
  """
  def count(g, client, payload, own, idx, mask):
    return cl.evaluate_client(proto.predict(g, client, payload), own.x, own.y, idx, mask,
                              **rt.eval_options())
  count = jax.jit(count, static_argnums=0)
  out = []
  for g, index in enumerate(data.groups):
    payload = proto.downlink(state.server, g)
    per_client = [count(g, row(state.clients[g], j), payload,
                        *own_data(data, index.test_idx[j], index.test_mask[j]))
                  for j in range(rt.layout.group_sizes[g])]
    out.append(tuple(np.array(v) for v in zip(*per_client)))
  return out


def assert_init_matches(rt, proto, rng, state):
  """``init_client``/``init_server`` give the simulator's initial state, bit for bit.

  Client j of group g, from its key ``client_init_keys(rng, g, padded)[j]``, is row j of
  ``state.clients[g]`` (the simulator ``vmap``s the very same function).
  """
  init_client = jax.jit(proto.init_client, static_argnums=0)
  for g in range(rt.layout.num_groups):
    keys = base.client_init_keys(rng, g, rt.layout.padded_sizes[g])
    for j in {0, rt.layout.group_sizes[g] - 1}:
      assert_trees_close(init_client(g, keys[j]), row(state.clients[g], j), 0, 0)
  assert_trees_close(jax.jit(proto.init_server)(rng), state.server, 0, 0)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_deployment_of_the_protocol_matches_the_simulator(experiment, vmap_invariant_prng,
                                                           name):
  exp = experiment(name)
  rt, alg, data = exp.runtime, exp.algorithm, exp.data
  fns = program.compile_fns(exp)
  init, evaluate = fns.init, fns.evaluate
  rng = jax.random.PRNGKey(0)
  state = init(rng)
  host, host_data = jax.device_get((state, data))
  assert_init_matches(rt, alg.protocol, rng, host)
  # one round: every sampled client alone on its own data, then the server
  simulated, _ = jax.jit(alg.round)(state, data)
  deployed = deployed_round(rt, alg.protocol, host, host_data)
  assert int(deployed.round) == int(simulated.round) == 1
  assert_trees_close(deployed.clients, simulated.clients)
  assert_trees_close(deployed.server, simulated.server)
  # predict with the downlink = the simulator's evaluate, client by client
  expected = evaluate(deployed, data)
  counts = deployed_test_counts(rt, alg.protocol, deployed, host_data)
  for g, (correct, total) in enumerate(counts):
    n = rt.layout.group_sizes[g]
    np.testing.assert_array_equal(total, np.asarray(expected[g][1])[:n])
    np.testing.assert_array_equal(correct, np.asarray(expected[g][0])[:n])


def one_group_runtime(arch="tiny", clients=2):
  """A runtime of one group of ``clients`` clients (no data needed)."""
  layout = Layout((arch,), (tuple(range(clients)),), (clients,), clients, 10)
  return base.Runtime(layout)


def test_fedavg_aggregate_weights_by_train_examples():
  proto = fedavg.fedavg(one_group_runtime(), learning_rate=0.1).protocol
  uploads = ({"w": jnp.array([[1.0, 2.0], [4.0, 6.0]])},)
  server, metrics = proto.aggregate({"w": jnp.zeros(2)}, uploads, (jnp.array([1.0, 3.0]),),
                                    jax.random.PRNGKey(0), None)
  np.testing.assert_allclose(server["w"], [3.25, 5.0])  # (1*1 + 3*4)/4, (1*2 + 3*6)/4
  assert metrics == {}
  assert proto.downlink(server, 0) is server  # the global model goes down whole


def test_standalone_sends_nothing_and_the_server_keeps_nothing():
  proto = standalone.standalone(one_group_runtime(), learning_rate=0.1).protocol
  server = proto.init_server(jax.random.PRNGKey(0))
  assert server == () and proto.downlink(server, 0) == ()
  assert proto.aggregate(server, ((),), (jnp.ones(2),), None, None) == ((), {})


def test_fedkd_server_adds_the_mean_update_and_counts_the_downlink():
  proto = fedkd.fedkd(one_group_runtime(), learning_rate=0.1, svd_energy_start=0.0).protocol
  theta = {"b": jnp.array([1.0, 1.0])}
  updates = ({"b": jnp.array([[2.0, 0.0], [0.0, 4.0]])},)
  server, metrics = proto.aggregate({"theta": theta, "round": jnp.int32(0)}, updates,
                                    (jnp.array([1.0, 1.0]),), jax.random.PRNGKey(0), None)
  np.testing.assert_allclose(server["theta"]["b"], [2.0, 3.0])  # 1 + (2+0)/2, 1 + (0+4)/2
  assert int(server["round"]) == 1
  assert float(metrics["downlink_params"]) == 2.0  # uncompressed: both scalars


def test_moss_type_without_uploads_keeps_its_model():
  previous = {"w": jnp.array([5.0, -1.0])}
  uploads = {"w": jnp.array([[1.0, 2.0], [3.0, 4.0]])}
  kept = moss.type_average(uploads, jnp.zeros(2), previous)
  np.testing.assert_array_equal(kept["w"], [5.0, -1.0])  # all weights 0: not zeros
  mean = moss.type_average(uploads, jnp.array([3.0, 1.0]), previous)
  np.testing.assert_allclose(mean["w"], [1.5, 2.5])  # (3*1 + 3)/4, (3*2 + 4)/4
