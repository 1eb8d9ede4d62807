"""Standalone: every client trains its own model on its own data; nothing is sent.

The lower bound every MHPFL paper reports (e.g. pFedMoE, Yi et al. 2024, Table 2). Each
client k of architecture a(k) minimizes the cross-entropy of its private model
F_k(omega_k) on its local train split with SGD; the server does nothing.

Uplink: nothing. Downlink: nothing.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from fedjax_het import clients as cl
from fedjax_het import models
from fedjax_het.algorithms import base


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


def dummy_input():
  """A one-image batch for ``Module.init``."""
  return jnp.zeros((1, 32, 32, 3), jnp.float32)


def init_private_clients(rt: base.Runtime, nets, opt, rng: jax.Array) -> tuple:
  """Every group's stacked ``ClientState``: its own CNN's params and optimizer state."""
  def init_group(g):
    def one(key):
      params = nets[g].init(key, dummy_input())["params"]
      return base.ClientState(params, None, opt.init(params))
    return base.init_clients(rt, g, one, rng)
  return tuple(init_group(g) for g in range(rt.layout.num_groups))


def standalone(rt: base.Runtime, *, learning_rate: float, momentum: float = 0.0
               ) -> base.Algorithm:
  """Builds Standalone.

  Args:
    rt: runtime (groups, participation C, local epochs, batch size, devices).
    learning_rate, momentum: local SGD.

  Returns:
    ``Algorithm``; ``state.clients[g]`` is a ``ClientState`` with the private params of
    group g stacked [n_g, ...]; ``state.server`` is empty.
  """
  nets = init_models(rt, num_classes=rt.layout.num_classes)
  opt = base.sgd(learning_rate, momentum)

  def init(rng):
    clients = init_private_clients(rt, nets, opt, rng)
    return base.State(jnp.zeros((), jnp.int32), rng, clients, ())

  def round_fn(state, data):
    sample_key, train_key = base.round_keys(state)
    results = []
    for g in range(rt.layout.num_groups):
      loss_fn = classifier_loss(nets[g])

      def client_fn(client, idx, mask, key, loss_fn=loss_fn):
        r = cl.local_train(loss_fn, opt, client.params, client.model_state, client.opt_state,
                           data.x, data.y, idx, mask, key, epochs=rt.local_epochs,
                           batch_size=rt.batch_size, dtype=rt.compute_dtype)
        return base.ClientState(r.params, r.model_state, r.opt_state), r.loss

      results.append(base.train_group(rt, g, state.clients[g], data, sample_key,
                                      train_key, client_fn))
    metrics = base.round_metrics(results, lambda loss: loss, uplink=0, downlink=0)
    new = state.replace(round=state.round + 1, clients=tuple(r.clients for r in results))
    return new, metrics

  def evaluate(state, data):
    def predict(g, client, server):
      return lambda x: nets[g].apply({"params": client.params}, x)[0]
    return base.evaluate_groups(rt, state, data, predict)

  return base.Algorithm(init, round_fn, evaluate)


SPEC = base.Spec(lambda c, rt: standalone(rt, **base.sgd_args(c)), {})
