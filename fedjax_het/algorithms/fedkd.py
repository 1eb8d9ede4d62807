r"""FedKD: communication-efficient federated learning via adaptive mutual distillation.

Wu, Wu, Lyu, Qi, Huang, Xie. "Communication-efficient federated learning via knowledge
distillation", Nature Communications 13, 2032 (2022) (arXiv 2108.13323).

Symbols (paper -> code):
- the mentee (shared small model; ``params['global']``, arch ``small_arch``, width
  ``rep_dim``), the mentor of client k (private heterogeneous model; ``params['local']``,
  width 500) and W_h, the linear map of the mentee's hidden representation to the
  mentor's width (``params['proj']``, private, no bias).
- Adaptive mutual distillation (paper Eqs. 1-6), with t = mentor, s = mentee and
  D = L_t^task + L_s^task:
  L_t = CE_t + (KL(p_s || p_t) + L_h) / D,  L_s = CE_s + (KL(p_t || p_s) + L_h) / D,
  L_h = MSE(h_t, W_h h_s). All parameters take one SGD step per minibatch on L_t + L_s.
- Client upload: the mentee's update g_k = theta_k - theta, SVD-compressed (each weight
  matrix keeps its top singular values holding a fraction T of the squared spectrum).
  The energy threshold is annealed over the rounds as the paper's dynamic gradient
  approximation: T(t) = T_start + (T_end - T_start) * t / R after t of R rounds
  (``svd_energy_start`` 0.95 -> ``svd_energy_end`` 0.98 by default, the paper's values;
  ``svd_energy_start=0`` sends updates uncompressed).
- Server: g = sum_k n_k g_k / sum_k n_k over the round's clients (``weighted_average``),
  compressed the same way for the downlink; theta <- theta + g.

Uplink: the (compressed) mentee update; ``uplink_params`` counts the parameters sent:
r (m + n + 1) for a rank-r factorisation of an m x n matrix when that is smaller than
m n, every scalar otherwise. Downlink: the compressed aggregated update, counted alike.
Evaluation: the mentor (private model) alone (``evaluate='private'``).

Choices taken from the reference code (TsingZ0/HtFLlib ``clientkd.py``/``serverkd.py``)
and settled where the paper leaves them open:

- The hidden loss always goes through W_h (a bias-free linear layer, trained with the
  client's learning rate like both models), appears in both models' losses, and is a
  mean over examples and features (``nn.MSELoss``).
- Mentor and mentee share one SGD learning rate.
- KL is per-example (``batchmean``) with the teacher's prediction held fixed, and D is a
  fixed (``stop_gradient``) scale, so the adaptive weight only rescales the
  distillation gradients; the reference lets gradients flow through both.
- Weight tensors with more than two axes (5x5 kernels [5, 5, C_in, C_out]) are
  compressed as the matrix [5*5*C_in, C_out]; biases are sent whole. The energy is
  annealed from T_start to T_end over the run's rounds, as the reference does; the
  server keeps the round count (``state.server['round']``) and sends the round's T with
  theta.
- The reference averages uniformly over clients; we weight by example counts like every
  other algorithm here.
- Gradients are clipped at the run's ``grad_clip`` like every method here (the
  papers' protocol: 50; the reference clips at norm 10).
- Two switches for comparing with other implementations, defaults the paper's:
  ``evaluate`` (the mentor, or ``'shared'``: the mentee, the server's theta for
  protocol (a) and the client's compressed trained copy for (b)) and ``kl_reduction``
  (``'mean'``: KL / C, as PyTorch's default ``KLDivLoss(reduction='mean')``).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import linen as nn

from fedjax_het import clients as cl
from fedjax_het import models
from fedjax_het.algorithms import api
from fedjax_het.algorithms import rounds
from fedjax_het.algorithms.mutual import EVALUATED
from fedjax_het.algorithms.mutual import KL_REDUCTIONS
from fedjax_het.algorithms.mutual import check_evaluate
from fedjax_het.algorithms.mutual import kl_divergence
from fedjax_het.algorithms.mutual import make_nets
from fedjax_het.algorithms.mutual import mutual_protocol
from fedjax_het.algorithms.mutual import shared_predict
from fedjax_het.algorithms.shared import LOCAL_REP_DIM
from fedjax_het.algorithms.shared import weighted_average
from fedjax_het.models.cnn import torch_kernel_init


def svd_compress(a: jax.Array, energy: float) -> tuple[jax.Array, jax.Array]:
  r"""Truncated SVD of a matrix keeping a fraction ``energy`` of \sum_i s_i^2.

  The rank r is the smallest with \sum_{i<r} s_i^2 >= energy \sum_i s_i^2. When the
  factors (U_r [m, r], s_r [r], V_r [r, n]) are not smaller than the matrix, the matrix
  itself is sent.

  Args:
    a: [m, n] matrix.
    energy: fraction in (0, 1].

  Returns:
    (what the receiver reconstructs [m, n], parameters sent as float32 scalar).

  >>> a = jnp.outer(jnp.arange(1., 7.), jnp.arange(1., 6.))  # rank 1, 6 x 5
  >>> recon, sent = svd_compress(a, 0.99)
  >>> float(sent)  # 1 * (6 + 5 + 1)
  12.0
  """
  m, n = a.shape
  u, s, vt = jnp.linalg.svd(a.astype(jnp.float32), full_matrices=False)
  e = jnp.square(s)
  frac = jnp.cumsum(e) / jnp.maximum(jnp.sum(e), 1e-30)
  rank = jnp.minimum(1 + jnp.sum(frac < energy), s.shape[0])
  kept = jnp.where(jnp.arange(s.shape[0]) < rank, s, 0.0)
  recon = (u * kept) @ vt
  factored = rank * (m + n + 1)
  small = factored < m * n
  return (jnp.where(small, recon, a).astype(a.dtype),
          jnp.where(small, factored, m * n).astype(jnp.float32))


def energy_at(round_: jax.Array, start: float, end: float, num_rounds: int) -> jax.Array:
  """T of the round after ``round_`` completed rounds: start -> end linearly over R rounds.

  As HtFLlib's ``serverkd``: the first round uses T_start, and after round i (from 0)
  T = T_start + (i + 1) / R * (T_end - T_start).
  """
  t = jnp.minimum(round_, num_rounds).astype(jnp.float32)
  return start + (end - start) * t / max(num_rounds, 1)


def compress_tree(tree, energy: float | jax.Array):
  """``svd_compress`` on every leaf with >= 2 axes (as [prod(shape[:-1]), shape[-1]]).

  Returns:
    (reconstructed tree, parameters sent as float32 scalar). A Python ``energy <= 0``:
    the tree itself and its size (a traced energy always compresses).
  """
  if not isinstance(energy, jax.Array) and energy <= 0:
    return tree, jnp.asarray(api.count_params(tree), jnp.float32)

  def one(a):
    if a.ndim < 2:
      return a, jnp.asarray(a.size, jnp.float32)
    recon, sent = svd_compress(a.reshape(-1, a.shape[-1]), energy)
    return recon.reshape(a.shape), sent

  leaves, treedef = jax.tree.flatten(tree)
  out = [one(a) for a in leaves]
  return jax.tree.unflatten(treedef, [o[0] for o in out]), sum(o[1] for o in out)


def distillation_losses(logits_t, rep_t, logits_s, rep_s, w_h, labels, mask,
                        kl_reduction: str = "batchmean"):
  """Adaptive mutual + hidden distillation: (L_mentor, L_mentee) (module docstring).

  Args:
    logits_t, rep_t: mentor logits [B, C] and representation [B, d_t].
    logits_s, rep_s: mentee logits [B, C] and representation [B, d_s].
    w_h: [d_s, d_t] map of the mentee's representation to the mentor's width.
    labels, mask: [B].
    kl_reduction: ``kl_divergence``'s reduction.
  """
  ce_t = cl.cross_entropy(logits_t, labels, mask)
  ce_s = cl.cross_entropy(logits_s, labels, mask)
  scale = 1.0 / jnp.maximum(jax.lax.stop_gradient(ce_t + ce_s), 1e-6)
  diff = rep_t.astype(jnp.float32) - rep_s.astype(jnp.float32) @ w_h
  hidden = cl.masked_mean(jnp.mean(jnp.square(diff), axis=-1), mask)
  loss_t = ce_t + scale * (kl_divergence(logits_s, logits_t, mask, kl_reduction)
                           + hidden)
  loss_s = ce_s + scale * (kl_divergence(logits_t, logits_s, mask, kl_reduction)
                           + hidden)
  return loss_t, loss_s


def fedkd(rt: api.Runtime, *, learning_rate: float, momentum: float = 0.0,
          weight_decay: float = 0.0, grad_clip: float = 0.0,
          small_arch: str = "cnn5", rep_dim: int = LOCAL_REP_DIM,
          svd_energy_start: float = 0.95, svd_energy_end: float = 0.98,
          num_rounds: int = 100, evaluate: str = "private",
          kl_reduction: str = "batchmean") -> api.Algorithm:
  """Builds FedKD.

  Args:
    rt: runtime (groups by architecture, C, E, B, devices).
    learning_rate, momentum: SGD of mentor, mentee and W_h.
    weight_decay, grad_clip: coupled L2 and gradient-norm clipping (``api.sgd``).
    small_arch, rep_dim: architecture and representation width of the mentee.
    svd_energy_start, svd_energy_end: energy T kept by the SVD compression of updates
      at the first and the last round, in [0, 1] (start 0 = no compression; the paper
      anneals 0.95 -> 0.98).
    num_rounds: R, the rounds the annealing spans (the run's ``num_rounds``).
    evaluate: the model tested: ``'private'`` (the mentor, the paper's) or ``'shared'``
      (the mentee).
    kl_reduction: ``'batchmean'`` (the paper's KL) or ``'mean'`` (KL / C).

  Returns:
    ``Algorithm``; ``state.server`` = {'theta': the mentee, 'round': rounds aggregated}.
    ``state.clients[g].unpack().params`` = {'global': mentee_k, 'local': mentor_k,
    'proj': {'kernel': W_h}} stacked over the group's clients; ``state.server`` = theta.
  """
  for key, value in (("svd_energy_start", svd_energy_start),
                     ("svd_energy_end", svd_energy_end)):
    if not 0.0 <= value <= 1.0:
      raise ValueError(f"algo.{key}={value} must be in [0, 1] (start 0 = off)")
  check_evaluate(evaluate, kl_reduction)
  compress = svd_energy_start > 0

  def energy(round_):
    return energy_at(round_, svd_energy_start, svd_energy_end, num_rounds)
  nets = make_nets(rt, small_arch=small_arch, rep_dim=rep_dim)
  w_h = nn.Dense(LOCAL_REP_DIM, use_bias=False, kernel_init=torch_kernel_init)
  opt = api.sgd(learning_rate, momentum, weight_decay, grad_clip)

  def init_params(g, key):
    k1, k2 = jax.random.split(key)
    return dict(nets[g].init(k1),
                proj=w_h.init(k2, jnp.zeros((1, rep_dim)))["params"])

  def loss_fn(net):
    def fn(params, model_state, batch, rng):
      del rng
      (logits_t, rep_t), (logits_s, rep_s) = net.forward(params, batch.x)
      loss_t, loss_s = distillation_losses(logits_t, rep_t, logits_s, rep_s,
                                           params["proj"]["kernel"], batch.y, batch.mask,
                                           kl_reduction)
      return loss_t + loss_s, model_state
    return fn

  def client_update(g, client, payload, data, idx, mask, key):
    theta = payload["theta"]
    params, opt_state = api.download(rt, client.params, client.opt_state, {"global": theta})
    r = cl.local_train(loss_fn(nets[g]), opt, params, None, opt_state, data.x, data.y, idx,
                       mask, key, **rt.train_options())
    update, sent = compress_tree(uplink(r.params, theta),
                                 payload["energy"] if compress else 0.0)
    return (api.ClientState(r.params, None, r.opt_state), update,
            {"loss": r.loss, "sent": sent})

  def server_aggregate(server, uploads, weights, train_key, server_data):
    del train_key, server_data
    update = weighted_average(uploads, weights)  # g = sum_k n_k g_k / sum_k n_k
    update, down = compress_tree(update, energy(server["round"]) if compress else 0.0)
    theta = jax.tree.map(jnp.add, server["theta"], update)
    return {"theta": theta, "round": server["round"] + 1}, {"downlink_params": down}

  def communication(server, uploads, weights, aux):
    """Uplink: the mean over participating clients of the factors each sent (``aux``);
    downlink: the aggregate's own count of the compressed update it sends."""
    del server, uploads
    active = jnp.concatenate([(w > 0).astype(jnp.float32) for w in weights])
    sent = jnp.concatenate([a["sent"] for a in aux])
    return jnp.sum(sent * active) / jnp.maximum(jnp.sum(active), 1.0), None

  shared = dict(predict=shared_predict(nets, lambda payload: payload["theta"]),
                trained_payload=trained_mentee)
  proto = mutual_protocol(nets, opt, client_update,
                          server_aggregate=server_aggregate, init_params=init_params,
                          **(shared if evaluate == "shared" else {}))
  init_theta = proto.init_server
  proto = proto._replace(
      init_server=lambda rng: {"theta": init_theta(rng), "round": jnp.zeros((), jnp.int32)},
      downlink=lambda server, g: {"theta": server["theta"],
                                  "energy": energy(server["round"])},
      communication=communication)

  return rounds.from_protocol(rt, proto)


def trained_mentee(payload, update):
  """``Protocol.trained_payload`` with ``evaluate='shared'``: the payload with the
  client's trained mentee as the server receives it, theta + its compressed update."""
  return dict(payload, theta=jax.tree.map(jnp.add, payload["theta"], update))


def uplink(params, theta):
  """What a FedKD client sends (before compression): its mentee update theta_k - theta."""
  return jax.tree.map(jnp.subtract, params["global"], theta)


SPEC = api.Spec(
    lambda c, rt: fedkd(rt, **api.sgd_args(c), num_rounds=c.num_rounds, **c.algo),
    api.hparams_of(fedkd, exclude=("num_rounds",)),
    choices=dict(small_arch=models.ArchitectureChoices(), evaluate=EVALUATED,
                 kl_reduction=KL_REDUCTIONS))
