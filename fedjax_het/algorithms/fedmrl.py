r"""FedMRL: federated model-heterogeneous Matryoshka representation learning.

Yi, Yu, Wang, Liu, Yuan, Yu. "Federated Model Heterogeneous Matryoshka Representation
Learning", NeurIPS 2024 (arXiv 2406.00488).

Symbols (paper -> code):
- G(theta) = G_ex(theta_ex) o G_hd(theta_hd): the shared small homogeneous model
  (``params['global']``; CNN-5-sized, representation width d1 = ``d1``).
- F_k(omega_k) = F_ex(omega_k^ex) o F_hd(omega_k^hd): client k's private heterogeneous
  model (``params['local']``; representation width d2 = 500).
- P_k(phi_k): the personal linear projector R^{d1+d2} -> R^{d2} (``params['proj']``).
- Eq. (1) adaptive representation fusion: R_i = P_k(concat(G_ex(x_i), F_ex(x_i))).
- Eq. (2) Matryoshka representations: R_i^lc = R_i[:d1] (coarse, into G_hd),
  R_i^hf = R_i[:d2] (fine, all of it, into F_hd).
- Eq. (3) loss: l = m_lc * CE(G_hd(R^lc), y) + m_hf * CE(F_hd(R^hf), y), m = 1 by default;
  theta, omega_k and phi_k are updated together by SGD with one learning rate.
- Eq. (4) aggregation: theta <- sum_k n_k theta_k / sum_k n_k over the round's clients
  (``aggregation='paper'``). The authors' code (LipingYi/FedMRL
  ``experiments/FLHetero/FedMRL_hetero.py``) stores each sampled client's small model as
  ``net_small.state_dict()`` without a copy, so every stored entry aliases the one
  network and its weighted "average" is the *last* sampled client's trained small
  model: ``aggregation='last_client'`` reproduces that (the last client of the round's
  random sampling order, i.e. one of the sampled clients drawn uniformly with the
  round's key), so published numbers can be compared under both.
- P_k is initialised as PyTorch's ``nn.Linear`` (weight and bias U(+-1/sqrt(d1 + d2))),
  as the authors' code builds it.

Uplink: theta (the whole small model) only. Downlink: theta.

Inference (paper, Appendix): ``mix-large`` F_hd(R) (default; as the reference code
evaluates), ``mix-small`` G_hd(R[:d1]), ``single-large`` F_k alone, ``single-small`` G alone.
Evaluation combines the client's omega_k, phi_k with the server's latest theta, as the
public reference implementation (TsingZ0/HtFLlib ``clientMRL.test_metrics``) does.

Ablation ``use_mrl=False`` ("w/o MRL"): no nesting. The projector outputs d1 + d2 dims and
the two headers read disjoint slices, G_hd(R[:d1]) and F_hd(R[d1:]).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from fedjax_het import clients as cl
from fedjax_het import models
from fedjax_het.algorithms import api
from fedjax_het.algorithms import rounds
from fedjax_het.algorithms.api import dummy_input
from fedjax_het.algorithms.shared import LOCAL_REP_DIM
from fedjax_het.algorithms.shared import weighted_average
from fedjax_het.data.sources import IMAGE_SHAPE
from fedjax_het.models.cnn import torch_bias_init
from fedjax_het.models.cnn import torch_kernel_init

INFERENCE = ("mix-large", "mix-small", "single-large", "single-small")
AGGREGATION = ("paper", "last_client")


class FedMRLNets:
  """The three networks of a client of one architecture and their forward passes.

  Attributes:
    small: the shared homogeneous model G (arch ``small_arch``, width d1).
    large: the client's heterogeneous model F_k (width d2).
    proj: the projector P_k.
  """

  def __init__(self, arch: str, *, small_arch: str, d1: int, num_classes: int,
               use_mrl: bool, dtype, image_shape: tuple[int, ...] = IMAGE_SHAPE):
    make = lambda a, rep_dim, dt: models.get_model(  # noqa: E731
        a, num_classes=num_classes, rep_dim=rep_dim, dtype=dt)
    self.small = make(small_arch, d1, dtype)
    self.large = make(arch, LOCAL_REP_DIM, dtype)
    # The projector and the two heads on the fused representation compute in float32
    # whatever ``dtype`` (same parameters; the heads' copies differ only in dtype): small
    # layers, kept in float32 as mixed precision keeps a network's last layers
    # (docs/performance.md has the bf16 check).
    self.small_head = make(small_arch, d1, jnp.float32)
    self.large_head = make(arch, LOCAL_REP_DIM, jnp.float32)
    self.d1, self.use_mrl, self.image_shape = d1, use_mrl, image_shape
    width = LOCAL_REP_DIM if use_mrl else d1 + LOCAL_REP_DIM
    self.proj = nn.Dense(width, dtype=jnp.float32, kernel_init=torch_kernel_init,
                         bias_init=torch_bias_init(d1 + LOCAL_REP_DIM))

  def init(self, key):
    k1, k2, k3 = jax.random.split(key, 3)
    x = dummy_input(self.image_shape)
    return {"global": self.small.init(k1, x)["params"],
            "local": self.large.init(k2, x)["params"],
            "proj": self.proj.init(k3, jnp.zeros((1, self.d1 + LOCAL_REP_DIM)))["params"]}

  def fused(self, params, x):
    """Eq. (1): R = P(concat(G_ex(x), F_ex(x))) [B, d2] (or [B, d1 + d2] w/o MRL)."""
    rep_g = models.extract(self.small, params["global"], x)
    rep_f = models.extract(self.large, params["local"], x)
    rep = jnp.concatenate([rep_g, rep_f], -1).astype(jnp.float32)
    return self.proj.apply({"params": params["proj"]}, rep)

  def heads(self, params, rep):
    """Eq. (2): (G_hd(R^lc), F_hd(R^hf)) logits."""
    small_in = rep[:, :self.d1]
    large_in = rep if self.use_mrl else rep[:, self.d1:]
    return (models.classify(self.small_head, params["global"], small_in),
            models.classify(self.large_head, params["local"], large_in))

  def predict(self, params, x, inference: str):
    """Logits of one of the ``INFERENCE`` modes."""
    if inference == "single-small":
      return self.small.apply({"params": params["global"]}, x)[0]
    if inference == "single-large":
      return self.large.apply({"params": params["local"]}, x)[0]
    small, large = self.heads(params, self.fused(params, x))
    return large if inference == "mix-large" else small


def fedmrl(rt: api.Runtime, *, learning_rate: float, momentum: float = 0.0,
           weight_decay: float = 0.0, grad_clip: float = 0.0, d1: int = 100,
           small_arch: str = "cnn5", m_lc: float = 1.0, m_hf: float = 1.0,
           use_mrl: bool = True, inference: str = "mix-large",
           aggregation: str = "paper") -> api.Algorithm:
  """Builds FedMRL.

  Args:
    rt: runtime (groups by architecture, C, E, B, devices).
    learning_rate, momentum: SGD for theta, omega_k and phi_k alike.
    weight_decay, grad_clip: coupled L2 and gradient-norm clipping (``api.sgd``).
    d1: representation width of the shared small model (paper: 100..500).
    small_arch: architecture of the shared small model (CNN-5 in the paper).
    m_lc, m_hf: loss weights of Eq. (3).
    use_mrl: False gives the "w/o MRL" ablation.
    inference: one of ``INFERENCE``.
    aggregation: 'paper' (Eq. 4) or 'last_client' (the authors' code; module docstring).

  ``d1``, ``inference`` and ``aggregation`` are checked with the config, before any
  compute (``check``, the ``Spec``'s hook); a factory call does not check them again.

  Returns:
    ``Algorithm``. ``state.clients[g].unpack().params`` = {'global': theta_k, 'local': omega_k,
    'proj': phi_k} stacked over the group's clients; ``state.server`` = theta.
  """
  nets = [FedMRLNets(arch, small_arch=small_arch, d1=d1, num_classes=rt.layout.num_classes,
                     use_mrl=use_mrl, dtype=rt.compute_dtype,
                     image_shape=rt.layout.image_shape) for arch in rt.layout.archs]
  opt = api.sgd(learning_rate, momentum, weight_decay, grad_clip)

  def init_client(g, key):
    params = nets[g].init(key)
    return api.ClientState(params, None, opt.init(params))

  def init_server(rng):
    return nets[0].init(jax.random.fold_in(rng, 1 << 20))["global"]

  def client_update(g, client, theta, data, idx, mask, key):
    params, opt_state = api.download(rt, client.params, client.opt_state, {"global": theta})
    r = cl.local_train(loss_fn(nets[g], m_lc=m_lc, m_hf=m_hf), opt, params, None,
                       opt_state, data.x, data.y, idx, mask, key, **rt.train_options())
    return api.ClientState(r.params, None, r.opt_state), uplink(r.params), {"loss": r.loss}

  def server_aggregate(theta, uploads, weights, train_key, server_data):
    del theta, server_data
    if aggregation == "last_client":
      return last_client(uploads, weights, train_key), {}
    return weighted_average(uploads, weights), {}  # Eq. (4)

  def predict(g, client, theta):
    params = dict(client.params, **{"global": theta})  # latest theta, as the reference
    return lambda x: nets[g].predict(params, x, inference)

  proto = api.Protocol(init_client, init_server, lambda theta, g: theta, client_update,
                        server_aggregate, predict, trained_payload=api.own_upload)

  return rounds.from_protocol(rt, proto)


def loss_fn(net: FedMRLNets, *, m_lc: float = 1.0, m_hf: float = 1.0):
  """Eq. (3), l = m_lc CE(G_hd(R^lc), y) + m_hf CE(F_hd(R^hf), y), a ``clients.LossFn``."""
  def fn(params, model_state, batch, rng):
    del rng
    small, large = net.heads(params, net.fused(params, batch.x))
    loss = (m_lc * cl.cross_entropy(small, batch.y, batch.mask)
            + m_hf * cl.cross_entropy(large, batch.y, batch.mask))
    return loss, model_state
  return fn


def uplink(params):
  """What a FedMRL client sends: its trained copy of the shared small model theta_k."""
  return params["global"]


def last_client(uploads: list, weights: list, key: jax.Array):
  """theta of one sampled client, drawn uniformly with ``key`` (the authors' aggregation).

  Args:
    uploads: per group, the uploaded theta_k stacked [slots_g, ...].
    weights: per group, float32 [slots_g] (0 on padding slots).
    key: the round's key.
  """
  stacked = jax.tree.map(lambda *a: jnp.concatenate(a), *uploads)
  real = jnp.concatenate(weights) > 0
  scores = jnp.where(real, jax.random.uniform(jax.random.fold_in(key, 7), real.shape), -1.0)
  return jax.tree.map(lambda a: a[jnp.argmax(scores)], stacked)


def check(config) -> None:
  """The values of ``config.algo`` FedMRL cannot run, raised before any compute.

  ``fedjax_het.validation.validate`` calls it (``Spec.check``) after the ``choices``.
  """
  algo = lambda key: config.algo.get(key, SPEC.hparams[key])  # noqa: E731
  inference, aggregation, d1 = algo("inference"), algo("aggregation"), algo("d1")
  if inference not in INFERENCE:
    raise ValueError(f"algo.inference={inference!r}; valid: {INFERENCE}")
  if aggregation not in AGGREGATION:
    raise ValueError(f"algo.aggregation={aggregation!r}; valid: {AGGREGATION}")
  if not 1 <= d1 <= LOCAL_REP_DIM:
    raise ValueError(f"algo.d1={d1} must be in [1, {LOCAL_REP_DIM}]")


SPEC = api.Spec(
    lambda c, rt: fedmrl(rt, **api.sgd_args(c), **c.algo),
    api.hparams_of(fedmrl),
    choices=dict(inference=INFERENCE, small_arch=models.ArchitectureChoices(),
                 aggregation=AGGREGATION),
    check=check, averages=True)
