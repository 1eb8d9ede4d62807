r"""LG-FedAvg: local representations, global header.

Liang, Liu, Ziyin, Allen, Auerbach, Brent, Salakhutdinov, Morency. "Think Locally, Act
Globally: Federated Learning with Local and Global Representations", arXiv 2001.01523
(2020).

Every client k keeps its own extractor F_ex(omega_k^ex) (any of CNN-1..5: the
representations all have width 500) and a copy of the global header theta_hd, a linear
layer 500 -> C with the same shape for every architecture.

- Client: downloads theta_hd into its model, runs E epochs of SGD on the cross-entropy of
  F_hd(F_ex(x)) over *all* its params (extractor and header together), and sends its
  trained header theta_k^hd up.
- Server: theta_hd <- sum_k n_k theta_k^hd / sum_k n_k over the round's clients of every
  architecture group (n_k: train examples).

Uplink: the header params. Downlink: the header params.

Choices taken from the reference implementation (TsingZ0/HtFLlib ``clientlg.py`` and
``serverlg.py``): the whole local model is trained (not only the extractor); the header
average is weighted by train-example counts; evaluation uses the client's extractor with
the latest global header (HtFLlib sends the header to every client before it evaluates).
Here the server starts from one freshly initialised header that all clients download at
their first round (HtFLlib lets clients start from their own heads).
"""
from __future__ import annotations

import jax

from fedjax_het import clients as cl
from fedjax_het.algorithms import api
from fedjax_het.algorithms import rounds
from fedjax_het.algorithms.shared import classifier_loss
from fedjax_het.algorithms.shared import init_models
from fedjax_het.algorithms.shared import private_client_init
from fedjax_het.algorithms.shared import weighted_average


def lg_fedavg(rt: api.Runtime, *, learning_rate: float, momentum: float = 0.0,
              weight_decay: float = 0.0, grad_clip: float = 0.0
              ) -> api.Algorithm:
  """Builds LG-FedAvg.

  Args:
    rt: runtime (groups by architecture, C, E, B, devices).
    learning_rate, momentum: local SGD over extractor and header.
    weight_decay, grad_clip: coupled L2 and gradient-norm clipping (``api.sgd``).

  Returns:
    ``Algorithm``. ``state.clients[g]`` is a ``ClientState`` whose params
    {'extractor', 'header'} are stacked [n_g, ...]; ``state.server`` is the global header
    {'fc': {'kernel': [500, C], 'bias': [C]}}.
  """
  nets = init_models(rt, num_classes=rt.layout.num_classes)
  opt = api.sgd(learning_rate, momentum, weight_decay, grad_clip)

  def init_server(rng):
    return nets[0].init(jax.random.fold_in(rng, 1 << 20), rt.dummy_input())["params"]["header"]

  def client_update(g, client, header, data, idx, mask, key):
    params, opt_state = api.download(rt, client.params, client.opt_state,
                                      {"header": header})  # download theta_hd
    r = cl.local_train(classifier_loss(nets[g]), opt, params, None, opt_state,
                       data.x, data.y, idx, mask, key, **rt.train_options())
    return api.ClientState(r.params, None, r.opt_state), uplink(r.params), {"loss": r.loss}

  def server_aggregate(header, uploads, weights, train_key, server_data):
    del header, train_key, server_data
    return weighted_average(uploads, weights), {}  # sum_k n_k theta_k^hd / sum_k n_k

  def predict(g, client, header):
    params = with_header(client.params, header)  # local extractor, global header
    return lambda x: nets[g].apply({"params": params}, x)[0]

  proto = api.Protocol(private_client_init(nets, opt, rt.layout.image_shape), init_server,
                        lambda header, g: header, client_update, server_aggregate, predict,
                        trained_payload=api.own_upload)
  return rounds.from_protocol(rt, proto)


def with_header(params, header):
  """A client's params with its header replaced by ``header``."""
  return dict(params, header=header)


def uplink(params):
  """What an LG-FedAvg client sends: its trained header (and nothing of its extractor)."""
  return params["header"]


SPEC = api.Spec(lambda c, rt: lg_fedavg(rt, **api.sgd_args(c)), {}, averages=True)
