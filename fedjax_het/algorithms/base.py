"""What every algorithm is made of: its state, the static runtime, and the group round.

An algorithm is a factory closing over its hyper-parameters and returning
``Algorithm(init, round, evaluate)`` (see ``fedavg.py`` for the smallest one):

- ``init(rng) -> State``
- ``round(state, data) -> (state, metrics)``: pure and jittable; one communication round.
- ``evaluate(state, data) -> tuple[(correct [n_g], total [n_g]) per group]``: every client's
  personalized model on its own test split.

``State`` is one frozen pytree for all algorithms: what differs is what they put in
``clients`` (one entry per architecture group, every leaf stacked on a leading client
axis) and in ``server``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple

import flax
import jax
import jax.numpy as jnp
import optax

from fedjax_het import clients as cl
from fedjax_het import sharding
from fedjax_het.data.federated import ClientIndex, FederatedData, Layout

PyTree = Any


@flax.struct.dataclass
class ClientState:
  """State a client keeps between rounds (leaves stacked [n_g, ...] inside a group).

  Attributes:
    params: trainable parameters (private and local copies of shared parts).
    model_state: non-trained variables such as batch statistics, or None.
    opt_state: optimizer state.
  """
  params: PyTree
  model_state: PyTree
  opt_state: PyTree


@flax.struct.dataclass
class State:
  """The whole federation.

  Attributes:
    round: int32 scalar, rounds completed.
    rng: PRNG key from the seed; round ``r`` uses ``fold_in(rng, r)``.
    clients: tuple of per-group ``ClientState`` (or any pytree), leading axis = clients
      of that group padded to the device count.
    server: what the server holds between rounds (global model, prototypes, ...).
  """
  round: jax.Array
  rng: jax.Array
  clients: tuple
  server: PyTree


class Algorithm(NamedTuple):
  """The pure functions of an algorithm (see module docstring)."""
  init: Callable[[jax.Array], State]
  round: Callable[[State, FederatedData], tuple[State, dict]]
  evaluate: Callable[[State, FederatedData], tuple]


class Spec(NamedTuple):
  """How the experiment runner builds an algorithm from a config (``SPEC`` of a module).

  Attributes:
    build: ``(config, runtime) -> Algorithm``.
    hparams: the algorithm's own config keys (``config.algo``) with their defaults.
    choices: for string-valued ``hparams``, the valid values.
    homogeneous_only: True when all clients must share one architecture.
  """
  build: Callable
  hparams: dict
  choices: dict = {}
  homogeneous_only: bool = False


def sgd_args(config) -> dict:
  """The shared optimizer keys of a config as factory keyword arguments."""
  return dict(learning_rate=config.learning_rate, momentum=config.momentum)


@dataclasses.dataclass(frozen=True)
class Runtime:
  """Static settings shared by the client side of every algorithm.

  Attributes:
    layout: groups of clients by architecture (from ``build_federated_data``).
    participation: fraction C of each group's clients that train per round.
    local_epochs: E.
    batch_size: B (the data tables are padded to a multiple of it).
    client_parallelism: 'auto', 'vmap' or 'sequential' (see ``clients.map_clients``).
    num_shards: devices the client axis is sharded over.
    mesh: the client mesh, or None for a single device.
    compute_dtype: dtype of activations (float32, or bfloat16 for mixed precision).
  """
  layout: Layout
  participation: float = 1.0
  local_epochs: int = 1
  batch_size: int = 64
  client_parallelism: str = "auto"
  num_shards: int = 1
  mesh: Any = None
  compute_dtype: Any = jnp.float32

  def slots(self, group: int) -> tuple[int, int]:
    """(clients drawn, slots after padding to the shard count) of a group per round."""
    n = cl.num_sampled(self.layout.group_sizes[group], self.participation)
    return n, sharding.round_up(n, self.num_shards)

  def map(self, fn, *args):
    """``clients.map_clients`` with this runtime's parallelism and shards."""
    args = sharding.constrain_clients(args, self.mesh)
    return cl.map_clients(fn, *args, parallelism=self.client_parallelism,
                          num_shards=self.num_shards)


def round_keys(state: State) -> tuple[jax.Array, jax.Array]:
  """(sampling key, training key) of the current round: pure in (seed, round)."""
  key = jax.random.fold_in(state.rng, state.round)
  return jax.random.fold_in(key, 0), jax.random.fold_in(key, 1)


