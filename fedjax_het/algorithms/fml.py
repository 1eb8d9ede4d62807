r"""FML: federated mutual learning of a private model and a shared "meme" model.

Shen, Wang, Kuang, et al. "Federated Mutual Learning", arXiv 2006.16765 (2020).

Symbols (paper -> code):
- the meme model (shared, homogeneous; ``params['global']``, arch ``small_arch``,
  CNN-5-sized, representation width ``rep_dim``) and the private model of client k
  (heterogeneous; ``params['local']``).
- Local loss, deep mutual learning (DML) between the two on every minibatch:
  L_local = alpha * CE(p_local, y) + (1 - alpha) * KL(p_meme || p_local),
  L_meme  = beta  * CE(p_meme, y)  + (1 - beta)  * KL(p_local || p_meme);
  both models take one SGD step per minibatch on the sum L_local + L_meme, where the
  distillation target of each KL is held fixed (``stop_gradient``), as in DML.
- Server: example-weighted mean of the uploaded memes (``fedmrl.aggregate``).

Uplink: the meme's parameters. Downlink: the meme's parameters (downloaded into
``params['global']`` before local training). Evaluation: the private model alone.

Choices taken from the reference code (TsingZ0/HtFLlib ``clientfml.py``) and settled
where it and the paper differ:

- alpha = beta = 0.5 (the paper's setting; the reference exposes both as arguments).
- Both models use the same SGD learning rate (the reference builds two SGD optimizers
  with the client learning rate).
- KL is averaged per example (``batchmean``, the DML/FedAPEN convention). The reference's
  ``nn.KLDivLoss()`` uses reduction 'mean', which also divides by the number of classes,
  and lets the gradient flow into the target; we keep the paper's fixed target.
- The reference clips gradient norms at 10 "to prevent divergence"; we do not clip.

The shared machinery here (``MutualNets``, ``kl_divergence``, ``mutual_protocol``,
``download``, ``average``, ``private_predict``) is reused by ``fedkd.py`` and
``fedapen.py``; FML's and FedAPEN's round is ``fedavg.average_round``.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from fedjax_het import clients as cl
from fedjax_het import models
from fedjax_het.algorithms import base
from fedjax_het.algorithms import fedavg
from fedjax_het.algorithms import fedmrl
from fedjax_het.algorithms.standalone import dummy_input
from fedjax_het.data.sources import IMAGE_SHAPE

LOCAL_REP_DIM = fedmrl.LOCAL_REP_DIM


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


def make_nets(rt: base.Runtime, *, small_arch: str, rep_dim: int) -> list[MutualNets]:
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


def mutual_losses(logits_l, logits_g, labels, mask, *, alpha: float, beta: float,
                  kl_reduction: str = "batchmean"):
  """The two DML losses of FML: (L_local, L_meme), each with a fixed KL target."""
  loss_l = (alpha * cl.cross_entropy(logits_l, labels, mask)
            + (1 - alpha) * kl_divergence(logits_g, logits_l, mask, kl_reduction))
  loss_g = (beta * cl.cross_entropy(logits_g, labels, mask)
            + (1 - beta) * kl_divergence(logits_l, logits_g, mask, kl_reduction))
  return loss_l, loss_g


def mutual_protocol(nets: list, opt, client_update: Callable, *,
                    server_aggregate: Callable | None = None, predict: Callable | None = None,
                    init_params: Callable | None = None, model_state=None,
                    trained_payload: Callable | None = None) -> base.Protocol:
  """The protocol of FML, FedKD and FedAPEN: a private model beside a shared one, theta.

  Server state and downlink: theta, the shared model's params (initialised like a
  client's 'global' part); a client downloads it into ``params['global']``.

  Args:
    client_update: ``Protocol.client_update`` (payload: theta).
    server_aggregate: ``Protocol.aggregate`` (default ``average``: the example-weighted
      mean of the uploaded theta_k).
    predict: ``Protocol.predict`` (default ``private_predict``: the private model alone).
    init_params: ``(group, key) -> params`` of a client (default ``nets[g].init``).
    model_state: every client's initial non-SGD state (e.g. FedAPEN's lambda), or None.
    trained_payload: ``Protocol.trained_payload`` (None: ``predict`` ignores theta).
  """
  init_params = init_params or (lambda g, key: nets[g].init(key))

  def init_client(g, key):
    params = init_params(g, key)
    return base.ClientState(params, model_state, opt.init(params))

  def init_server(rng):
    return nets[0].init(jax.random.fold_in(rng, 1 << 20))["global"]

  return base.Protocol(init_client, init_server, lambda theta, g: theta, client_update,
                       server_aggregate or average, predict or private_predict(nets),
                       trained_payload=trained_payload)


def download(client: base.ClientState, theta) -> dict:
  """The client's params with the shared model replaced by the server's theta."""
  return dict(client.params, **{"global": theta})


def average(theta, uploads, weights, train_key, server_data):
  """``Protocol.aggregate`` of FML and FedAPEN: theta <- sum_k n_k theta_k / sum_k n_k."""
  del theta, train_key, server_data
  return fedmrl.aggregate(uploads, weights), {}


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


def fml(rt: base.Runtime, *, learning_rate: float, momentum: float = 0.0,
        weight_decay: float = 0.0, grad_clip: float = 0.0,
        alpha: float = 0.5, beta: float = 0.5, small_arch: str = "cnn5",
        rep_dim: int = LOCAL_REP_DIM, evaluate: str = "private",
        kl_reduction: str = "batchmean") -> base.Algorithm:
  """Builds FML.

  Args:
    rt: runtime (groups by architecture, C, E, B, devices).
    learning_rate, momentum: SGD of both models.
    weight_decay, grad_clip: coupled L2 and gradient-norm clipping (``base.sgd``).
    alpha: CE weight of the private model's loss (1 - alpha on KL from the meme).
    beta: CE weight of the meme's loss (1 - beta on KL from the private model).
    small_arch, rep_dim: architecture and representation width of the meme.
    evaluate: the model tested: ``'private'`` (the client's own, the paper's) or
      ``'shared'`` (the meme: the server's for protocol (a), the client's trained copy
      for (b)).
    kl_reduction: ``'batchmean'`` (the KL, the paper's) or ``'mean'`` (KL / C, as
      PyTorch's default ``KLDivLoss``) (``kl_divergence``).

  Returns:
    ``Algorithm``. ``state.clients[g].params`` = {'global': meme_k, 'local': omega_k}
    stacked over the group's clients; ``state.server`` = the averaged meme.
  """
  for name, v in (("alpha", alpha), ("beta", beta)):
    if not 0.0 <= v <= 1.0:
      raise ValueError(f"algo.{name}={v} must be in [0, 1]")
  check_evaluate(evaluate, kl_reduction)
  nets = make_nets(rt, small_arch=small_arch, rep_dim=rep_dim)
  opt = base.sgd(learning_rate, momentum, weight_decay, grad_clip)

  def loss_fn(net):
    def fn(params, model_state, batch, rng):
      del rng
      (logits_l, _), (logits_g, _) = net.forward(params, batch.x)
      loss_l, loss_g = mutual_losses(logits_l, logits_g, batch.y, batch.mask,
                                     alpha=alpha, beta=beta, kl_reduction=kl_reduction)
      return loss_l + loss_g, model_state
    return fn

  def client_update(g, client, theta, data, idx, mask, key):
    params, opt_state = base.download(rt, client.params, client.opt_state, {"global": theta})
    r = cl.local_train(loss_fn(nets[g]), opt, params, None, opt_state, data.x, data.y, idx,
                       mask, key,
                       **rt.train_options())
    return (base.ClientState(r.params, None, r.opt_state), fedmrl.uplink(r.params),
            {"loss": r.loss})

  proto = mutual_protocol(
      nets, opt, client_update,
      **(dict(predict=shared_predict(nets), trained_payload=base.own_upload)
         if evaluate == "shared" else {}))
  return base.Algorithm(base.protocol_init(rt, proto), fedavg.average_round(rt, proto),
                        base.protocol_evaluate(rt, proto), proto)


SPEC = base.Spec(
    lambda c, rt: fml(rt, **base.sgd_args(c), **c.algo),
    dict(alpha=0.5, beta=0.5, small_arch="cnn5", rep_dim=LOCAL_REP_DIM,
         evaluate="private", kl_reduction="batchmean"),
    choices=dict(small_arch=models.ArchitectureChoices(), evaluate=EVALUATED,
                 kl_reduction=KL_REDUCTIONS))
