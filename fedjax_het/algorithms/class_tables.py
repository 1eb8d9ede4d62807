r"""Per-class tables on the wire: the protocol FedProto and FD share.

A client of FedProto (Tan et al., AAAI 2022) sends, for every class j it holds, the mean
representation of its examples of class j (its local prototype C_k^(j)); a client of FD
(Jeong et al., arXiv 1811.11479) sends the mean logits z_k^(j). Both keep a private model
and exchange only such a table: the server forms the count-weighted per-class mean
\bar C^(j) = sum_k n_k^(j) C_k^(j) / sum_k n_k^(j) over the clients that sent class j
(``aggregate_classes``) and sends the whole table back. The algorithm modules supply the
loss against the downloaded table, what a row holds (``uplink``) and the prediction.

- ``class_stats``: a client's per-class means and counts of any feature (one pass).
- ``aggregate_classes``, ``remember``: the server's table (clients weighted by their
  class counts, or each client once), optionally keeping the last row of a class nobody
  sent this round.
- ``empty_stats``, ``accumulate``, ``stats_upload``: per-class sums of a feature gathered
  *during* local training (HtFLlib's FedProto prototypes; a ``ClassSums``), instead of
  ``class_stats``'s extra pass after it.
- ``HeldClasses``: the classes a client has held, kept between rounds for a prediction
  among the client's own classes (FedProto's code).
- ``table_protocol``, ``table_communication``: the protocol built from them, with the
  communication counted in table entries (``mean_entries_sent``).
"""
from __future__ import annotations

import flax
import jax
import jax.numpy as jnp

from fedjax_het import clients as cl
from fedjax_het.algorithms import api
from fedjax_het.algorithms.shared import private_client_init


def empty_table(num_classes: int, width: int) -> dict:
  """{'table': float32 [C, width] zeros, 'valid': bool [C] all False}."""
  return {"table": jnp.zeros((num_classes, width), jnp.float32),
          "valid": jnp.zeros((num_classes,), bool)}


def class_stats(feature_fn, x_pool, y_pool, idx, mask, *, num_classes: int,
                batch_size: int, dtype=jnp.float32, normalization=None) -> dict:
  """Per-class means of ``feature_fn`` over one client's examples (one pass, no grad).

  Args:
    feature_fn: normalized images [B, ...] -> features [B, D].
    x_pool, y_pool: pooled images and labels.
    idx, mask: int32 / bool [n_max], ``n_max`` a multiple of ``batch_size``.
    dtype, normalization: as ``clients.make_batch``.

  Returns:
    {'means': float32 [C, D] (zeros for classes the client does not hold),
     'counts': float32 [C] examples per class}.
  """
  chunks = (idx.reshape(-1, batch_size), mask.reshape(-1, batch_size))

  def chunk(args):
    bidx, bmask = args
    batch = cl.make_batch(x_pool, y_pool, bidx, bmask, dtype=dtype,
                          normalization=normalization)
    feats = jax.lax.stop_gradient(feature_fn(batch.x)).astype(jnp.float32)
    onehot = jax.nn.one_hot(batch.y, num_classes) * bmask[:, None]
    return onehot.T @ feats, jnp.sum(onehot, axis=0)

  sums, counts = jax.tree.map(lambda a: jnp.sum(a, axis=0), jax.lax.map(chunk, chunks))
  return {"means": sums / jnp.maximum(counts, 1.0)[:, None], "counts": counts}


WEIGHTINGS = ("counts", "clients")


