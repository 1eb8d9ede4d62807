"""The two sides of a deployed federation, independent of the transport.

A deployment runs an algorithm's ``Protocol`` (``fedjax_het.algorithms.base``) in
separate processes: every client process holds ONE client's private state and data
(``ClientNode``), the server process holds the server state (``ServerNode``). What moves
between them is exactly what the protocol sends: ``downlink(server, g)`` down and the
``upload`` of ``client_update`` up, as flat lists of numpy arrays (``encode`` /
``decode`` against structures both sides derive from the config).

The simulator's round is built from the same functions, and a deployment draws the same
clients and keys (``base.group_draw``) and initialises every client from the same key
(``base.client_init_keys``), so with one device, the same config, seed and partition a
deployment reproduces the simulator's run (tests/test_deploy_flower.py measures how
closely).

Persistence: the server checkpoints ``State(round, rng, (), server)`` after every
aggregated round; each client checkpoints its own state after every local round under
its own workdir. A client asked to train round r first drops any state of its own from
round r or later (the server rolled back to an earlier checkpoint), so the federation
resumes consistently from the server's newest checkpoint.
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
from typing import Any, Callable, Sequence

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from fedjax_het import clients as cl
from fedjax_het import config as config_lib
from fedjax_het import data as data_lib
from fedjax_het import models
from fedjax_het import validation
from fedjax_het.algorithms import Algorithm
from fedjax_het.algorithms import Runtime
from fedjax_het.algorithms import State
from fedjax_het.algorithms import base
from fedjax_het.algorithms import get_spec
from fedjax_het.data.sources import IMAGE_SHAPE
from fedjax_het.data.sources import parse_floats
from fedjax_het.deploy.robust import STATE_BOUND
from fedjax_het.training import checkpoint as ckpt_lib
from fedjax_het.training import estimate
from fedjax_het.training import experiment
from fedjax_het.training import program
from fedjax_het.training import runfiles

PyTree = Any


@flax.struct.dataclass
class ClientData:
  """One client's own examples and its padded train/test tables into them.

  Attributes:
    x: uint8 [n, H, W, C] the client's images (train and test).
    y: int32 [n] their labels.
    train_idx, train_mask: int32 / bool [n_train_max] (a multiple of the batch size).
    test_idx, test_mask: int32 / bool [n_test_max].
  """
  x: np.ndarray
  y: np.ndarray
  train_idx: np.ndarray
  train_mask: np.ndarray
  test_idx: np.ndarray
  test_mask: np.ndarray

  @property
  def num_train(self) -> int:
    """Real train examples (the client's aggregation weight)."""
    return int(np.sum(self.train_mask))

  @classmethod
  def from_arrays(cls, x_train, y_train, x_test, y_test, *, batch_size: int,
                  train_len: int = 0, test_len: int = 0) -> "ClientData":
    """A client's data from its own arrays (what a real deployment calls).

    Args:
      x_train, y_train, x_test, y_test: uint8 images [n, H, W, C], int labels [n].
      batch_size: B; tables are padded to a multiple of it.
      train_len, test_len: table lengths (0: the smallest multiple of B that fits).
    """
    x = np.concatenate([np.asarray(x_train), np.asarray(x_test)]).astype(np.uint8)
    y = np.concatenate([np.asarray(y_train), np.asarray(y_test)]).astype(np.int32)
    n_tr = len(y_train)
    return cls(x, y, *_table(np.arange(n_tr), train_len, batch_size),
               *_table(np.arange(n_tr, len(y)), test_len, batch_size))


def _table(idx: np.ndarray, length: int, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
  """(idx, mask) padded with index 0 / False to ``length`` (0: a multiple of B)."""
  length = length or max(batch_size, -(-len(idx) // batch_size) * batch_size)
  if len(idx) > length:
    raise ValueError(f"{len(idx)} examples do not fit a table of length {length}")
  out, mask = np.zeros(length, np.int32), np.zeros(length, bool)
  out[:len(idx)], mask[:len(idx)] = idx, True
  return out, mask


@dataclasses.dataclass(frozen=True)
class Federation:
  """What every process of a deployment derives from the config (no device placement).

  Attributes:
    config: the resolved config (algorithm defaults filled in).
    runtime: the client-side runtime, one device (``num_shards=1``, no mesh).
    algorithm: the algorithm; its ``protocol`` is what the processes run.
    data: the pooled ``FederatedData`` (numpy), as the simulator builds it, or None
      (``prepare_federation(..., with_data=False)``).
    client_archs: architecture of each client.
  """
  config: ml_collections.ConfigDict
  runtime: Runtime
  algorithm: Algorithm
  data: data_lib.FederatedData
  client_archs: tuple

  @property
  def protocol(self) -> base.Protocol:
    return self.algorithm.protocol

  def client_data(self, client_id: int) -> ClientData:
    """Client ``client_id``'s own examples, cut from the pool with the simulator's tables.

    The tables keep the simulator's lengths, so local shuffles (and results) match it.
    """
    g, j = self.runtime.layout.group_of(client_id)
    index = self.data.groups[g]
    rows = [np.asarray(a[j]) for a in (index.train_idx, index.train_mask, index.test_idx,
                                       index.test_mask)]
    own = np.unique(np.concatenate([rows[0][rows[1]], rows[2][rows[3]]]))
    remap = lambda idx, mask: np.where(mask, np.searchsorted(own, idx), 0).astype(np.int32)
    return ClientData(np.asarray(self.data.x)[own], np.asarray(self.data.y)[own],
                      remap(rows[0], rows[1]), rows[1], remap(rows[2], rows[3]), rows[3])


def prepare_federation(config: ml_collections.ConfigDict, *,
                       with_data: bool = True) -> Federation:
  """Validates the config, partitions the data as the simulator does, builds the algorithm.

  Args:
    config: the experiment config every process of the deployment shares.
    with_data: False lays the federation out from the config alone (``config.models``,
      ``num_clients``, ``data.name``), without reading any data: what a silo that brings
      its own arrays (``ClientData.from_arrays``) needs. ``Federation.data`` is then None.
      Only the built-in datasets (their image shape, classes and statistics are known)
      can be laid out so.

  Raises:
    ValueError: a bad config, or an algorithm without a ``protocol``, before any compute.
  """
  validation.validate(config)
  config = validation.with_algo_defaults(config)
  archs = tuple(models.client_archs(config.models, config.num_clients))
  if with_data:
    pool, train, test, _ = data_lib.load_clients(**config_lib.data_args(config))
    validation.check_models(config, archs, pool)
    fed, layout = data_lib.build_federated_data(pool.x, pool.y, train, test, archs,
                                                num_classes=pool.num_classes,
                                                pad_examples_to=config.batch_size)
    normalization = pool.normalization
  else:
    if config.data.name not in data_lib.DATASETS:
      raise ValueError(f"prepare_federation(with_data=False) lays out only the built-in "
                       f"datasets {sorted(data_lib.DATASETS)}; {config.data.name!r} needs "
                       "its arrays (with_data=True) for its image shape, classes and "
                       "statistics")
    fed = None
    names, ids = data_lib.group_clients(archs)
    layout = data_lib.Layout(names, ids, tuple(map(len, ids)), len(archs),
                             data_lib.DATASETS[config.data.name], IMAGE_SHAPE)
    normalization = None if not config.data.mean else tuple(
        parse_floats(config.data[k]) for k in ("mean", "std"))
  rt = experiment.make_runtime(config, layout, None, normalization)
  algorithm = get_spec(config.algorithm).build(config, rt)
  if algorithm.protocol is None:
    raise ValueError(f"algorithm {config.algorithm!r} has no protocol to deploy")
  return Federation(config, rt, algorithm, fed, archs)


CLIENT_CACHE = "client_data.npz"


def prepare_client(config: ml_collections.ConfigDict, client_id: int,
                   cache_dir: str) -> tuple[Federation, ClientData]:
  """Client ``client_id``'s federation and own data, read from the pool only once.

  The first call partitions the pool as ``prepare_federation`` does and keeps the
  client's examples, the layout and the normalization in ``<cache_dir>/client_data.npz``
  (with the config they come from); later calls with the same config build the
  federation from that file without reading the pool (a process that lives for one
  message, as a Flower ClientApp, saves seconds per message). ``Federation.data`` is
  then None.

  Raises:
    ValueError: a bad config, before any compute.
  """
  path = os.path.join(cache_dir, CLIENT_CACHE)
  key = json.dumps([config.to_dict(), client_id], sort_keys=True, default=str)
  if os.path.exists(path):
    with np.load(path, allow_pickle=False) as cached:
      if str(cached["key"]) == key:
        meta = json.loads(str(cached["meta"]))
        data = ClientData(*(cached[f.name] for f in dataclasses.fields(ClientData)))
        return _federation_of(config, meta), data
  fed = prepare_federation(config)
  data = fed.client_data(client_id)
  layout = fed.runtime.layout
  meta = {"layout": dataclasses.asdict(layout), "normalization": fed.runtime.normalization}
  os.makedirs(cache_dir, exist_ok=True)
  tmp = path + ".tmp.npz"
  np.savez(tmp, key=key, meta=json.dumps(meta),
           **{f.name: getattr(data, f.name) for f in dataclasses.fields(ClientData)})
  os.replace(tmp, path)
  return fed, data


def _federation_of(config: ml_collections.ConfigDict, meta: dict) -> Federation:
  """A data-less ``Federation`` from the layout and normalization ``prepare_client``
  kept (what ``prepare_federation`` builds after reading the pool)."""
  validation.validate(config)
  config = validation.with_algo_defaults(config)
  tup = lambda v: tuple(tup(x) for x in v) if isinstance(v, list) else v
  layout = data_lib.Layout(**{k: tup(v) for k, v in meta["layout"].items()})
  rt = experiment.make_runtime(config, layout, None, tup(meta["normalization"]))
  archs = tuple(models.client_archs(config.models, config.num_clients))
  return Federation(config, rt, get_spec(config.algorithm).build(config, rt), None, archs)


# ---------------------------------------------------------------- the wire format
def encode(tree: PyTree) -> list[np.ndarray]:
  """A pytree as the flat list of numpy arrays that crosses the wire."""
  return [np.asarray(a) for a in jax.tree.leaves(tree)]


def decode(arrays: Sequence[np.ndarray], like: PyTree) -> PyTree:
  """Inverse of ``encode`` against a structure ``like`` (arrays or ShapeDtypeStructs).

  Raises:
    ValueError: wrong number of arrays, or a shape or dtype that differs from ``like``.
  """
  leaves, treedef = jax.tree.flatten(like)
  if len(arrays) != len(leaves):
    raise ValueError(f"received {len(arrays)} arrays; expected {len(leaves)}")
  out = []
  for k, (a, ref) in enumerate(zip(arrays, leaves)):
    a = np.asarray(a)
    if a.shape != tuple(ref.shape) or a.dtype != ref.dtype:
      raise ValueError(f"array {k}: got {a.dtype}{list(a.shape)}, expected "
                       f"{ref.dtype}{list(ref.shape)}")
    out.append(a)
  return jax.tree.unflatten(treedef, out)


def num_scalars(arrays: Sequence[np.ndarray]) -> int:
  """Parameters (scalars) in a list of arrays: how communication is counted."""
  return int(sum(np.asarray(a).size for a in arrays))


# ---------------------------------------------------------------- checked uploads
# Bytes a serialized array may carry beyond its values (numpy's .npy header, which the
# transports use: at most a few hundred bytes for any shape).
ARRAY_OVERHEAD_BYTES = 1024


class UploadRejected(ValueError):
  """An upload the server refuses: the sending client's failure for the round."""


class NonFiniteState(ValueError):
  """A server state holding a non-finite or out-of-bound value (``state_problem``):
  never adopted, never checkpointed, never resumed."""


def non_finite_leaves(tree: PyTree) -> list[str]:
  """Paths of the floating-point leaves of ``tree`` holding a NaN or an infinity."""
  out = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    a = np.asarray(leaf)
    if np.issubdtype(a.dtype, np.inexact) and not np.all(np.isfinite(a)):
      out.append(jax.tree_util.keystr(path))
  return out


def out_of_bound_leaves(tree: PyTree, bound: float = STATE_BOUND) -> list[str]:
  """Paths of the floating-point leaves of ``tree`` holding a value beyond ``bound`` in
  magnitude (finite ones included: 3e38 is finite, and poisons every later round)."""
  out = []
  for path, leaf in jax.tree_util.tree_flatten_with_path(tree)[0]:
    a = np.asarray(leaf)
    if np.issubdtype(a.dtype, np.inexact) and a.size and not float(
        np.max(np.abs(a.astype(np.float64)))) <= bound:
      out.append(jax.tree_util.keystr(path))
  return out


def state_problem(tree: PyTree) -> str | None:
  """Why a server state may not be adopted, checkpointed or resumed (non-finite or
  out-of-bound values, with their leaves), or None."""
  bad = non_finite_leaves(tree)
  if bad:
    return f"holds non-finite values in {', '.join(bad[:3])}{' ...' if len(bad) > 3 else ''}"
  big = out_of_bound_leaves(tree)
  if big:
    return (f"holds values beyond {STATE_BOUND:g} in {', '.join(big[:3])}"
            f"{' ...' if len(big) > 3 else ''}")
  return None


@dataclasses.dataclass(frozen=True)
class ArrayHeader:
  """What a transport says about one received array before it is decoded.

  Attributes:
    dtype: the declared dtype name (``'float32'``).
    shape: the declared shape.
    nbytes: bytes actually received for it (serialized).
  """
  dtype: str
  shape: tuple
  nbytes: int


def headers_of(arrays: Sequence[np.ndarray], overhead: int = 128) -> list[ArrayHeader]:
  """The headers numpy arrays would arrive with (``overhead`` bytes of framing each)."""
  return [ArrayHeader(str(a.dtype), tuple(a.shape), a.nbytes + overhead)
          for a in map(np.asarray, arrays)]


def upload_bytes(like: PyTree) -> int:
  """Bytes of the values of an upload shaped ``like`` (the bound a transport checks)."""
  return estimate.tree_bytes(like)


def check_upload(client_id: int, claimed_id: Any, headers: Sequence[ArrayHeader],
                 load: Callable[[], Sequence[np.ndarray]], like: PyTree) -> PyTree:
  """Decodes a client's upload after checking it; ``UploadRejected`` says what is wrong.

  Transport-free (``fedjax_het.deploy.flower`` calls it on every reply). The checks, in
  order, each before anything later is read:

  1. the reply speaks for the client it was asked of (``claimed_id == client_id``);
  2. the bytes received are at most the expected values plus ``ARRAY_OVERHEAD_BYTES``
     per array, and the array count is the expected one;
  3. every declared dtype and shape is the expected one;
  4. ``load()`` (only now called: the transport's decoding) gives those dtypes and
     shapes;
  5. every value of a floating-point array is finite.

  Args:
    client_id: the client the server sent the round's message to.
    claimed_id: the client id the reply says it comes from.
    headers: what the transport received, one per array (``ArrayHeader``).
    load: decodes the arrays (called once, after checks 1-3 pass).
    like: the expected upload (arrays or ShapeDtypeStructs; ``abstract_upload``).

  Returns:
    the upload as a pytree shaped ``like``.
  """
  if claimed_id != client_id:
    raise UploadRejected(f"the reply to client {client_id} claims to come from client "
                         f"{claimed_id!r}")
  leaves = jax.tree.leaves(like)
  bound = upload_bytes(like) + ARRAY_OVERHEAD_BYTES * len(leaves)
  received = sum(h.nbytes for h in headers)
  if received > bound:
    raise UploadRejected(f"{received} bytes received; the upload holds at most {bound}")
  if len(headers) != len(leaves):
    raise UploadRejected(f"{len(headers)} arrays received; expected {len(leaves)}")
  for k, (h, ref) in enumerate(zip(headers, leaves)):
    if h.dtype != np.dtype(ref.dtype).name or tuple(h.shape) != tuple(ref.shape):
      raise UploadRejected(f"array {k}: declared {h.dtype}{list(h.shape)}, expected "
                           f"{np.dtype(ref.dtype).name}{list(ref.shape)}")
  try:
    tree = decode(load(), like)
  except Exception as err:  # pylint: disable=broad-exception-caught  (a hostile reply's)
    raise UploadRejected(f"does not decode: {err}") from err
  for k, a in enumerate(jax.tree.leaves(tree)):
    if np.issubdtype(a.dtype, np.inexact) and not np.all(np.isfinite(a)):
      raise UploadRejected(f"array {k} holds non-finite values")
  return tree


def check_weight(weight: Any, expected: int | None) -> int:
  """A client's aggregation weight (its train examples), or ``UploadRejected``.

  A weight decides how much an upload counts, so an unchecked one poisons the aggregate
  as surely as a bad array: it must be a positive integer, and equal to ``expected``
  (the client's train examples, when the server knows them: ``expected_counts``).
  """
  if isinstance(weight, bool) or not isinstance(weight, (int, np.integer)) or weight <= 0:
    raise UploadRejected(f"weight {weight!r} is not a positive integer")
  if expected is not None and int(weight) != expected:
    raise UploadRejected(f"weight {weight} differs from the client's {expected} train "
                         "examples")
  return int(weight)


def check_counts(correct: Any, total: Any, expected_total: int | None) -> tuple[int, int]:
  """A client's evaluation ``(correct, total)``, or ``UploadRejected``."""
  if not all(isinstance(v, (int, np.integer)) and not isinstance(v, bool)
             for v in (correct, total)) or not 0 <= correct <= total:
    raise UploadRejected(f"evaluation counts {correct!r}/{total!r} are not 0 <= correct "
                         "<= total")
  if expected_total is not None and int(total) != expected_total:
    raise UploadRejected(f"evaluated on {total} examples; the client holds "
                         f"{expected_total} test examples")
  return int(correct), int(total)


def check_metrics(aux: dict) -> dict[str, float]:
  """A client's training metrics (``aux``: name -> number), all finite, as floats."""
  out = {}
  for k, v in aux.items():
    if isinstance(v, bool) or not isinstance(v, (int, float, np.number)) or not np.isfinite(v):
      raise UploadRejected(f"metric {k!r}={v!r} is not a finite number")
    out[k] = float(v)
  return out


def expected_counts(fed: Federation, client_id: int) -> tuple[int | None, int | None]:
  """(train, test) examples of ``client_id`` from the server's partition (None, None
  when the federation was laid out without data)."""
  if fed.data is None:
    return None, None
  g, j = fed.runtime.layout.group_of(client_id)
  index = fed.data.groups[g]
  return int(index.num_train[j]), int(index.num_test[j])


def expected_class_counts(fed: Federation, client_id: int) -> np.ndarray | None:
  """float64 [C] train examples of ``client_id`` per class from the server's partition
  (None when the federation was laid out without data)."""
  if fed.data is None:
    return None
  g, j = fed.runtime.layout.group_of(client_id)
  index = fed.data.groups[g]
  idx = np.asarray(index.train_idx[j])[np.asarray(index.train_mask[j])]
  labels = np.asarray(fed.data.y)[idx]
  return np.bincount(labels, minlength=fed.runtime.layout.num_classes).astype(np.float64)


def key_to_bytes(key: jax.Array) -> bytes:
  """A raw uint32 PRNG key as bytes (Flower config values are scalars or bytes)."""
  return np.asarray(key, np.uint32).tobytes()


def key_from_bytes(raw: bytes) -> jax.Array:
  """Inverse of ``key_to_bytes``."""
  return jnp.asarray(np.frombuffer(raw, np.uint32))


def abstract_server(fed: Federation) -> PyTree:
  """Shapes of the server state."""
  return jax.eval_shape(fed.protocol.init_server, jax.random.PRNGKey(fed.config.seed))


def abstract_client(fed: Federation, group: int) -> PyTree:
  """Shapes of one client's state in ``group``."""
  return jax.eval_shape(functools.partial(fed.protocol.init_client, group),
                        jax.random.PRNGKey(0))


def abstract_payload(fed: Federation, group: int) -> PyTree:
  """Shapes of what the server sends a client of ``group``."""
  return jax.eval_shape(lambda s: fed.protocol.downlink(s, group), abstract_server(fed))


def abstract_upload(fed: Federation, group: int) -> PyTree:
  """Shapes of what a client of ``group`` sends."""
  b = fed.runtime.batch_size
  dummy = ClientData(np.zeros((b,) + tuple(fed.runtime.layout.image_shape), np.uint8),
                     np.zeros((b,), np.int32),
                     *([np.zeros((b,), np.int32), np.zeros((b,), bool)] * 2))
  return jax.eval_shape(
      lambda c, p, d, k: fed.protocol.client_update(group, c, p, d, d.train_idx,
                                                    d.train_mask, k)[1],
      abstract_client(fed, group), abstract_payload(fed, group), dummy,
      jax.random.PRNGKey(0))


def on_device(abstract: PyTree) -> PyTree:
  """``abstract`` with every leaf placed on the first local device (orbax restores)."""
  sharding = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding),
                      abstract)


def fingerprint(fed: Federation) -> dict:
  """The config values that define a deployment's results (as the simulator's)."""
  return runfiles.fingerprint(fed)


# ---------------------------------------------------------------- the client
def boxed(tree: PyTree) -> PyTree:
  """``tree``, or ``{'state': tree}`` when it is a single array (a round counter, as
  FedAvg's clients keep), which orbax's ``StandardSave`` does not take."""
  return {"state": tree} if jax.tree_util.treedef_is_leaf(jax.tree.structure(tree)) else tree


def unboxed(tree: PyTree, like: PyTree) -> PyTree:
  """Inverse of ``boxed`` for a tree restored as ``boxed(like)``."""
  return tree["state"] if jax.tree_util.treedef_is_leaf(jax.tree.structure(like)) else tree


class ClientNode:
  """One client of a deployment: its private state, its data, its checkpoints.

  Args:
    fed: the federation (only its protocol, runtime and config are used).
    client_id: this client's id (its architecture group follows from the layout).
    data: the client's own examples (``Federation.client_data`` or
      ``ClientData.from_arrays``).
    workdir: where this client checkpoints its state (``<workdir>/checkpoints``); None
      keeps nothing on disk.
    keep: client checkpoints kept.
  """

  def __init__(self, fed: Federation, client_id: int, data: ClientData,
               workdir: str | None = None, *, keep: int = 3):
    self.fed, self.client_id, self.data = fed, client_id, data
    self.group, self.position = fed.runtime.layout.group_of(client_id)
    g, proto = self.group, fed.protocol
    self._abstract = abstract_client(fed, g)
    self.payload_like = abstract_payload(fed, g)
    self._update = jax.jit(lambda c, p, d, k: proto.client_update(
        g, c, p, d, d.train_idx, d.train_mask, k))
    self._evaluate = jax.jit(lambda c, p, d: cl.evaluate_client(
        proto.predict(g, c, p), d.x, d.y, d.test_idx, d.test_mask,
        **fed.runtime.eval_options()))
    self._ckpt = None
    if workdir:
      self._ckpt = ckpt_lib.Checkpointer(
          os.path.join(os.path.abspath(workdir), "checkpoints"), max_to_keep=keep,
          fingerprint=dict(fingerprint(fed), client_id=client_id))
    self.state, self.state_round = self._restore(None)

  def _initial(self):
    key = jax.random.PRNGKey(self.fed.config.seed)
    padded = self.fed.runtime.layout.padded_sizes[self.group]
    state = program.jit_init(functools.partial(self.fed.protocol.init_client, self.group))(
        base.client_init_keys(key, self.group, padded)[self.position])
    # placed as a restored state is (``on_device``), so the local round compiles to the
    # same program either way (one entry in a persistent compilation cache)
    return jax.device_put(state, jax.sharding.SingleDeviceSharding(jax.local_devices()[0]))

  def _restore(self, before: int | None):
    """(state, round it was produced at): the newest checkpoint before ``before``."""
    if self._ckpt is not None:
      for step in self._ckpt.steps():
        if before is not None and step >= before:
          self._ckpt.manager.delete(step)  # ahead of the server: rolled back
      restored = self._ckpt.restore_latest(on_device(boxed(self._abstract)))
      if restored is not None:
        return unboxed(restored[0], self._abstract), int(restored[1]["round"])
    return self._initial(), 0

  def warmup(self) -> None:
    """Compiles the local round and the evaluation (a zero payload; results dropped)."""
    zeros = encode(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), self.payload_like))
    payload = decode(zeros, self.payload_like)
    jax.block_until_ready(self._update(self.state, payload, self.data,
                                       jax.random.PRNGKey(0)))
    jax.block_until_ready(self._evaluate(self.state, payload, self.data))

  def fit(self, round_: int, payload: Sequence[np.ndarray], key: jax.Array
          ) -> tuple[list[np.ndarray], int, dict]:
    """Trains round ``round_`` from the server's payload; returns (upload, weight, aux).

    The new state is checkpointed before anything is returned, so whatever the server
    aggregates, this client can restore.
    """
    if self.state_round >= round_:
      self.state, self.state_round = self._restore(round_)
    state, upload, aux = self._update(self.state, decode(payload, self.payload_like),
                                      self.data, key)
    self.state, self.state_round = state, round_
    if self._ckpt is not None:
      self._ckpt.save(round_, boxed(state), {"round": round_})
    return encode(upload), self.data.num_train, {k: float(v) for k, v in aux.items()}

  def evaluate(self, payload: Sequence[np.ndarray]) -> tuple[int, int]:
    """(correct, total) of this client's personalized model on its test split."""
    correct, total = self._evaluate(self.state, decode(payload, self.payload_like),
                                    self.data)
    return int(correct), int(total)

  def close(self) -> None:
    if self._ckpt is not None:
      self._ckpt.close()


