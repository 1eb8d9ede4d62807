r"""FD: federated distillation of per-class average logits.

Jeong, Oh, Kim, Bennis, Kim. "Communication-Efficient On-Device Machine Learning:
Federated Distillation and Augmentation under Non-IID Private Data", arXiv 1811.11479
(2018).

- Client k: its private model f_k (any of CNN-1..5) computes, for every class j it
  holds, the average logit vector z_k^(j) = mean_{(x, j) in D_k} f_k(x) in R^C, and
  sends {z_k^(j), n_k^(j)} (``class_tables.class_stats`` on the logits).
- Server: global logits \bar z^(j) = sum_k n_k^(j) z_k^(j) / sum_k n_k^(j) over the
  round's clients that hold class j; a class nobody sent is marked invalid.
- Local loss: CE(f_k(x), y) + lamda * D(f_k(x), \bar z^(y)), the distillation term
  dropped for samples whose class has no valid global logit (so it is off in round 1).

Uplink per client: (#classes held x C) logit entries (the C counts are not counted).
Downlink: the full C x C table. Evaluation: each client's own model.

Choices taken from the reference implementation (TsingZ0/HtFLlib ``clientfd.py``,
``serverfd.py``): D is the cross-entropy of f_k(x) against the soft target
softmax(\bar z^(y)) (``algo.distill='ce'``, HtFLlib's current version; ``'mse'`` gives
the squared error between the logits and \bar z^(y), averaged over classes), lamda = 1,
averaged over the batch with the dropped samples counting in its size; classes that no
client of the round sent are dropped from the global table. Differences: HtFLlib averages
the logits produced *during* local training and averages clients uniformly; here the
logits come from one extra pass over the client's train data with the trained model,
and clients are weighted by their class counts.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_het import clients as cl
from fedjax_het.algorithms import api
from fedjax_het.algorithms import rounds
from fedjax_het.algorithms.class_tables import class_stats
from fedjax_het.algorithms.class_tables import table_protocol
from fedjax_het.algorithms.shared import init_models

DISTILL = ("ce", "mse")


def fd(rt: api.Runtime, *, learning_rate: float, momentum: float = 0.0,
       weight_decay: float = 0.0, grad_clip: float = 0.0,
       lamda: float = 1.0, distill: str = "ce") -> api.Algorithm:
  """Builds FD.

  Args:
    rt: runtime (groups by architecture, C, E, B, devices).
    learning_rate, momentum: local SGD.
    weight_decay, grad_clip: coupled L2 and gradient-norm clipping (``api.sgd``).
    lamda: weight of the distillation term.
    distill: the distillation loss, one of ``DISTILL``.

  Returns:
    ``Algorithm``. ``state.clients[g]`` is a ``ClientState`` with the private params
    stacked [n_g, ...]; ``state.server`` = {'table': float32 [C, C] global per-class
    logits (row j: class j), 'valid': bool [C]}.
  """
  if distill not in DISTILL:
    raise ValueError(f"algo.distill={distill!r}; valid: {DISTILL}")
  num_classes = rt.layout.num_classes
  nets = init_models(rt, num_classes=num_classes)
  opt = api.sgd(learning_rate, momentum, weight_decay, grad_clip)

  def loss_fn(net, table):
    def fn(params, model_state, batch, rng):
      del rng
      logits, _ = net.apply({"params": params}, batch.x)
      loss = cl.cross_entropy(logits, batch.y, batch.mask)
      return loss + lamda * distill_loss(logits, batch.y, batch.mask, table, distill), \
          model_state
    return fn

  def predict(g, client, table):
    del table  # each client's own model
    return lambda x: nets[g].apply({"params": client.params}, x)[0]

  proto = table_protocol(rt, nets, opt, width=num_classes, loss_fn=loss_fn, uplink=uplink,
                         predict=predict)
  return rounds.from_protocol(rt, proto)


def distill_loss(logits, labels, mask, table, kind: str = "ce"):
  """Mean over the batch of D(logits_i, \bar z^(y_i)); 0 for classes without a target.

  Args:
    logits: [B, C]; labels int32 [B]; mask bool [B].
    table: {'table': [C, C], 'valid': bool [C]} global per-class logits.
    kind: 'ce' (soft-target cross-entropy against softmax(\bar z)) or 'mse'.
  """
  logits = logits.astype(jnp.float32)
  target = table["table"][labels]
  if kind == "ce":
    per = optax.softmax_cross_entropy(logits, jax.nn.softmax(target))
  else:
    per = jnp.mean(jnp.square(logits - target), axis=-1)
  keep = mask & table["valid"][labels]
  return jnp.sum(per * keep) / jnp.maximum(jnp.sum(mask), 1.0)


def uplink(net, params, data, idx, mask, rt: api.Runtime) -> dict:
  """What an FD client sends: its per-class average logits and class counts."""
  return class_stats(lambda x: net.apply({"params": params}, x)[0], data.x, data.y, idx,
                     mask, num_classes=rt.layout.num_classes, **rt.eval_options())


SPEC = api.Spec(lambda c, rt: fd(rt, **api.sgd_args(c), **c.algo),
                 api.hparams_of(fd), choices=dict(distill=DISTILL))
