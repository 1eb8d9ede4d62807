"""Standalone: every client trains its own model on its own data; nothing is sent.

The lower bound every MHPFL paper reports (e.g. pFedMoE, Yi et al. 2024, Table 2). Each
client k of architecture a(k) minimizes the cross-entropy of its private model
F_k(omega_k) on its local train split with SGD; the server does nothing.

Uplink: nothing. Downlink: nothing.
"""
from __future__ import annotations

import jax.numpy as jnp

from fedjax_het import clients as cl
from fedjax_het import models
from fedjax_het.algorithms import base
from fedjax_het.data.sources import IMAGE_SHAPE


def classifier_loss(model):
  """Cross-entropy loss of a ``models.CNN`` in the ``clients.LossFn`` signature."""
  def loss_fn(params, model_state, batch, rng):
    del rng
    logits, _ = model.apply({"params": params}, batch.x)
    return cl.cross_entropy(logits, batch.y, batch.mask), model_state
  return loss_fn


def init_models(rt: base.Runtime, *, num_classes: int):
  """One ``models.CNN`` per group, in the runtime's compute dtype."""
  return [models.get_model(arch, num_classes=num_classes, dtype=rt.compute_dtype)
          for arch in rt.layout.archs]


def dummy_input(image_shape: tuple[int, ...] = IMAGE_SHAPE):
  """A one-image batch float32 [1, H, W, C] for ``Module.init`` (``Runtime.dummy_input``)."""
  return jnp.zeros((1,) + tuple(image_shape), jnp.float32)


def private_client_init(nets, opt, image_shape: tuple[int, ...] = IMAGE_SHAPE):
  """``Protocol.init_client`` of a private CNN: its own params and optimizer state."""
  def init_client(g, key):
    params = nets[g].init(key, dummy_input(image_shape))["params"]
    return base.ClientState(params, None, opt.init(params))
  return init_client


def standalone(rt: base.Runtime, *, learning_rate: float, momentum: float = 0.0,
               weight_decay: float = 0.0, grad_clip: float = 0.0
               ) -> base.Algorithm:
  """Builds Standalone.

  Args:
    rt: runtime (groups, participation C, local epochs, batch size, devices).
    learning_rate, momentum: local SGD.
    weight_decay, grad_clip: coupled L2 and gradient-norm clipping (``base.sgd``).

  Returns:
    ``Algorithm``; ``state.clients[g]`` is a ``ClientState`` with the private params of
    group g stacked [n_g, ...]; ``state.server`` is empty.
  """
  nets = init_models(rt, num_classes=rt.layout.num_classes)
  opt = base.sgd(learning_rate, momentum, weight_decay, grad_clip)

  def client_update(g, client, payload, data, idx, mask, key):
    del payload  # nothing is downloaded
    r = cl.local_train(classifier_loss(nets[g]), opt, client.params, client.model_state,
                       client.opt_state, data.x, data.y, idx, mask, key,
                       **rt.train_options())
    return base.ClientState(r.params, r.model_state, r.opt_state), (), {"loss": r.loss}

  def server_aggregate(server, uploads, weights, train_key, server_data):
    del uploads, weights, train_key, server_data  # nothing was sent
    return server, {}

  def predict(g, client, payload):
    del payload
    return lambda x: nets[g].apply({"params": client.params}, x)[0]

  proto = base.Protocol(private_client_init(nets, opt, rt.layout.image_shape), lambda rng: (),
                        lambda server, g: (), client_update, server_aggregate, predict)

  def round_fn(state, data):
    results = base.train_protocol_groups(rt, proto, state, data)
    server, _ = base.aggregate_groups(proto, state, results)
    metrics = base.round_metrics(results, lambda o: o[1]["loss"], uplink=0, downlink=0)
    return state.replace(round=state.round + 1, clients=tuple(r.clients for r in results),
                         server=server), metrics

  return base.Algorithm(base.protocol_init(rt, proto), round_fn,
                        base.protocol_evaluate(rt, proto), proto)


SPEC = base.Spec(lambda c, rt: standalone(rt, **base.sgd_args(c)), {})
