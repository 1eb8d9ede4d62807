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

The shared machinery here (``MutualNets``, ``kl_divergence``, ``init_state``,
``train_groups``, ``private_evaluate``) is reused by ``fedkd.py`` and ``fedapen.py``.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from fedjax_het import clients as cl
from fedjax_het import models
from fedjax_het.algorithms import base
from fedjax_het.algorithms import fedmrl
from fedjax_het.algorithms.standalone import dummy_input

LOCAL_REP_DIM = fedmrl.LOCAL_REP_DIM


class MutualNets:
  """The shared small model and a client's private model, for one architecture.

  Attributes:
    small: the shared homogeneous model (arch ``small_arch``, width ``rep_dim``).
    large: the private heterogeneous model (width ``LOCAL_REP_DIM``).
  """

  def __init__(self, arch: str, *, small_arch: str, rep_dim: int, num_classes: int, dtype):
    self.small = models.get_model(small_arch, num_classes=num_classes, rep_dim=rep_dim,
                                  dtype=dtype)
    self.large = models.get_model(arch, num_classes=num_classes, rep_dim=LOCAL_REP_DIM,
                                  dtype=dtype)

  def init(self, key):
    """{'global': shared params, 'local': private params}."""
    k1, k2 = jax.random.split(key)
    x = dummy_input()
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
                     num_classes=rt.layout.num_classes, dtype=rt.compute_dtype)
          for arch in rt.layout.archs]


def kl_divergence(target_logits: jax.Array, logits: jax.Array, mask: jax.Array) -> jax.Array:
  r"""Masked per-example mean of KL(q || p), q = softmax(target) held fixed.

  KL(q || p) = \sum_c q_c (\log q_c - \log p_c); the target receives no gradient.

  Args:
    target_logits: [B, C] logits of the teacher.
    logits: [B, C] logits of the student.
    mask: bool [B].

  Returns:
    float32 scalar.
  """
  log_q = jax.nn.log_softmax(jax.lax.stop_gradient(target_logits).astype(jnp.float32))
  log_p = jax.nn.log_softmax(logits.astype(jnp.float32))
  return cl.masked_mean(jnp.sum(jnp.exp(log_q) * (log_q - log_p), axis=-1), mask)


def mutual_losses(logits_l, logits_g, labels, mask, *, alpha: float, beta: float):
  """The two DML losses of FML: (L_local, L_meme), each with a fixed KL target."""
  loss_l = (alpha * cl.cross_entropy(logits_l, labels, mask)
            + (1 - alpha) * kl_divergence(logits_g, logits_l, mask))
  loss_g = (beta * cl.cross_entropy(logits_g, labels, mask)
            + (1 - beta) * kl_divergence(logits_l, logits_g, mask))
  return loss_l, loss_g


def init_state(rt: base.Runtime, nets: list, opt, rng, *, init_params=None,
               model_state=None) -> base.State:
  """State with every client's {'global', 'local', ...} params and the server's theta.

  Args:
    init_params: ``(group, key) -> params`` (default ``nets[g].init``).
    model_state: per-client non-SGD state (e.g. FedAPEN's lambda), or None.
  """
  init_params = init_params or (lambda g, key: nets[g].init(key))

  def init_group(g):
    def one(key):
      params = init_params(g, key)
      return base.ClientState(params, model_state, opt.init(params))
    return base.init_clients(rt, g, one, rng)
  theta = nets[0].init(jax.random.fold_in(rng, 1 << 20))["global"]
  clients = tuple(init_group(g) for g in range(rt.layout.num_groups))
  return base.State(jnp.zeros((), jnp.int32), rng, clients, theta)