class GroupRound(NamedTuple):
  """Outcome of one group's local work in a round (leading axis = sampled slots)."""
  clients: PyTree  # the group's updated stacked client state (all clients)
  outputs: PyTree  # what ``client_fn`` returned per sampled slot
  weights: jax.Array  # float32 [slots]: train examples of each slot (0 on padding)


def train_group(rt: Runtime, group: int, clients_g: PyTree, data: FederatedData,
                sample_key: jax.Array, train_key: jax.Array,
                client_fn: Callable) -> GroupRound:
  """Samples the clients of a group, runs ``client_fn`` on each, writes them back.

  Args:
    rt: the runtime.
    group: group number (static).
    clients_g: the group's stacked client state [n_g_padded, ...].
    data: the federated data.
    sample_key, train_key: this round's keys (see ``round_keys``).
    client_fn: ``(client_state, train_idx [n], train_mask [n], key) -> (client_state,
      outputs)`` for one client; it closes over the pooled data and server payload.

  Returns:
    ``GroupRound``.
  """
  index: ClientIndex = data.groups[group]
  num, slots = rt.slots(group)
  idx = cl.sample_clients(jax.random.fold_in(sample_key, group),
                          rt.layout.group_sizes[group], num, slots)
  sampled = cl.gather_clients(clients_g, idx)
  tidx, tmask = cl.gather_clients((index.train_idx, index.train_mask), idx)
  keys = jax.random.split(jax.random.fold_in(train_key, group), slots)
  new, outputs = rt.map(client_fn, sampled, tidx, tmask, keys)
  weights = cl.gather_clients(index.num_train, idx).astype(jnp.float32)
  return GroupRound(cl.scatter_clients(clients_g, idx, new), outputs, weights)


def evaluate_groups(rt: Runtime, state: State, data: FederatedData,
                    predict: Callable[[int, PyTree, PyTree], Callable]) -> tuple:
  """Test accuracy counts of every client of every group.

  Args:
    predict: ``(group, client_state, server) -> (images -> logits)`` for one client.

  Returns:
    tuple over groups of ``(correct [n_g_padded], total [n_g_padded])``.
  """
  out = []
  for g, index in enumerate(data.groups):
    def one(client, idx, mask, g=g):
      return cl.evaluate_client(predict(g, client, state.server), data.x, data.y, idx, mask,
                                batch_size=rt.batch_size, dtype=rt.compute_dtype)
    out.append(rt.map(one, state.clients[g], index.test_idx, index.test_mask))
  return tuple(out)


def count_params(tree: PyTree) -> int:
  """Number of scalars in a pytree (communication is counted in parameters)."""
  return int(sum(x.size for x in jax.tree.leaves(tree)))


def round_metrics(groups: list[GroupRound], loss_of: Callable[[PyTree], jax.Array],
                  uplink: int | jax.Array, downlink: int | jax.Array) -> dict:
  """Standard round metrics.

  Returns:
    ``train_loss`` (mean over participating clients), ``group_train_loss`` [num_groups]
    (locates a numerical fault), ``uplink_params``/``downlink_params`` (parameters sent
    per participating client this round).
  """
  def mean_loss(gr):
    active = (gr.weights > 0).astype(jnp.float32)
    return jnp.sum(loss_of(gr.outputs) * active), jnp.sum(active)

  sums, counts = (jnp.stack(v) for v in zip(*map(mean_loss, groups)))
  return {
      "train_loss": jnp.sum(sums) / jnp.maximum(jnp.sum(counts), 1.0),
      "group_train_loss": sums / jnp.maximum(counts, 1.0),
      "uplink_params": jnp.asarray(uplink, jnp.float32),
      "downlink_params": jnp.asarray(downlink, jnp.float32),
  }


def init_clients(rt: Runtime, group: int, init_one: Callable[[jax.Array], PyTree],
                 key: jax.Array) -> PyTree:
  """Stacked initial state of a group's (padded) clients, one key per client."""
  n = rt.layout.padded_sizes[group]
  return jax.vmap(init_one)(jax.random.split(jax.random.fold_in(key, group), n))


def sgd(learning_rate: float, momentum: float = 0.0) -> optax.GradientTransformation:
  """The papers' optimizer: plain SGD (optional momentum)."""
  return optax.sgd(learning_rate, momentum=momentum or None)
