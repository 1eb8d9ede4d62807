r"""FedProto: federated prototype learning across heterogeneous clients.

Tan, Long, Liu, Zhou, Lu, Jiang, Zhang. "FedProto: Federated Prototype Learning across
Heterogeneous Clients", AAAI 2022 (arXiv 2105.00243).

Symbols (paper -> code):
- f_i = header o extractor: client i's private model (any of CNN-1..5, representation
  width d = 500); nothing of it leaves the client.
- C_i^(j) = (1/|D_i,j|) sum_{x in D_i,j} F_ex(x): client i's local prototype of class j
  (``class_tables.class_stats``), sent only for the classes j it holds.
- Global prototypes: \bar C^(j) = sum_i |D_i,j| C_i^(j) / sum_i |D_i,j| over the round's
  clients that hold class j (``class_tables.aggregate_classes``). A class nobody sent
  this round keeps its last known global prototype (``prototype_memory=True``, the
  default here): under partial participation a round's clients hold only some classes,
  and without the memory a client could not predict its other classes that round (8-10 %
  of a client's CIFAR-10 test examples, 31-33 % on CIFAR-100, at C = 10 %).
  ``prototype_memory=False`` is HtFLlib's ``serverproto`` (the table holds only this
  round's classes; the rest are marked invalid).
- Local loss: CE(f_i(x), y) + lamda * MSE(F_ex(x), \bar C^(y)); the MSE term is dropped
  for samples whose class has no valid global prototype (so it is off in round 1).

Uplink per client: (#classes held x 500) prototype entries (plus the C per-class counts,
not counted). Downlink: the full prototype table (C x 500).

Inference ``algo.inference``: 'prototype' (default) predicts the class of the nearest
valid global prototype in mean squared distance, as the paper and HtFLlib's
``clientProto.test_metrics`` do (falling back to the header while no prototype exists);
'header' uses the client's own model.

Choices taken from the reference implementation (TsingZ0/HtFLlib ``clientproto.py``,
``serverproto.py``): the whole model is trained with lamda = 1 on the MSE term averaged
over the batch and the 500 dims; classes that no client of the round sent are dropped
from the global table (not carried over from earlier rounds). Differences: HtFLlib
averages the features seen *during* the local epochs and then averages clients
uniformly; here prototypes come from one extra pass over the client's train data with
the trained model (like HtFLlib's ``collect_protos``), and clients are
weighted by their class counts as in the paper's Eq. (6).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het import clients as cl
from fedjax_het import models
from fedjax_het.algorithms import base
from fedjax_het.algorithms.class_tables import class_stats
from fedjax_het.algorithms.class_tables import table_protocol
from fedjax_het.algorithms.class_tables import table_round
from fedjax_het.algorithms.shared import from_protocol
from fedjax_het.algorithms.shared import init_models

INFERENCE = ("prototype", "header")


def fedproto(rt: base.Runtime, *, learning_rate: float, momentum: float = 0.0,
             weight_decay: float = 0.0, grad_clip: float = 0.0,
             lamda: float = 1.0, inference: str = "prototype",
             prototype_memory: bool = True) -> base.Algorithm:
  """Builds FedProto.

  Args:
    rt: runtime (groups by architecture, C, E, B, devices).
    learning_rate, momentum: local SGD.
    weight_decay, grad_clip: coupled L2 and gradient-norm clipping (``base.sgd``).
    lamda: weight of the prototype MSE term.
    inference: one of ``INFERENCE``.
    prototype_memory: keep the last known global prototype of a class nobody sent this
      round (default); False: HtFLlib's this-round-only table.

  Returns:
    ``Algorithm``. ``state.clients[g]`` is a ``ClientState`` with the private params
    stacked [n_g, ...]; ``state.server`` = {'table': float32 [C, 500] global prototypes,
    'valid': bool [C]}.
  """
  if inference not in INFERENCE:
    raise ValueError(f"algo.inference={inference!r}; valid: {INFERENCE}")
  num_classes = rt.layout.num_classes
  nets = init_models(rt, num_classes=num_classes)
  width = nets[0].rep_dim
  if any(n.rep_dim != width for n in nets):
    raise ValueError("fedproto needs one representation width across architectures")
  opt = base.sgd(learning_rate, momentum, weight_decay, grad_clip)

  def loss_fn(net, protos):
    def fn(params, model_state, batch, rng):
      del rng
      rep = models.extract(net, params, batch.x)
      logits = models.classify(net, params, rep)
      loss = cl.cross_entropy(logits, batch.y, batch.mask)
      return loss + lamda * proto_mse(rep, batch.y, batch.mask, protos), model_state
    return fn

  def predict(g, client, protos):
    net = nets[g]

    def fn(x):
      rep = models.extract(net, client.params, x)
      logits = models.classify(net, client.params, rep)
      if inference == "header":
        return logits
      return jnp.where(jnp.any(protos["valid"]), nearest_prototype_scores(rep, protos),
                       logits.astype(jnp.float32))
    return fn

  proto = table_protocol(rt, nets, opt, width=width, loss_fn=loss_fn, uplink=uplink,
                         memory=prototype_memory, predict=predict)
  return from_protocol(rt, proto, table_round(rt, proto, width))


def proto_mse(rep, labels, mask, protos) -> jax.Array:
  """lamda's term: mean over the batch of mean_d (rep - \bar C^(y))^2.

  Samples whose class has no valid prototype contribute 0 but still count in the batch
  size, as in HtFLlib (where their target is the representation itself).
  """
  target = protos["table"][labels]
  keep = mask & protos["valid"][labels]
  err = jnp.mean(jnp.square(rep.astype(jnp.float32) - target), axis=-1)
  return jnp.sum(err * keep) / jnp.maximum(jnp.sum(mask), 1.0)


def nearest_prototype_scores(rep, protos) -> jax.Array:
  """Scores [B, C] = -mean squared distance to each valid prototype (-inf if invalid)."""
  d = jnp.mean(jnp.square(rep.astype(jnp.float32)[:, None, :] - protos["table"][None]), -1)
  return jnp.where(protos["valid"][None], -d, -jnp.inf)


def uplink(net, params, data, idx, mask, rt: base.Runtime) -> dict:
  """What a FedProto client sends: its per-class mean representations and counts."""
  return class_stats(lambda x: models.extract(net, params, x), data.x, data.y, idx, mask,
                     num_classes=rt.layout.num_classes, **rt.eval_options())


SPEC = base.Spec(lambda c, rt: fedproto(rt, **base.sgd_args(c), **c.algo),
                 dict(lamda=1.0, inference="prototype", prototype_memory=True),
                 choices=dict(inference=INFERENCE))