def train_groups(rt: base.Runtime, state: base.State, data, train_client: Callable
                 ) -> list[base.GroupRound]:
  """Runs ``train_client(g, client, theta, data, idx, mask, key) -> (client, outputs)``.

  ``theta`` is the server's shared model, which every client downloads first.
  """
  sample_key, train_key = base.round_keys(state)
  results = []
  for g in range(rt.layout.num_groups):
    def client_fn(client, idx, mask, key, g=g):
      return train_client(g, client, state.server, data, idx, mask, key)
    results.append(base.train_group(rt, g, state.clients[g], data, sample_key, train_key,
                                    client_fn))
  return results


def download(client: base.ClientState, theta) -> dict:
  """The client's params with the shared model replaced by the server's theta."""
  return dict(client.params, **{"global": theta})


def average_round(state: base.State, results: list) -> tuple[base.State, dict]:
  """Server side shared by FML and FedAPEN: outputs are (theta_k, loss); theta is averaged."""
  new_theta = fedmrl.aggregate([r.outputs[0] for r in results], [r.weights for r in results])
  size = base.count_params(state.server)
  metrics = base.round_metrics(results, lambda o: o[1], uplink=size, downlink=size)
  return state.replace(round=state.round + 1, clients=tuple(r.clients for r in results),
                       server=new_theta), metrics


def private_evaluate(rt: base.Runtime, nets: list) -> Callable:
  """``Algorithm.evaluate`` of the private models alone (FML, FedKD)."""
  def evaluate(state, data):
    def predict(g, client, server):
      return lambda x: nets[g].large.apply({"params": client.params["local"]}, x)[0]
    return base.evaluate_groups(rt, state, data, predict)
  return evaluate


def fml(rt: base.Runtime, *, learning_rate: float, momentum: float = 0.0,
        alpha: float = 0.5, beta: float = 0.5, small_arch: str = "cnn5",
        rep_dim: int = LOCAL_REP_DIM) -> base.Algorithm:
  """Builds FML.

  Args:
    rt: runtime (groups by architecture, C, E, B, devices).
    learning_rate, momentum: SGD of both models.
    alpha: CE weight of the private model's loss (1 - alpha on KL from the meme).
    beta: CE weight of the meme's loss (1 - beta on KL from the private model).
    small_arch, rep_dim: architecture and representation width of the meme.

  Returns:
    ``Algorithm``. ``state.clients[g].params`` = {'global': meme_k, 'local': omega_k}
    stacked over the group's clients; ``state.server`` = the averaged meme.
  """
  for name, v in (("alpha", alpha), ("beta", beta)):
    if not 0.0 <= v <= 1.0:
      raise ValueError(f"algo.{name}={v} must be in [0, 1]")
  nets = make_nets(rt, small_arch=small_arch, rep_dim=rep_dim)
  opt = base.sgd(learning_rate, momentum)

  def loss_fn(net):
    def fn(params, model_state, batch, rng):
      del rng
      (logits_l, _), (logits_g, _) = net.forward(params, batch.x)
      loss_l, loss_g = mutual_losses(logits_l, logits_g, batch.y, batch.mask,
                                     alpha=alpha, beta=beta)
      return loss_l + loss_g, model_state
    return fn

  def train_client(g, client, theta, data, idx, mask, key):
    r = cl.local_train(loss_fn(nets[g]), opt, download(client, theta), None,
                       client.opt_state, data.x, data.y, idx, mask, key,
                       epochs=rt.local_epochs, batch_size=rt.batch_size,
                       dtype=rt.compute_dtype)
    return base.ClientState(r.params, None, r.opt_state), (fedmrl.uplink(r.params), r.loss)

  def round_fn(state, data):
    return average_round(state, train_groups(rt, state, data, train_client))

  return base.Algorithm(lambda rng: init_state(rt, nets, opt, rng), round_fn,
                        private_evaluate(rt, nets))


SPEC = base.Spec(
    lambda c, rt: fml(rt, **base.sgd_args(c), **c.algo),
    dict(alpha=0.5, beta=0.5, small_arch="cnn5", rep_dim=LOCAL_REP_DIM),
    choices=dict(small_arch=tuple(models.ARCHITECTURES)))
