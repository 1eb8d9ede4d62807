r"""FedMoE (pFedMoE): personalized federated learning via a heterogeneous mixture of experts.

Yi, Yu, Shi, Wang, Liu, Yu, Yuan. "pFedMoE: Data-Level Personalization with Mixture of
Experts for Model-Heterogeneous Personalized Federated Learning", arXiv 2402.01350.

Symbols (paper -> code):
- G(theta): the shared small homogeneous feature extractor, the *global expert*
  (``params['global_ex']``; CNN-5's extractor in the heterogeneous setting, last layer as
  wide as the local extractor's, 500).
- F_k(omega_k) = F_k^ex(omega_k^ex) o F_k^hd(omega_k^hd): client k's heterogeneous model;
  its extractor is the *local expert*, its header the prediction head (``params['local']``).
- H_k(phi_k): client k's gating network (``params['gate']`` and the batch statistics in
  ``model_state``): flatten -> switchable norm -> Linear(m) -> BN -> sigmoid -> Linear(2)
  -> BN -> softmax, giving [alpha_G, alpha_F] per sample.
- Per sample (Eq. 1-3): R_i = alpha_{i,G} G(x_i; theta) + alpha_{i,F} F_k^ex(x_i; omega_k^ex);
  y_hat_i = F_k^hd(R_i); loss = CE(y_hat_i, y_i). theta, omega_k and phi_k are updated
  together by SGD: eta_omega for theta and omega_k (the same rate), eta_phi for phi_k.
- Aggregation (Eq. 6): theta <- sum_k n_k theta_k / sum_k n_k.

Uplink: theta (the global expert) only. Downlink: theta. Inference uses the whole local
MoE (gate in eval mode, running batch statistics) with the server's latest theta, as the
reference implementation's evaluation does.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

from fedjax_het import clients as cl
from fedjax_het import models
from fedjax_het.algorithms import api
from fedjax_het.algorithms import rounds
from fedjax_het.algorithms.api import dummy_input
from fedjax_het.algorithms.shared import LOCAL_REP_DIM
from fedjax_het.algorithms.shared import weighted_average
from fedjax_het.data.sources import IMAGE_SHAPE


class FedMoENets:
  """The networks of a client of one architecture: global expert, local model, gate."""

  def __init__(self, arch: str, *, global_arch: str, gating_hidden: int, num_classes: int,
               dtype, image_shape: tuple[int, ...] = IMAGE_SHAPE):
    self.expert = models.get_extractor(global_arch, rep_dim=LOCAL_REP_DIM, dtype=dtype)
    self.local = models.get_model(arch, num_classes=num_classes, rep_dim=LOCAL_REP_DIM,
                                  dtype=dtype)
    self.gate = models.GatingNetwork(hidden=gating_hidden)
    self.image_shape = image_shape

  def init(self, key):
    """(params, model_state) of one client."""
    k1, k2, k3 = jax.random.split(key, 3)
    x = dummy_input(self.image_shape)
    gate_vars = self.gate.init(k3, jnp.zeros((2,) + tuple(self.image_shape)), train=False)
    params = {"global_ex": self.expert.init(k1, x)["params"],
              "local": self.local.init(k2, x)["params"],
              "gate": gate_vars["params"]}
    return params, {"gate": gate_vars["batch_stats"]}

  def gate_weights(self, params, model_state, x, train: bool, mask=None):
    """[alpha_G, alpha_F] per sample [B, 2] and the updated batch statistics.

    In training, ``mask`` [B] keeps padded examples out of the batch statistics.
    """
    variables = {"params": params["gate"], "batch_stats": model_state["gate"]}
    if train:
      w, new = self.gate.apply(variables, x, train=True, mask=mask, mutable=["batch_stats"])
      return w, {"gate": new["batch_stats"]}
    return self.gate.apply(variables, x, train=False), model_state

  def logits(self, params, model_state, x, train: bool, mask=None):
    """Eq. (1)-(3): header of the gated mixture of the two experts' representations."""
    w, model_state = self.gate_weights(params, model_state, x, train, mask)
    w = w.astype(x.dtype)
    rep_g = self.expert.apply({"params": params["global_ex"]}, x)[0]
    rep_f = models.extract(self.local, params["local"], x)
    mixed = w[:, :1] * rep_g + w[:, 1:] * rep_f
    return models.classify(self.local, params["local"], mixed), model_state


def optimizer(learning_rate: float, gating_learning_rate: float, momentum: float = 0.0,
              weight_decay: float = 0.0, grad_clip: float = 0.0):
  """SGD with eta_omega for both experts and the header, eta_phi for the gate.

  The gradient norm is clipped over all parameters at once (as PyTorch's
  ``clip_grad_norm_`` over the model), before the per-block SGD.
  """
  return optax.chain(
      api.clip(grad_clip),
      optax.multi_transform(
          {"model": api.sgd(learning_rate, momentum, weight_decay),
           "gate": api.sgd(gating_learning_rate, momentum, weight_decay)},
          lambda params: {k: jax.tree.map(lambda _, k=k: "gate" if k == "gate" else "model", v)
                          for k, v in params.items()}))


