"""The contract of an algorithm: what an author writes and what the library hands back.

Everything an algorithm module needs from the framework is here; how a round is run
(sampling, the in-place and gathered client paths, the conditionals each group's work
is compiled in, the packed client state, init and evaluation) is in ``rounds``, which
an author never has to open.

An algorithm is a factory closing over its hyper-parameters and returning
``Algorithm(init, round, evaluate, protocol)`` (``fedavg.py`` is the smallest one). Its
``Protocol`` is the round cut at the wire: one client's local step and the server's
aggregation as separate pure functions, each typed below (``ClientUpdateFn``,
``AggregateFn``, ...). ``rounds.from_protocol`` builds ``init``, ``round`` and
``evaluate`` from it, and ``fedjax_het.deploy`` runs the same functions in separate
processes, so an algorithm exists once.

Every function of a ``Protocol`` sees ONE client's state as the plain tree its
``init_client`` returned (no client axis, no packing): the machinery stacks, packs,
samples and maps.

- ``State``, ``ClientState``: the federation and one client's state.
- ``Protocol`` and its typed callables; ``Algorithm``; ``Spec`` (how a config builds it
  and what a deployment needs to know of it, such as ``averages``).
- ``Runtime``: the static settings a client's step reads (``rt.train_options()``).
- helpers an algorithm is written with: ``sgd``, ``clip``, ``sgd_args``, ``download``,
  ``own_upload``, ``count_params``, ``dummy_input``, ``hparams_of``.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, NamedTuple
from typing import Protocol as TypingProtocol

import flax
import jax
import jax.numpy as jnp
import optax

from fedjax_het import clients as cl
from fedjax_het import sharding
from fedjax_het.data.federated import FederatedData
from fedjax_het.data.federated import Layout

PyTree = Any


@flax.struct.dataclass
class ClientState:
  """State a client keeps between rounds (leaves stacked [n_g, ...] inside a group).

  Attributes:
    params: trainable parameters (private and local copies of shared parts).
    model_state: what the client keeps that SGD does not train, or None: flax's
      non-trained variable collections (FedMoE's gate batch statistics, a dict), or the
      algorithm's own state type (FedAPEN's ``ApenState``, FedProto's ``HeldClasses``).
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
    clients: tuple of per-group stacked client states (``ClientState`` or any pytree),
      leading axis = clients of that group padded to the device count; packed
      (``packing.Packed``) by ``init_clients``. ``state.clients[g].unpack().params``
      reads a packed group's stacked params as a tree (a copy), and
      ``state.clients[g].replace(params=...)`` writes them.
    server: what the server holds between rounds (global model, prototypes, ...).
  """
  round: jax.Array
  rng: jax.Array
  clients: tuple
  server: PyTree


# ---- the typed callables of a Protocol (one client, no client axis) ----------------


class InitClientFn(TypingProtocol):
  """``init_client(group, key) -> client``: the state of one client of ``group``."""
  def __call__(self, group: int, key: jax.Array) -> PyTree: ...


class InitServerFn(TypingProtocol):
  """``init_server(rng) -> server``: the server's state (``rng``: the run's seed key)."""
  def __call__(self, rng: jax.Array) -> PyTree: ...


class DownlinkFn(TypingProtocol):
  """``downlink(server, group) -> payload``: what a client of ``group`` receives before
  it trains or evaluates (FedMRL: theta; FD: the global logit table)."""
  def __call__(self, server: PyTree, group: int) -> PyTree: ...


class ClientUpdateFn(TypingProtocol):
  """``client_update(group, client, payload, data, idx, mask, key) -> (client, upload,
  aux)``: one client's local round.

  Args:
    group: the client's architecture group (static).
    client: its state (the tree ``init_client`` made).
    payload: ``downlink(server, group)``.
    data: ``.x`` uint8 [P, H, W, C] and ``.y`` int32 [P]: the pooled data in the
      simulator, the client's own examples in a deployment.
    idx, mask: int32 / bool [n_max]: its train table into ``data``.
    key: its PRNG key of this round.

  Returns:
    (new client state, of the same structure; ``upload``: everything the client sends;
    ``aux``: a dict of scalars that stay on the client, at least ``'loss'``).
  """
  def __call__(self, group: int, client: PyTree, payload: PyTree, data: FederatedData,
               idx: jax.Array, mask: jax.Array, key: jax.Array
               ) -> tuple[PyTree, PyTree, dict]: ...


class AggregateFn(TypingProtocol):
  """``aggregate(server, uploads, weights, train_key, server_data) -> (server, metrics)``.

  Args:
    server: the server's state before the round.
    uploads: tuple over groups of the uploads stacked [m_g, ...].
    weights: tuple over groups of float32 [m_g] train-example counts (0: no upload in
      that row, a padding slot or a failed client).
    train_key: this round's training key.
    server_data: ``Protocol.server_data(data, rng)``, or None.

  Returns:
    (new server state; the algorithm's own metrics, e.g. Moss's fidelities; a metric
    named ``uplink_params`` or ``downlink_params`` replaces ``communication``'s count).
  """
  def __call__(self, server: PyTree, uploads: tuple, weights: tuple, train_key: jax.Array,
               server_data: PyTree | None) -> tuple[PyTree, dict]: ...


class PredictFn(TypingProtocol):
  """``predict(group, client, payload) -> (images -> logits)``: the client's
  personalized model."""
  def __call__(self, group: int, client: PyTree, payload: PyTree
               ) -> Callable[[jax.Array], jax.Array]: ...


class ServerDataFn(TypingProtocol):
  """``server_data(data, rng) -> what aggregate needs beyond the uploads`` (Moss: its
  public images), computed from the pooled data and the run's seed key."""
  def __call__(self, data: FederatedData, rng: jax.Array) -> PyTree: ...


class TrainedPayloadFn(TypingProtocol):
  """``trained_payload(payload, upload) -> payload`` of a client's model right after its
  local training (the evaluation of the sampled clients, ``Runtime.eval_sampled``)."""
  def __call__(self, payload: PyTree, upload: PyTree) -> PyTree: ...


class CommunicationFn(TypingProtocol):
  """``communication(server, uploads, weights, aux) -> (uplink, downlink)``: parameters
  sent per participating client this round, each way.

  Args:
    server: the server's state before the round.
    uploads, weights: as ``AggregateFn`` gets them.
    aux: tuple over groups of the clients' ``aux`` dicts stacked [m_g].

  Returns:
    (uplink, downlink): Python numbers or float32 scalars; None where the aggregate
    reports the count itself (FedKD's compressed downlink, known after aggregating).
  """
  def __call__(self, server: PyTree, uploads: tuple, weights: tuple, aux: tuple
               ) -> tuple[Any, Any]: ...


def whole_server(server: PyTree, uploads: tuple, weights: tuple, aux: tuple
                 ) -> tuple[int, int]:
  """The default ``Protocol.communication``: both links carry the server's state whole
  (one averaged model, or the shared part of one)."""
  del uploads, weights, aux
  size = count_params(server)
  return size, size


class Protocol(NamedTuple):
  """One client's and the server's halves of a round, and what crosses the wire.

  Every function is pure and works on ONE client (no client axis): the simulator maps
  ``client_update`` over the sampled clients of a group inside its compiled round, a
  deployment (``fedjax_het.deploy``) calls it in the client's own process.

  Attributes:
    init_client: ``(group, key) -> client`` state of one client of ``group``.
    init_server: ``(rng) -> server`` state (``rng``: the run's seed key).
    downlink: ``(server, group) -> payload``: what the server sends a client of ``group``
      before it trains or evaluates (FedMRL: theta; FD: the global logit table).
    client_update: ``(group, client, payload, data, idx, mask, key) -> (client, upload,
      aux)``: one client's local round. ``data`` has ``.x`` uint8 [P, H, W, C] and
      ``.y`` int32 [P] (the pooled data in the simulator, the client's own examples in a
      deployment); ``idx``/``mask`` int32/bool [n_max] its train table; ``upload`` is
      everything the client sends; ``aux`` a dict of scalars that stay on the client
      (at least ``'loss'``).
    aggregate: ``(server, uploads, weights, train_key, server_data) -> (server,
      metrics)``: ``uploads`` a tuple over groups of uploads stacked [m_g, ...],
      ``weights`` a tuple of float32 [m_g] train-example counts (0: no upload in that
      row); ``train_key`` this round's training key (``round_keys``); ``metrics`` the
      algorithm's own (e.g. Moss's fidelities).
    predict: ``(group, client, payload) -> (images -> logits)``: the client's
      personalized model.
    server_data: ``(data, rng) -> what aggregate needs beyond the uploads`` (Moss: its
      public images), or None when nothing.
    trained_payload: ``(payload, upload) -> payload`` of a client's model right after
      its local training, for the evaluation of the sampled clients (the FedMRL
      authors' protocol, ``eval_sampled``): the client's own trained copy of the shared
      block where it trains one (FedAvg, FedMRL: its upload), None where ``predict``
      does not use a block the client trains (the downloaded payload is used).
    communication: ``(server, uploads, weights, aux) -> (uplink, downlink)``, the
      round's parameters sent per participating client (default ``whole_server``).
  """
  init_client: InitClientFn
  init_server: InitServerFn
  downlink: DownlinkFn
  client_update: ClientUpdateFn
  aggregate: AggregateFn
  predict: PredictFn
  server_data: ServerDataFn | None = None
  trained_payload: TrainedPayloadFn | None = None
  communication: CommunicationFn = whole_server


def own_upload(payload: PyTree, upload: PyTree) -> PyTree:
  """``Protocol.trained_payload`` of algorithms whose upload is their trained payload."""
  del payload
  return upload


class Algorithm(NamedTuple):
  """The pure functions of an algorithm (see module docstring)."""
  init: Callable[[jax.Array], State]
  round: Callable[[State, FederatedData], tuple[State, dict]]
  evaluate: Callable[[State, FederatedData], tuple]
  protocol: Protocol | None = None


class Spec(NamedTuple):
  """How the experiment runner builds an algorithm from a config (``SPEC`` of a module).

  Attributes:
    build: ``(config, runtime) -> Algorithm``.
    hparams: the algorithm's own config keys (``config.algo``) with their defaults.
    choices: for string-valued ``hparams``, the valid values.
    homogeneous_only: True when all clients must share one architecture.
    check: optional ``(config) -> None`` raising ValueError for a config the algorithm
      cannot run (``fedjax_het.validation.validate`` calls it before any data is read).
    averages: True when ``aggregate`` is the (weighted) average of one parameter set
      every group uploads alike: a deployment may then replace the uploads by a robust
      statistic of them (``fedjax_het.deploy.robust``).
  """
  build: Callable
  hparams: dict
  choices: dict = {}
  homogeneous_only: bool = False
  check: Callable | None = None
  averages: bool = False


SGD_KEYS = ("learning_rate", "momentum", "weight_decay", "grad_clip")  # ``sgd_args``


def hparams_of(factory: Callable, exclude: tuple[str, ...] = ()) -> dict:
  """``Spec.hparams`` read from a factory's signature: its keyword-only arguments with
  their defaults, in order, without the shared optimizer keys (``SGD_KEYS``) and
  ``exclude`` (keys the build passes from elsewhere in the config), so each default is
  written once, in the factory.

  >>> def algo(rt, *, learning_rate, mu=0.01, rule="weighted"): ...
  >>> hparams_of(algo)
  {'mu': 0.01, 'rule': 'weighted'}
  """
  skip = set(SGD_KEYS) | set(exclude)
  return {name: p.default for name, p in inspect.signature(factory).parameters.items()
          if p.kind == p.KEYWORD_ONLY and name not in skip and p.default is not p.empty}


def sgd_args(config) -> dict:
  """The shared optimizer keys of a config as factory keyword arguments (``sgd``)."""
  return dict(learning_rate=config.learning_rate, momentum=config.momentum,
              weight_decay=config.weight_decay, grad_clip=config.grad_clip)


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
    augment: augmentation set of local training batches (``data.augment``).
    drop_last: skip each epoch's partial last batch (``drop_last``).
    reset_downloaded_momentum: zero the optimizer state of a block the server replaces
      at download (``download``).
    eval_sampled: evaluate the round's sampled clients right after local training
      (``eval_sampled``; the round metric ``sampled_test_acc``).
    normalization: the dataset's per-channel ``(mean, std)`` of pixels in [0, 1]
      (``preprocess.normalize``; None: CIFAR's), a static tuple of tuples.
  """
  layout: Layout
  participation: float = 1.0
  local_epochs: int = 1
  batch_size: int = 64
  client_parallelism: str = "auto"
  num_shards: int = 1
  mesh: Any = None
  compute_dtype: Any = jnp.float32
  augment: str = "none"
  drop_last: bool = False
  reset_downloaded_momentum: bool = True
  eval_sampled: bool = False
  normalization: tuple | None = None

  def train_options(self) -> dict:
    """The keyword arguments of ``clients.local_train`` this runtime fixes."""
    return dict(epochs=self.local_epochs, batch_size=self.batch_size,
                dtype=self.compute_dtype, augment=self.augment, drop_last=self.drop_last,
                normalization=self.normalization)

  def batch_options(self) -> dict:
    """The keyword arguments of ``clients.make_batch`` this runtime fixes."""
    return dict(dtype=self.compute_dtype, normalization=self.normalization)

  def eval_options(self) -> dict:
    """The keyword arguments of ``clients.evaluate_client`` this runtime fixes."""
    return dict(batch_size=self.batch_size, **self.batch_options())

  def dummy_input(self, batch: int = 1) -> jax.Array:
    """Zero images float32 [batch, H, W, C] of the data's shape, for ``Module.init``."""
    return dummy_input(self.layout.image_shape, batch)

  def slots(self, group: int) -> tuple[int, int]:
    """(most clients a round draws, slots after padding to the shard count) of a group.

    K = round(C * N) clients are sampled over all groups (``clients.group_counts``);
    a group draws its floor of ``K * n_g / N`` or one more.
    """
    n = cl.group_slots(self.layout.group_sizes, self.participation)[group]
    return n, sharding.round_up(n, self.num_shards)

  def expected_sampled(self, group: int) -> float:
    """Clients of ``group`` sampled per round on average, ``K * n_g / N``."""
    floors, fractions = cl.group_quotas(self.layout.group_sizes, self.participation)
    return floors[group] + fractions[group]

  @property
  def in_place(self) -> bool:
    """Whether a group's sampled clients train in place, one after another
    (``clients.update_clients_in_place``): clients looped on one device."""
    return (cl.resolve_parallelism(self.client_parallelism) == "sequential"
            and self.num_shards <= 1)

  def map(self, fn, *args):
    """``clients.map_clients`` with this runtime's parallelism and shards."""
    args = sharding.constrain_clients(args, self.mesh)
    return cl.map_clients(fn, *args, parallelism=self.client_parallelism,
                          num_shards=self.num_shards)


def count_params(tree: PyTree) -> int:
  """Number of scalars in a pytree (communication is counted in parameters)."""
  return int(sum(x.size for x in jax.tree.leaves(tree)))


def dummy_input(image_shape: tuple[int, ...], batch: int = 1) -> jax.Array:
  """Zero images float32 [batch, H, W, C] of ``image_shape``, for ``Module.init``."""
  return jnp.zeros((batch,) + tuple(image_shape), jnp.float32)


def download(rt: Runtime, params: dict, opt_state: PyTree, blocks: dict
             ) -> tuple[dict, PyTree]:
  """A client's params with server blocks put in, and its optimizer state to go with them.

  Momentum of a replaced block: the buffer a client kept for its own copy of theta last
  round describes another point than the theta it now downloads (the aggregate of other
  clients' models), so carrying it into the new theta is a stale step. With
  ``rt.reset_downloaded_momentum`` (the default) every leaf of the optimizer state under
  a replaced block's key (the momentum buffer) is zeroed, as a fresh
  ``torch.optim.SGD`` over the downloaded block would start; the client's private blocks
  keep theirs. False keeps every buffer (one optimizer over all of the client's params
  across rounds).

  Args:
    rt: the runtime.
    params: the client's params, a dict of blocks (``{'global', 'local', 'proj'}``...).
    opt_state: its optimizer state (any optax state whose param-shaped parts are keyed
      like ``params``: ``base.sgd``, chains and ``optax.multi_transform`` of them).
    blocks: ``{block name: downloaded value}``.

  Returns:
    (params with ``blocks`` in place, optimizer state).
  """
  params = dict(params, **blocks)
  if not rt.reset_downloaded_momentum:
    return params, opt_state

  def reset(path, leaf):
    replaced = any(isinstance(k, jax.tree_util.DictKey) and k.key in blocks for k in path)
    return jnp.zeros_like(leaf) if replaced else leaf
  return params, jax.tree_util.tree_map_with_path(reset, opt_state)


def clip(grad_clip: float) -> optax.GradientTransformation:
  """Clips the global gradient norm to ``grad_clip`` (0: no clipping).

  As PyTorch's ``clip_grad_norm_(parameters, grad_clip)`` before ``optimizer.step()``
  (the FedMRL authors' code clips at 50).
  """
  return optax.clip_by_global_norm(grad_clip) if grad_clip > 0 else optax.identity()


def sgd(learning_rate: float, momentum: float = 0.0, weight_decay: float = 0.0,
        grad_clip: float = 0.0) -> optax.GradientTransformation:
  """The papers' local optimizer, as PyTorch's ``torch.optim.SGD`` runs it.

  In order: the global gradient norm clipped to ``grad_clip`` (0: off), coupled L2
  weight decay ``g + weight_decay * w`` (PyTorch's ``weight_decay``, not AdamW's
  decoupled decay), heavy-ball momentum ``b <- momentum * b + g`` (no dampening, no
  Nesterov), and the step ``w <- w - learning_rate * b``. The FedMRL authors' code uses
  lr 0.01, momentum 0.9, weight decay 1e-3, clip 50.

  Args:
    learning_rate: eta.
    momentum: 0 for plain SGD (no momentum buffer in the state).
    weight_decay: coupled L2 coefficient (0: off).
    grad_clip: maximum global gradient norm (0: off).
  """
  return optax.chain(
      clip(grad_clip),
      optax.add_decayed_weights(weight_decay) if weight_decay > 0 else optax.identity(),
      optax.sgd(learning_rate, momentum=momentum or None))
