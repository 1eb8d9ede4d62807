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
- Server: example-weighted mean of the uploaded memes (``mutual.average``).

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

The two networks, the KL term and the protocol (``MutualNets``, ``kl_divergence``,
``mutual_protocol``) are in ``mutual.py``, shared with ``fedkd.py`` and ``fedapen.py``;
FML's round is every protocol's (``rounds.protocol_round``).
"""
from __future__ import annotations

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
from fedjax_het.algorithms.mutual import uplink
from fedjax_het.algorithms.shared import LOCAL_REP_DIM


def mutual_losses(logits_l, logits_g, labels, mask, *, alpha: float, beta: float,
                  kl_reduction: str = "batchmean"):
  """The two DML losses of FML: (L_local, L_meme), each with a fixed KL target."""
  loss_l = (alpha * cl.cross_entropy(logits_l, labels, mask)
            + (1 - alpha) * kl_divergence(logits_g, logits_l, mask, kl_reduction))
  loss_g = (beta * cl.cross_entropy(logits_g, labels, mask)
            + (1 - beta) * kl_divergence(logits_l, logits_g, mask, kl_reduction))
  return loss_l, loss_g


def fml(rt: api.Runtime, *, learning_rate: float, momentum: float = 0.0,
        weight_decay: float = 0.0, grad_clip: float = 0.0,
        alpha: float = 0.5, beta: float = 0.5, small_arch: str = "cnn5",
        rep_dim: int = LOCAL_REP_DIM, evaluate: str = "private",
        kl_reduction: str = "batchmean") -> api.Algorithm:
  """Builds FML.

  Args:
    rt: runtime (groups by architecture, C, E, B, devices).
    learning_rate, momentum: SGD of both models.
    weight_decay, grad_clip: coupled L2 and gradient-norm clipping (``api.sgd``).
    alpha: CE weight of the private model's loss (1 - alpha on KL from the meme).
    beta: CE weight of the meme's loss (1 - beta on KL from the private model).
    small_arch, rep_dim: architecture and representation width of the meme.
    evaluate: the model tested: ``'private'`` (the client's own, the paper's) or
      ``'shared'`` (the meme: the server's for protocol (a), the client's trained copy
      for (b)).
    kl_reduction: ``'batchmean'`` (the KL, the paper's) or ``'mean'`` (KL / C, as
      PyTorch's default ``KLDivLoss``) (``kl_divergence``).

  Returns:
    ``Algorithm``. ``state.clients[g].unpack().params`` = {'global': meme_k, 'local': omega_k}
    stacked over the group's clients; ``state.server`` = the averaged meme.
  """
  for name, v in (("alpha", alpha), ("beta", beta)):
    if not 0.0 <= v <= 1.0:
      raise ValueError(f"algo.{name}={v} must be in [0, 1]")
  check_evaluate(evaluate, kl_reduction)
  nets = make_nets(rt, small_arch=small_arch, rep_dim=rep_dim)
  opt = api.sgd(learning_rate, momentum, weight_decay, grad_clip)

  def loss_fn(net):
    def fn(params, model_state, batch, rng):
      del rng
      (logits_l, _), (logits_g, _) = net.forward(params, batch.x)
      loss_l, loss_g = mutual_losses(logits_l, logits_g, batch.y, batch.mask,
                                     alpha=alpha, beta=beta, kl_reduction=kl_reduction)
      return loss_l + loss_g, model_state
    return fn

  def client_update(g, client, theta, data, idx, mask, key):
    params, opt_state = api.download(rt, client.params, client.opt_state, {"global": theta})
    r = cl.local_train(loss_fn(nets[g]), opt, params, None, opt_state, data.x, data.y, idx,
                       mask, key,
                       **rt.train_options())
    return api.ClientState(r.params, None, r.opt_state), uplink(r.params), {"loss": r.loss}

  proto = mutual_protocol(
      nets, opt, client_update,
      **(dict(predict=shared_predict(nets), trained_payload=api.own_upload)
         if evaluate == "shared" else {}))
  return rounds.from_protocol(rt, proto)


SPEC = api.Spec(
    lambda c, rt: fml(rt, **api.sgd_args(c), **c.algo),
    api.hparams_of(fml),
    choices=dict(small_arch=models.ArchitectureChoices(), evaluate=EVALUATED,
                 kl_reduction=KL_REDUCTIONS), averages=True)
