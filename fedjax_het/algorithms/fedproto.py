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

The reference implementations: FedProto's code (yuetan031/FedProto, ``lib/update.py``,
``lib/utils.py``) and HtFLlib's (TsingZ0/HtFLlib ``clientproto.py``, ``serverproto.py``).
Both train the whole model with lamda = 1 on the MSE term averaged over the batch and the
dimensions (a sample whose class has no global prototype adds 0), as here. Where they
differ from our defaults, a key selects theirs (docs/fidelity.md):

- ``prototype_classes='own'``: FedProto's code predicts among the client's own classes
  only (others get a large constant distance); HtFLlib and our default ('all') among
  every valid global prototype. At the ledger's N=100 cut the rule over all classes
  falls below the clients' chance (docs/fidelity.md, "FedProto at the N=100 cut").
- ``prototype_weighting='clients'``: both codes average the clients' prototypes of a
  class with equal weight; our default weighs them by class counts (the paper's Eq. (6)).
- ``prototypes_from='during_training'``: both codes average the representations of the
  training batches (augmented, the model moving; HtFLlib over every local epoch, which
  this key does, FedProto's code over the last); our default is one extra pass with the
  trained model over the client's train data.
- ``prototype_memory=False``: HtFLlib's table holds only this round's classes; FedProto's
  code trains every client every round, so nothing is missing there.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het import clients as cl
from fedjax_het import models
from fedjax_het.algorithms import api
from fedjax_het.algorithms import rounds
from fedjax_het.algorithms.class_tables import WEIGHTINGS
from fedjax_het.algorithms.class_tables import accumulate
from fedjax_het.algorithms.class_tables import class_stats
from fedjax_het.algorithms.class_tables import table_protocol
from fedjax_het.algorithms.shared import init_models

INFERENCE = ("prototype", "header")
PROTOTYPE_CLASSES = ("all", "own")
PROTOTYPES_FROM = ("after_training", "during_training")


def fedproto(rt: api.Runtime, *, learning_rate: float, momentum: float = 0.0,
             weight_decay: float = 0.0, grad_clip: float = 0.0,
             lamda: float = 1.0, inference: str = "prototype",
             prototype_memory: bool = True, prototype_classes: str = "all",
             prototype_weighting: str = "counts",
             prototypes_from: str = "after_training") -> api.Algorithm:
  """Builds FedProto.

  Args:
    rt: runtime (groups by architecture, C, E, B, devices).
    learning_rate, momentum: local SGD.
    weight_decay, grad_clip: coupled L2 and gradient-norm clipping (``api.sgd``).
    lamda: weight of the prototype MSE term.
    inference: one of ``INFERENCE``.
    prototype_memory: keep the last known global prototype of a class nobody sent this
      round (default); False: HtFLlib's this-round-only table.
    prototype_classes: the classes the prototype rule chooses among (``PROTOTYPE_CLASSES``):
      'all' valid global prototypes (HtFLlib's ``test_metrics``), or the client's 'own'
      classes, those of its training data (FedProto's code, ``test_inference_new_het_lt``).
    prototype_weighting: clients in the global prototype (``class_tables.WEIGHTINGS``):
      by their class 'counts' (the paper's Eq. (6)) or each once ('clients', both codes).
    prototypes_from: a client's local prototypes from one pass over its data
      'after_training' with the trained model, or the features of its training batches
      'during_training' (augmented, every local epoch; HtFLlib's ``clientproto.train``).

  Returns:
    ``Algorithm``. ``state.clients[g]`` is a ``ClientState`` with the private params
    stacked [n_g, ...] (and, with ``prototype_classes='own'``, ``model_state`` a
    ``class_tables.HeldClasses``, ``held`` bool [n_g, C]); ``state.server`` =
    {'table': float32 [C, 500] global prototypes, 'valid': bool [C]}.
  """
  for key, value, valid in (("inference", inference, INFERENCE),
                            ("prototype_classes", prototype_classes, PROTOTYPE_CLASSES),
                            ("prototype_weighting", prototype_weighting, WEIGHTINGS),
                            ("prototypes_from", prototypes_from, PROTOTYPES_FROM)):
    if value not in valid:
      raise ValueError(f"algo.{key}={value!r}; valid: {valid}")
  own = prototype_classes == "own"
  during = prototypes_from == "during_training"
  num_classes = rt.layout.num_classes
  nets = init_models(rt, num_classes=num_classes)
  width = nets[0].rep_dim
  if any(n.rep_dim != width for n in nets):
    raise ValueError("fedproto needs one representation width across architectures")
  opt = api.sgd(learning_rate, momentum, weight_decay, grad_clip)

  def loss_fn(net, protos):
    def fn(params, model_state, batch, rng):
      del rng
      rep = models.extract(net, params, batch.x)
      logits = models.classify(net, params, rep)
      loss = cl.cross_entropy(logits, batch.y, batch.mask)
      if during:  # model_state: this round's ClassSums (class_tables.accumulate)
        model_state = accumulate(model_state, rep, batch.y, batch.mask)
      return loss + lamda * proto_mse(rep, batch.y, batch.mask, protos), model_state
    return fn

  def predict(g, client, protos):
    net = nets[g]

    def fn(x):
      rep = models.extract(net, client.params, x)
      logits = models.classify(net, client.params, rep)
      if inference == "header":
        return logits
      table = own_classes(protos, client.model_state.held) if own else protos
      return jnp.where(jnp.any(table["valid"]), nearest_prototype_scores(rep, table),
                       logits.astype(jnp.float32))
    return fn

  proto = table_protocol(rt, nets, opt, width=width, loss_fn=loss_fn, uplink=uplink,
                         memory=prototype_memory, predict=predict,
                         weighting=prototype_weighting, during_training=during,
                         track_held=own)
  return rounds.from_protocol(rt, proto)


def proto_mse(rep, labels, mask, protos) -> jax.Array:
  """lamda's term: mean over the batch of mean_d (rep - \bar C^(y))^2.

  Samples whose class has no valid prototype contribute 0 but still count in the batch
  size, as in HtFLlib (where their target is the representation itself).
  """
  target = protos["table"][labels]
  keep = mask & protos["valid"][labels]
  err = jnp.mean(jnp.square(rep.astype(jnp.float32) - target), axis=-1)
  return jnp.sum(err * keep) / jnp.maximum(jnp.sum(mask), 1.0)


def own_classes(protos, held) -> dict:
  """The table restricted to the classes a client ``held`` (bool [C]) where any of them
  has a valid prototype; the whole table otherwise (a client not yet visited).

  FedProto's code gives the other classes a large constant distance, so a client
  predicts only its own classes.
  """
  mine = protos["valid"] & held
  return {**protos, "valid": jnp.where(jnp.any(mine), mine, protos["valid"])}


def nearest_prototype_scores(rep, protos) -> jax.Array:
  """Scores [B, C] = -mean squared distance to each valid prototype (-inf if invalid)."""
  d = jnp.mean(jnp.square(rep.astype(jnp.float32)[:, None, :] - protos["table"][None]), -1)
  return jnp.where(protos["valid"][None], -d, -jnp.inf)


def uplink(net, params, data, idx, mask, rt: api.Runtime) -> dict:
  """What a FedProto client sends: its per-class mean representations and counts."""
  return class_stats(lambda x: models.extract(net, params, x), data.x, data.y, idx, mask,
                     num_classes=rt.layout.num_classes, **rt.eval_options())


SPEC = api.Spec(lambda c, rt: fedproto(rt, **api.sgd_args(c), **c.algo),
                 api.hparams_of(fedproto),
                 choices=dict(inference=INFERENCE, prototype_classes=PROTOTYPE_CLASSES,
                              prototype_weighting=WEIGHTINGS,
                              prototypes_from=PROTOTYPES_FROM))