# ---------------------------------------------------------------- the server
class ServerNode:
  """The server of a deployment: its state, the round's draw, aggregation, checkpoints.

  Args:
    fed: the federation.
    workdir: where the server checkpoints (``<workdir>/checkpoints``).
    keep: checkpoints kept.
  """

  def __init__(self, fed: Federation, workdir: str, *, keep: int = 2):
    self.fed, proto, rt = fed, fed.protocol, fed.runtime
    self.workdir = os.path.abspath(workdir)
    os.makedirs(self.workdir, exist_ok=True)
    self.ckpt = ckpt_lib.Checkpointer(os.path.join(self.workdir, "checkpoints"),
                                      max_to_keep=keep, fingerprint=fingerprint(fed))
    rng = jax.random.PRNGKey(fed.config.seed)
    abstract = State(jax.ShapeDtypeStruct((), jnp.int32),
                     jax.eval_shape(lambda: rng), (), abstract_server(fed))
    self.repairs: list[str] = []  # checkpoints set aside at restore, one line each
    restored = self._restore_checked(on_device(abstract))
    if restored is None:
      theta = program.jit_init(proto.init_server)(rng)
      self.state = State(jnp.zeros((), jnp.int32), rng, (), theta)
      self.meta = {}
    else:
      self.state, self.meta = restored
    self.groups = range(rt.layout.num_groups)
    self._downlink = [jax.jit(functools.partial(lambda s, g: proto.downlink(s, g), g=g))
                      for g in self.groups]
    self.upload_like = [abstract_upload(fed, g) for g in self.groups]
    self._aggregate = jax.jit(proto.aggregate)
    self._server_data = None
    if proto.server_data is not None:
      if fed.data is None:
        raise ValueError(f"the {fed.config.algorithm} server needs data of its own (e.g. "
                         "Moss's public set): prepare_federation(config, with_data=True)")
      placed = fed.data.replace(x=jnp.asarray(fed.data.x), y=jnp.asarray(fed.data.y))
      self._server_data = jax.jit(proto.server_data)(placed, rng)

  def _restore_checked(self, abstract):
    """The newest checkpoint whose state passes ``state_problem``; a newer one that fails
    is set aside (``Checkpointer.quarantine``: kept in ``checkpoints.corrupted/``, not
    deleted) and named in ``repairs``.

    Raises:
      NonFiniteState: checkpoints exist and every one fails (one line, naming them).
    """
    refused = []
    while True:
      restored = self.ckpt.restore_latest(abstract)
      if restored is None:
        break
      why = state_problem(restored[0].server)
      if why is None:
        return restored
      step = int(restored[0].round)
      refused.append(step)
      self.repairs.append(f"checkpoint of round {step} {why}; set aside in "
                          f"{self.ckpt.manager.directory}.corrupted/{step}")
      self.ckpt.quarantine(step)
    if refused:
      raise NonFiniteState(f"refusing to resume: every checkpoint ({refused}) in "
                           f"{self.workdir}/checkpoints fails the server's checks (kept in "
                           "checkpoints.corrupted/); resubmit with fresh-start to begin anew")
    return None

  @property
  def round(self) -> int:
    """Rounds completed."""
    return int(self.state.round)

  def payload(self, group: int) -> list[np.ndarray]:
    """What the server sends a client of ``group`` now."""
    return encode(self._downlink[group](self.state.server))

  def draw(self) -> dict[int, tuple[int, jax.Array]]:
    """The clients of the next round: {client_id: (slot order, training key)}.

    The same clients and keys the simulator's round draws (``base.group_draw``).
    """
    layout = self.fed.runtime.layout
    sample_key, train_key = base.keys_of_round(self.state.rng, self.state.round)
    out, order = {}, 0
    for g in self.groups:
      idx, keys = base.group_draw(self.fed.runtime, g, sample_key, train_key)
      for slot, pos in enumerate(np.asarray(idx)):
        if pos < layout.group_sizes[g]:
          out[layout.client_ids[g][pos]] = (order, keys[slot])
          order += 1
    return out

  def check_upload(self, client_id: int, arrays: Sequence[np.ndarray]) -> None:
    """Raises ValueError unless ``arrays`` decode as an upload of ``client_id``'s group."""
    decode(arrays, self.upload_like[self.fed.runtime.layout.group_of(client_id)[0]])

  def aggregate(self, results: dict[int, tuple[Sequence[np.ndarray], float]]) -> dict:
    """Aggregates the uploads {client_id: (arrays, weight)} received; advances the round.

    Uploads are stacked per group in draw order; a group nobody uploaded for gets one
    zero-weight row (so it contributes nothing).

    Returns:
      the protocol's own metrics as Python values.

    Raises:
      NonFiniteState: the new state fails ``state_problem`` (non-finite, or beyond
        ``STATE_BOUND``); the state is kept.
    """
    layout = self.fed.runtime.layout
    order = self.draw()
    uploads, weights = [], []
    for g in self.groups:
      ids = sorted((c for c in results if layout.group_of(c)[0] == g),
                   key=lambda c: order.get(c, (len(order), None))[0])
      rows = [decode(results[c][0], self.upload_like[g]) for c in ids]
      w = [float(results[c][1]) for c in ids]
      if not rows:
        rows, w = [jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), self.upload_like[g])], [0.0]
      uploads.append(jax.tree.map(lambda *a: np.stack(a), *rows))
      weights.append(np.asarray(w, np.float32))
    _, train_key = base.keys_of_round(self.state.rng, self.state.round)
    server, metrics = self._aggregate(self.state.server, tuple(uploads), tuple(weights),
                                      train_key, self._server_data)
    why = state_problem(server)
    if why:
      raise NonFiniteState(f"the aggregated server state {why}; kept the previous state")
    self.state = self.state.replace(round=self.state.round + 1, server=server)
    return {k: np.asarray(v).tolist() for k, v in metrics.items()}

  def save(self, meta: dict) -> None:
    """Checkpoints the state at the current round with ``meta``.

    Raises:
      NonFiniteState: the state holds a non-finite value (nothing is written).
    """
    why = state_problem(self.state.server)
    if why:
      raise NonFiniteState(f"server state of round {self.round} {why}; not checkpointed")
    self.meta = dict(meta, round=self.round)
    self.ckpt.save(self.round, self.state, self.meta)

  def close(self) -> None:
    self.ckpt.close()