def aggregate_classes(uploads: list, weighting: str = "counts") -> dict:
  r"""Per-class mean of the uploaded tables over all groups' clients.

  ``weighting='counts'``: \bar C^(j) = sum_k n_k^(j) C_k^(j) / sum_k n_k^(j) (FedProto's
  Eq. (6)); ``'clients'``: every client that sent class j counts once, the plain mean of
  their rows (FedProto's code ``proto_aggregation`` and HtFLlib's ``serverproto``).

  Args:
    uploads: per group, {'means': [slots_g, C, D], 'counts': [slots_g, C]} (padding slots
      and unsent classes have count 0).
    weighting: one of ``WEIGHTINGS``.

  Returns:
    {'table': [C, D] (zeros where invalid), 'valid': bool [C], True where some client
    sent the class}.

  >>> up = {"means": jnp.array([[[1.0]], [[4.0]]]), "counts": jnp.array([[1.0], [3.0]])}
  >>> float(aggregate_classes([up])["table"][0, 0]), float(
  ...     aggregate_classes([up], "clients")["table"][0, 0])
  (3.25, 2.5)
  """
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting={weighting!r}; valid: {WEIGHTINGS}")
  means = jnp.concatenate([u["means"] for u in uploads])
  counts = jnp.concatenate([u["counts"] for u in uploads])
  if weighting == "clients":
    counts = (counts > 0).astype(jnp.float32)
  total = jnp.sum(counts, axis=0)
  table = jnp.sum(counts[..., None] * means, axis=0) / jnp.maximum(total, 1e-12)[:, None]
  valid = total > 0
  return {"table": jnp.where(valid[:, None], table, 0.0), "valid": valid}


@flax.struct.dataclass
class HeldClasses:
  """The classes a client has held (its ``ClientState.model_state`` with ``track_held``).

  Attributes:
    held: bool [C] ([n_g, C] stacked in a group): True for every class j with examples
      in the client's training data, known from its first visit on (all False before);
      FedProto's code predicts among these classes only.
  """
  held: jax.Array


@flax.struct.dataclass
class ClassSums:
  """Per-class running sums of a feature over a client's local training (the
  ``model_state`` its loss carries with ``during_training``; never kept between rounds).

  Attributes:
    counts: float32 [C]: how many examples of class j were seen (every epoch counted).
    sums: float32 [C, width]: the sum of the features of the examples of class j seen.
  """
  # counts first and sums computed first: the leaf and op order of the dict it replaced,
  # so the compiled round is the same program
  counts: jax.Array
  sums: jax.Array


def empty_stats(num_classes: int, width: int) -> ClassSums:
  """Per-class running sums of a feature, all zero: sums [C, width], counts [C]."""
  sums = jnp.zeros((num_classes, width), jnp.float32)
  return ClassSums(counts=jnp.zeros((num_classes,), jnp.float32), sums=sums)


def accumulate(stats: ClassSums, feats, labels, mask) -> ClassSums:
  """``stats`` plus one batch's features [B, width] (no gradient) of its real examples."""
  onehot = jax.nn.one_hot(labels, stats.counts.shape[0]) * mask[:, None]
  feats = jax.lax.stop_gradient(feats).astype(jnp.float32)
  sums = stats.sums + onehot.T @ feats
  return ClassSums(counts=stats.counts + jnp.sum(onehot, axis=0), sums=sums)


def stats_upload(stats: ClassSums, epochs: int) -> dict:
  """A client's upload from the sums of ``accumulate`` over its ``epochs`` local epochs.

  The means average every feature seen in training; the counts are per epoch (each
  example once), as ``class_stats``'s.
  """
  return {"means": stats.sums / jnp.maximum(stats.counts, 1.0)[:, None],
          "counts": stats.counts / epochs}


def held_after(held: HeldClasses, counts: jax.Array) -> HeldClasses:
  """``held`` joined with the classes of a round's upload (``counts`` [C] > 0)."""
  return HeldClasses(held=held.held | (counts > 0))


def mean_entries_sent(uploads: list, weights: list, width: int) -> jax.Array:
  """Mean over participating clients of (#classes sent x ``width``)."""
  seen = jnp.concatenate([jnp.sum(u["counts"] > 0, axis=-1) for u in uploads])
  active = (jnp.concatenate(weights) > 0).astype(jnp.float32)
  return jnp.sum(seen * active) * width / jnp.maximum(jnp.sum(active), 1.0)