def fedmoe(rt: api.Runtime, *, learning_rate: float, momentum: float = 0.0,
           weight_decay: float = 0.0, grad_clip: float = 0.0,
           gating_learning_rate: float = 0.01, gating_hidden: int = 64,
           global_arch: str = "cnn5") -> api.Algorithm:
  """Builds FedMoE.

  Args:
    rt: runtime (groups by architecture, C, E, B, devices).
    learning_rate: eta_omega, for theta, omega_k.
    momentum: SGD momentum (0 in the paper).
    weight_decay, grad_clip: coupled L2 and gradient-norm clipping (``api.sgd``).
    gating_learning_rate: eta_phi, for the gate.
    gating_hidden: m, the width of the gate's hidden layer (``algo.gating_hidden``; the
      paper does not give it; 64 here, a public re-implementation uses 128).
    global_arch: architecture whose extractor is the global expert.

  Returns:
    ``Algorithm``; ``state.clients[g]`` holds {'global_ex', 'local', 'gate'} params and
    the gate's batch statistics, stacked over the group's clients; ``state.server``
    holds theta.
  """
  if gating_hidden < 1:
    raise ValueError(f"algo.gating_hidden={gating_hidden} must be >= 1")
  nets = [FedMoENets(arch, global_arch=global_arch, gating_hidden=gating_hidden,
                     num_classes=rt.layout.num_classes, dtype=rt.compute_dtype,
                     image_shape=rt.layout.image_shape)
          for arch in rt.layout.archs]
  opt = optimizer(learning_rate, gating_learning_rate, momentum, weight_decay, grad_clip)

  def init_client(g, key):
    params, model_state = nets[g].init(key)
    return api.ClientState(params, model_state, opt.init(params))

  def init_server(rng):
    return nets[0].init(jax.random.fold_in(rng, 1 << 20))[0]["global_ex"]

  def client_update(g, client, theta, data, idx, mask, key):
    params, opt_state = api.download(rt, client.params, client.opt_state,
                                      {"global_ex": theta})  # download theta
    r = cl.local_train(loss_fn(nets[g]), opt, params, client.model_state, opt_state,
                       data.x, data.y, idx, mask, key, **rt.train_options())
    new = api.ClientState(r.params, r.model_state, r.opt_state)
    return new, uplink(r.params), {"loss": r.loss}

  def server_aggregate(theta, uploads, weights, train_key, server_data):
    del theta, train_key, server_data
    return weighted_average(uploads, weights), {}  # Eq. (6)

  def predict(g, client, theta):
    params = dict(client.params, global_ex=theta)  # the server's latest theta
    return lambda x: nets[g].logits(params, client.model_state, x, train=False)[0]

  proto = api.Protocol(init_client, init_server, lambda theta, g: theta, client_update,
                        server_aggregate, predict, trained_payload=api.own_upload)

  return rounds.from_protocol(rt, proto)


def loss_fn(net: FedMoENets):
  """Eq. (1)-(3): CE of the header on the gated mixture, a ``clients.LossFn``.

  The gate trains in train mode (batch statistics of the real examples, ``batch.mask``).
  """
  def fn(params, model_state, batch, rng):
    del rng
    logits, model_state = net.logits(params, model_state, batch.x, train=True,
                                     mask=batch.mask)
    return cl.cross_entropy(logits, batch.y, batch.mask), model_state
  return fn


def test_gate_weights(rt: api.Runtime, state: api.State, data, *, gating_hidden: int = 64,
                      global_arch: str = "cnn5") -> list:
  """Per-sample gate weights on every client's test split, for analysis (paper Fig. 5).

  Args:
    rt, state, data: the runtime, a FedMoE state and its data.
    gating_hidden, global_arch: as given to ``fedmoe``.

  Returns:
    per group ``(weights [n_g, max_test, 2], labels [n_g, max_test], mask [n_g,
    max_test])``; padded entries have mask False.
  """
  out = []
  for g, arch in enumerate(rt.layout.archs):
    net = FedMoENets(arch, global_arch=global_arch, gating_hidden=gating_hidden,
                     num_classes=rt.layout.num_classes, dtype=rt.compute_dtype,
                     image_shape=rt.layout.image_shape)
    index = data.groups[g]

    def one(client, idx, net=net):
      x = cl.make_batch(data.x, data.y, idx, idx >= 0, **rt.batch_options()).x
      return net.gate_weights(client.params, client.model_state, x, train=False)[0]

    weights = jax.jit(lambda c, i, one=one: rounds.map_group(rt, one, c, i))(
        state.clients[g], index.test_idx)
    out.append((weights, data.y[index.test_idx], index.test_mask))
  return out


def uplink(params):
  """What a FedMoE client sends: its trained copy of the global expert theta_k."""
  return params["global_ex"]


SPEC = api.Spec(
    lambda c, rt: fedmoe(rt, **api.sgd_args(c), **c.algo),
    api.hparams_of(fedmoe),
    choices=dict(global_arch=models.ArchitectureChoices()), averages=True)
