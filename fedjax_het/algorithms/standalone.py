"""Standalone: every client trains its own model on its own data; nothing is sent.

The lower bound every MHPFL paper reports (e.g. pFedMoE, Yi et al. 2024, Table 2). Each
client k of architecture a(k) minimizes the cross-entropy of its private model
F_k(omega_k) on its local train split with SGD; the server does nothing.

Uplink: nothing. Downlink: nothing.
"""
from __future__ import annotations

from fedjax_het import clients as cl
from fedjax_het.algorithms import api
from fedjax_het.algorithms import rounds
from fedjax_het.algorithms.shared import classifier_loss
from fedjax_het.algorithms.shared import init_models
from fedjax_het.algorithms.shared import private_client_init


def standalone(rt: api.Runtime, *, learning_rate: float, momentum: float = 0.0,
               weight_decay: float = 0.0, grad_clip: float = 0.0
               ) -> api.Algorithm:
  """Builds Standalone.

  Args:
    rt: runtime (groups, participation C, local epochs, batch size, devices).
    learning_rate, momentum: local SGD.
    weight_decay, grad_clip: coupled L2 and gradient-norm clipping (``api.sgd``).

  Returns:
    ``Algorithm``; ``state.clients[g]`` is a ``ClientState`` with the private params of
    group g stacked [n_g, ...]; ``state.server`` is empty.
  """
  nets = init_models(rt, num_classes=rt.layout.num_classes)
  opt = api.sgd(learning_rate, momentum, weight_decay, grad_clip)

  def client_update(g, client, payload, data, idx, mask, key):
    del payload  # nothing is downloaded
    r = cl.local_train(classifier_loss(nets[g]), opt, client.params, client.model_state,
                       client.opt_state, data.x, data.y, idx, mask, key,
                       **rt.train_options())
    return api.ClientState(r.params, r.model_state, r.opt_state), (), {"loss": r.loss}

  def server_aggregate(server, uploads, weights, train_key, server_data):
    del uploads, weights, train_key, server_data  # nothing was sent
    return server, {}

  def predict(g, client, payload):
    del payload
    return lambda x: nets[g].apply({"params": client.params}, x)[0]

  proto = api.Protocol(private_client_init(nets, opt, rt.layout.image_shape), lambda rng: (),
                        lambda server, g: (), client_update, server_aggregate, predict)
  # the averaging round with an empty server: both links count 0 parameters
  return rounds.from_protocol(rt, proto)


SPEC = api.Spec(lambda c, rt: standalone(rt, **api.sgd_args(c)), {})
