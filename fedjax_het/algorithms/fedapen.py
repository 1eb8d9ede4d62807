r"""FedAPEN: mutual learning with an adaptive, learned ensemble of private and shared models.

Qin, Yang, Chen, Wang, Cui, Chen, Chen. "FedAPEN: Personalized Cross-silo Federated
Learning with Adaptability to Statistical Heterogeneity", KDD 2023.

Symbols (paper -> code):
- the shared model (``params['global']``, arch ``small_arch``, CNN-5-sized) and client
  k's private heterogeneous model (``params['local']``), as in FML (``mutual.MutualNets``).
- lambda_k in [0, 1]: the weight of the private model in the ensemble output
  y_ens = lambda_k * f_private(x) + (1 - lambda_k) * f_shared(x) (on logits);
  ``model_state`` is an ``ApenState`` holding lambda_k itself (0.5 at start).

One round of client k:
1. Download theta into the shared model.
2. Learning for adaptability: with both models fixed, lambda_k minimises
   CE(y_ens, y) on a held-out part of the local train data (the last
   ``holdout_fraction`` of the client's real train examples, a deterministic split),
   by SGD over minibatches of the held-out part (``lambda_steps`` passes, step
   ``lambda_learning_rate`` = 1e-3), lambda clipped to [0, 1] after every step, as the
   authors' code.
3. Learning for ensemble: on the remaining train examples both models take SGD steps on
   L_private = CE(p_private, y) + KL(p_shared || p_private)
               + CE(lambda y_private + (1 - lambda) sg(y_shared), y),
   L_shared  = CE(p_shared, y) + KL(p_private || p_shared)
               + CE(lambda sg(y_private) + (1 - lambda) y_shared, y),
   each KL target and each other model's ensemble term held fixed (sg = stop_gradient).
Server: example-weighted mean of the uploaded shared models (``mutual.average``).

Uplink: the shared model. Downlink: the shared model. lambda_k never leaves the client.
Evaluation: the ensemble of the client's private model and the server's latest theta,
mixed with the client's lambda_k.

Choices taken from the reference code (the authors' repository, ``learned_adaptive_mutual``
and ``learn_weight_for_inference``):

- Unit weights on CE, KL and ensemble CE in both losses (not FML's alpha/beta), and the
  ensemble mixes raw logits.
- lambda starts at 0.5 and is learned on held-out data with the models frozen: a raw
  weight, clipped to [0, 1] after each SGD step of lr 1e-3 on a minibatch (batch size
  B) of the held-out examples, as the reference. The held-out logits are computed once
  (the models are fixed) and walked in table order (the reference's loader order
  differs; no shuffle here).
- Held-out examples are not trained on in that round.
"""
from __future__ import annotations

import flax
import jax
import jax.numpy as jnp

from fedjax_het import clients as cl
from fedjax_het import models
from fedjax_het import sharding
from fedjax_het.algorithms import api
from fedjax_het.algorithms import rounds
from fedjax_het.algorithms.mutual import download
from fedjax_het.algorithms.mutual import kl_divergence
from fedjax_het.algorithms.mutual import make_nets
from fedjax_het.algorithms.mutual import mutual_protocol
from fedjax_het.algorithms.mutual import uplink
from fedjax_het.algorithms.shared import LOCAL_REP_DIM


@flax.struct.dataclass
class ApenState:
  """A FedAPEN client's state that SGD does not train (its ``ClientState.model_state``).

  Attributes:
    lam: lambda_k, float32 scalar in [0, 1] ([n_g] stacked in a group): the weight of
      the private model in the ensemble lambda_k * f_private + (1 - lambda_k) * f_shared
      (on logits); 0.5 at start, learned on held-out data every round
      (``learn_lambda``), never sent.
  """
  lam: jax.Array


def initial_state() -> ApenState:
  """A client's ``ApenState`` before its first round: lambda_k = 0.5 (the authors' code)."""
  return ApenState(lam=jnp.full((), 0.5, jnp.float32))