def remember(old: dict, new: dict) -> dict:
  """The new table where a class arrived this round, the old row (and validity) elsewhere."""
  return {"table": jnp.where(new["valid"][:, None], new["table"], old["table"]),
          "valid": new["valid"] | old["valid"]}


def table_protocol(rt: api.Runtime, nets, opt, *, width: int, loss_fn, uplink, predict,
                   memory: bool = False, weighting: str = "counts",
                   during_training: bool = False, track_held: bool = False
                   ) -> api.Protocol:
  """The protocol of FedProto and FD: private models, per-class tables on the wire.

  Args:
    rt, nets, opt: runtime, one private CNN per group, local SGD.
    width: D, the width of a table row (500 for prototypes, C for logits).
    loss_fn: ``(net, table) -> clients.LossFn`` given the downloaded global table; with
      ``during_training`` its ``model_state`` is the ``empty_stats`` of the round (a
      ``ClassSums``), which it returns ``accumulate``d with each batch's features.
    uplink: ``(net, params, data, idx, mask, rt) -> {'means' [C, D], 'counts' [C]}``.
    predict: ``Protocol.predict`` (payload: the global table).
    memory: a class no client sent this round keeps its previous row (``remember``).
    weighting: how ``aggregate_classes`` weighs the clients (``WEIGHTINGS``).
    during_training: the upload is the features gathered by ``loss_fn`` during local
      training (``stats_upload``), not ``uplink``'s pass after it.
    track_held: the client's ``model_state`` is a ``HeldClasses``, the classes of its
      training data (known from its first visit on), for ``predict``; otherwise None.

  Returns:
    ``Protocol``: client state a ``ClientState`` of its private model; server state and
    downlink {'table': float32 [C, D], 'valid': bool [C]}; upload the client's
    per-class means and counts, aggregated by ``aggregate_classes``.
  """
  if weighting not in WEIGHTINGS:
    raise ValueError(f"weighting={weighting!r}; valid: {WEIGHTINGS}")
  num_classes = rt.layout.num_classes
  init_private = private_client_init(nets, opt, rt.layout.image_shape)

  def init_client(g, key):
    client = init_private(g, key)
    if track_held:
      client = client.replace(model_state=HeldClasses(jnp.zeros((num_classes,), bool)))
    return client

  def client_update(g, client, table, data, idx, mask, key):
    stats = empty_stats(num_classes, width) if during_training else None
    r = cl.local_train(loss_fn(nets[g], table), opt, client.params, stats,
                       client.opt_state, data.x, data.y, idx, mask, key,
                       **rt.train_options())
    if during_training:
      sent = stats_upload(r.model_state, rt.local_epochs)
    else:
      sent = uplink(nets[g], r.params, data, idx, mask, rt)
    kept = held_after(client.model_state, sent["counts"]) if track_held else None
    return api.ClientState(r.params, kept, r.opt_state), sent, {"loss": r.loss}

  def server_aggregate(table, uploads, weights, train_key, server_data):
    del weights, train_key, server_data  # the class counts weigh the means
    new = aggregate_classes(uploads, weighting)
    return (remember(table, new) if memory else new), {}

  return api.Protocol(init_client,
                       lambda rng: empty_table(rt.layout.num_classes, width),
                       lambda table, g: table, client_update, server_aggregate, predict,
                       communication=table_communication(num_classes, width))


def table_communication(num_classes: int, width: int):
  """``Protocol.communication`` of ``table_protocol``, in table entries.

  Uplink: mean over participating clients of (#classes held x ``width``); downlink: the
  full table, C x ``width``.
  """
  def communication(table, uploads, weights, aux):
    del table, aux
    return mean_entries_sent(list(uploads), list(weights), width), num_classes * width
  return communication
