r"""A shared model beside a private one: what FML, FedKD and FedAPEN are built from.

In federated mutual learning (Shen et al., arXiv 2006.16765) and the methods built on it
(FedKD, Wu et al., Nat. Commun. 2022; FedAPEN, Qin et al., KDD 2023) each client k holds
a small shared homogeneous model theta (``params['global']``: FML's meme, FedKD's mentee)
and its private heterogeneous model omega_k (``params['local']``), trained together on
its data with a distillation term between them. The server keeps theta, sends it down
each round and aggregates what the clients send back.

- ``MutualNets``, ``make_nets``: the two networks of a client of one architecture.
- ``kl_divergence``: the distillation term, KL(q || p) with the teacher q held fixed.
- ``mutual_protocol``: the protocol (server state and downlink theta); ``uplink``,
  ``download``, ``average``, ``private_predict``, ``shared_predict``: its default parts.
- ``check_evaluate``: the ``algo.evaluate`` / ``algo.kl_reduction`` switches.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from fedjax_het import clients as cl
from fedjax_het import models
from fedjax_het.algorithms import api
from fedjax_het.algorithms.api import dummy_input
from fedjax_het.algorithms.shared import LOCAL_REP_DIM
from fedjax_het.algorithms.shared import weighted_average
from fedjax_het.data.sources import IMAGE_SHAPE


class MutualNets:
  """The shared small model and a client's private model, for one architecture.

  Attributes:
    small: the shared homogeneous model (arch ``small_arch``, width ``rep_dim``).
    large: the private heterogeneous model (width ``LOCAL_REP_DIM``).
  """

  def __init__(self, arch: str, *, small_arch: str, rep_dim: int, num_classes: int, dtype,
               image_shape: tuple[int, ...] = IMAGE_SHAPE):
    self.small = models.get_model(small_arch, num_classes=num_classes, rep_dim=rep_dim,
                                  dtype=dtype)
    self.large = models.get_model(arch, num_classes=num_classes, rep_dim=LOCAL_REP_DIM,
                                  dtype=dtype)
    self.image_shape = image_shape

  def init(self, key):
    """{'global': shared params, 'local': private params}."""
    k1, k2 = jax.random.split(key)
    x = dummy_input(self.image_shape)
    return {"global": self.small.init(k1, x)["params"],
            "local": self.large.init(k2, x)["params"]}

  def forward(self, params, x):
    """((local logits, local rep), (global logits, global rep)) of images [B, ...]."""
    logits_l, feats_l = self.large.apply({"params": params["local"]}, x)
    logits_g, feats_g = self.small.apply({"params": params["global"]}, x)
    return (logits_l, feats_l["rep"]), (logits_g, feats_g["rep"])


def make_nets(rt: api.Runtime, *, small_arch: str, rep_dim: int) -> list[MutualNets]:
  """One ``MutualNets`` per architecture group."""
  return [MutualNets(arch, small_arch=small_arch, rep_dim=rep_dim,
                     num_classes=rt.layout.num_classes, dtype=rt.compute_dtype,
                     image_shape=rt.layout.image_shape)
          for arch in rt.layout.archs]


KL_REDUCTIONS = ("batchmean", "mean")
EVALUATED = ("private", "shared")


def kl_divergence(target_logits: jax.Array, logits: jax.Array, mask: jax.Array,
                  reduction: str = "batchmean") -> jax.Array:
  r"""Masked mean of KL(q || p), q = softmax(target) held fixed.

  KL(q || p) = \sum_c q_c (\log q_c - \log p_c); the target receives no gradient.

  Args:
    target_logits: [B, C] logits of the teacher.
    logits: [B, C] logits of the student.
    mask: bool [B].
    reduction: ``'batchmean'``: the per-example KL averaged over examples (the KL
      itself; PyTorch's ``KLDivLoss(reduction='batchmean')``); ``'mean'``: averaged
      over examples and classes, i.e. divided by C (``KLDivLoss``'s default
      ``reduction='mean'``, which much PyTorch FL code uses).

  Returns:
    float32 scalar.
  """
  if reduction not in KL_REDUCTIONS:
    raise ValueError(f"kl reduction {reduction!r} is not one of {KL_REDUCTIONS}")
  log_q = jax.nn.log_softmax(jax.lax.stop_gradient(target_logits).astype(jnp.float32))
  log_p = jax.nn.log_softmax(logits.astype(jnp.float32))
  kl = cl.masked_mean(jnp.sum(jnp.exp(log_q) * (log_q - log_p), axis=-1), mask)
  return kl / logits.shape[-1] if reduction == "mean" else kl


def mutual_protocol(nets: list, opt, client_update: Callable, *,
                    server_aggregate: Callable | None = None, predict: Callable | None = None,
                    init_params: Callable | None = None, model_state=None,
                    trained_payload: Callable | None = None) -> api.Protocol:
  """The protocol of FML, FedKD and FedAPEN: a private model beside a shared one, theta.

  Server state and downlink: theta, the shared model's params (initialised like a
  client's 'global' part); a client downloads it into ``params['global']``.

  Args:
    client_update: ``Protocol.client_update`` (payload: theta).
    server_aggregate: ``Protocol.aggregate`` (default ``average``: the example-weighted
      mean of the uploaded theta_k).
    predict: ``Protocol.predict`` (default ``private_predict``: the private model alone).
    init_params: ``(group, key) -> params`` of a client (default ``nets[g].init``).
    model_state: every client's initial non-SGD state (FedAPEN's ``ApenState``), or None.
    trained_payload: ``Protocol.trained_payload`` (None: ``predict`` ignores theta).
  """
  init_params = init_params or (lambda g, key: nets[g].init(key))

  def init_client(g, key):
    params = init_params(g, key)
    return api.ClientState(params, model_state, opt.init(params))

  def init_server(rng):
    return nets[0].init(jax.random.fold_in(rng, 1 << 20))["global"]

  return api.Protocol(init_client, init_server, lambda theta, g: theta, client_update,
                       server_aggregate or average, predict or private_predict(nets),
                       trained_payload=trained_payload)


def download(client: api.ClientState, theta) -> dict:
  """The client's params with the shared model replaced by the server's theta."""
  return dict(client.params, **{"global": theta})


def average(theta, uploads, weights, train_key, server_data):
  """``Protocol.aggregate`` of FML and FedAPEN: theta <- sum_k n_k theta_k / sum_k n_k."""
  del theta, train_key, server_data
  return weighted_average(uploads, weights), {}


def private_predict(nets: list) -> Callable:
  """``Protocol.predict`` of the private model alone (FML, FedKD)."""
  def predict(g, client, theta):
    del theta
    return lambda x: nets[g].large.apply({"params": client.params["local"]}, x)[0]
  return predict


def shared_predict(nets: list, theta_of: Callable = lambda payload: payload) -> Callable:
  """``Protocol.predict`` of the shared model alone (``algo.evaluate='shared'``): the
  payload's theta (``theta_of(payload)``), the server's for protocol (a), the client's
  trained copy for protocol (b) (``trained_payload``)."""
  def predict(g, client, payload):
    del client
    return lambda x: nets[g].small.apply({"params": theta_of(payload)}, x)[0]
  return predict


def check_evaluate(evaluate: str, kl_reduction: str) -> None:
  """Raises ValueError for an ``algo.evaluate`` or ``algo.kl_reduction`` not offered."""
  if evaluate not in EVALUATED:
    raise ValueError(f"algo.evaluate={evaluate!r} must be one of {EVALUATED}")
  if kl_reduction not in KL_REDUCTIONS:
    raise ValueError(f"algo.kl_reduction={kl_reduction!r} must be one of {KL_REDUCTIONS}")


def uplink(params):
  """What a client sends by default: its trained copy theta_k of the shared model."""
  return params["global"]