def ensemble(logits_l: jax.Array, logits_g: jax.Array, lam: jax.Array) -> jax.Array:
  """lambda * private + (1 - lambda) * shared logits."""
  return lam * logits_l.astype(jnp.float32) + (1 - lam) * logits_g.astype(jnp.float32)


def ensemble_losses(logits_l, logits_g, lam, labels, mask):
  """(L_private, L_shared) of the learning-for-ensemble step (module docstring)."""
  sg = jax.lax.stop_gradient
  loss_l = (cl.cross_entropy(logits_l, labels, mask)
            + kl_divergence(logits_g, logits_l, mask)
            + cl.cross_entropy(ensemble(logits_l, sg(logits_g), lam), labels, mask))
  loss_g = (cl.cross_entropy(logits_g, labels, mask)
            + kl_divergence(logits_l, logits_g, mask)
            + cl.cross_entropy(ensemble(sg(logits_l), logits_g, lam), labels, mask))
  return loss_l, loss_g


def holdout_split(idx: jax.Array, mask: jax.Array, fraction: float, batch_size: int):
  """Splits a client's padded train table into (train mask, held-out idx, held-out mask).

  The held-out examples are the last floor(fraction * n) real entries of the table (n
  real entries); they are gathered into a table of static length ``ceil(fraction *
  n_max)`` rounded up to ``batch_size``.

  Args:
    idx, mask: int32 / bool [n_max].

  Returns:
    (train mask bool [n_max], held-out idx int32 [h_max], held-out mask bool [h_max]).
  """
  n_max = idx.shape[0]
  n = jnp.sum(mask)
  h = jnp.floor(fraction * n).astype(jnp.int32)
  rank = jnp.cumsum(mask) - 1
  held = mask & (rank >= n - h)
  h_max = min(n_max, sharding.round_up(max(1, int(-(-fraction * n_max // 1))), batch_size))
  order = jnp.argsort(~held, stable=True)[:h_max]  # held-out entries first, in order
  return mask & ~held, idx[order], held[order]


def learn_lambda(lam: jax.Array, logits_l: jax.Array, logits_g: jax.Array,
                 labels: jax.Array, mask: jax.Array, *, steps: int, learning_rate: float,
                 batch_size: int) -> jax.Array:
  """Minibatch SGD on lambda for CE of the ensemble (models fixed), clipped to [0, 1].

  Args:
    lam: scalar lambda in [0, 1].
    logits_l, logits_g: [H, C] held-out logits of the private and shared models.
    labels, mask: [H]; ``H`` a multiple of ``batch_size``.
    steps: passes over the held-out minibatches.
    learning_rate: SGD step (1e-3 in the authors' code).
    batch_size: minibatch size; a batch of padding only is no step.

  Returns:
    the new lambda (unchanged when ``mask`` is all False).
  """
  batches = jax.tree.map(lambda a: a.reshape((-1, batch_size) + a.shape[1:]),
                         (logits_l, logits_g, labels, mask))

  def loss(lam, batch):
    bl, bg, by, bm = batch
    return cl.cross_entropy(ensemble(bl, bg, lam), by, bm)

  def step(lam, batch):
    new = jnp.clip(lam - learning_rate * jax.grad(loss)(lam, batch), 0.0, 1.0)
    return jnp.where(jnp.any(batch[3]), new, lam), None

  def one_pass(lam, _):
    return jax.lax.scan(step, lam, batches)[0], None
  return jax.lax.scan(one_pass, lam, None, length=steps)[0]


def fedapen(rt: api.Runtime, *, learning_rate: float, momentum: float = 0.0,
            weight_decay: float = 0.0, grad_clip: float = 0.0,
            small_arch: str = "cnn5", rep_dim: int = LOCAL_REP_DIM,
            holdout_fraction: float = 0.1, lambda_steps: int = 1,
            lambda_learning_rate: float = 1e-3) -> api.Algorithm:
  """Builds FedAPEN.

  Args:
    rt: runtime (groups by architecture, C, E, B, devices).
    learning_rate, momentum: SGD of both models.
    weight_decay, grad_clip: coupled L2 and gradient-norm clipping (``api.sgd``).
    small_arch, rep_dim: architecture and representation width of the shared model.
    holdout_fraction: part of each client's train data that lambda is learned on.
    lambda_steps, lambda_learning_rate: passes of minibatch SGD on lambda per round, and
      its step size.

  Returns:
    ``Algorithm``. ``state.clients[g].unpack().params`` = {'global': theta_k, 'local': omega_k},
    ``state.clients[g].model_state`` = ``ApenState(lam=lambda_k)``, stacked over
    the group's clients; ``state.server`` = theta.
  """
  if not 0.0 < holdout_fraction < 1.0:
    raise ValueError(f"algo.holdout_fraction={holdout_fraction} must be in (0, 1)")
  nets = make_nets(rt, small_arch=small_arch, rep_dim=rep_dim)
  opt = api.sgd(learning_rate, momentum, weight_decay, grad_clip)

  def loss_fn(net):
    def fn(params, model_state, batch, rng):
      del rng
      (logits_l, _), (logits_g, _) = net.forward(params, batch.x)
      lam = model_state.lam
      loss_l, loss_g = ensemble_losses(logits_l, logits_g, lam, batch.y, batch.mask)
      return loss_l + loss_g, model_state
    return fn

  def holdout_logits(net, params, data, idx, mask):
    def chunk(args):
      batch = cl.make_batch(data.x, data.y, *args, **rt.batch_options())
      (logits_l, _), (logits_g, _) = net.forward(params, batch.x)
      return logits_l.astype(jnp.float32), logits_g.astype(jnp.float32), batch.y
    chunks = (idx.reshape(-1, rt.batch_size), mask.reshape(-1, rt.batch_size))
    return jax.tree.map(lambda a: a.reshape((-1,) + a.shape[2:]), jax.lax.map(chunk, chunks))

  def client_update(g, client, theta, data, idx, mask, key):
    params, opt_state = api.download(rt, client.params, client.opt_state, {"global": theta})
    train_mask, hidx, hmask = holdout_split(idx, mask, holdout_fraction, rt.batch_size)
    logits_l, logits_g, labels = holdout_logits(nets[g], params, data, hidx, hmask)
    lam = learn_lambda(client.model_state.lam, logits_l, logits_g, labels, hmask,
                       steps=lambda_steps, learning_rate=lambda_learning_rate,
                       batch_size=rt.batch_size)
    r = cl.local_train(loss_fn(nets[g]), opt, params, ApenState(lam), opt_state,
                       data.x, data.y, idx, train_mask, key, **rt.train_options())
    new = api.ClientState(r.params, r.model_state, r.opt_state)
    return new, uplink(r.params), {"loss": r.loss}

  def predict(g, client, theta):
    params = download(client, theta)  # the server's latest theta
    lam = client.model_state.lam

    def fn(x):
      (logits_l, _), (logits_g, _) = nets[g].forward(params, x)
      return ensemble(logits_l, logits_g, lam)
    return fn

  proto = mutual_protocol(nets, opt, client_update, predict=predict,
                          trained_payload=api.own_upload,
                          model_state=initial_state())
  return rounds.from_protocol(rt, proto)


def weight(client: api.ClientState) -> jax.Array:
  """lambda_k in [0, 1] of a client state (any leading client axes)."""
  return client.model_state.lam


SPEC = api.Spec(
    lambda c, rt: fedapen(rt, **api.sgd_args(c), **c.algo),
    api.hparams_of(fedapen),
    choices=dict(small_arch=models.ArchitectureChoices()), averages=True)
