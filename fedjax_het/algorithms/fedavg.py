"""FedAvg (McMahan et al., AISTATS 2017) for model-homogeneous federations.

Every client holds the same architecture. Each round the sampled clients start from the
global model w, run E epochs of SGD on their local data, and send their model w_k up;
the server sets w <- sum_k n_k w_k / sum_k n_k (n_k: client k's train examples) and
sends it down. Evaluation uses the global model on each client's test split.

Uplink: the whole model. Downlink: the whole model. A heterogeneous federation is a
configuration error (the models cannot be averaged).
"""
from __future__ import annotations

import jax

from fedjax_het import clients as cl
from fedjax_het.algorithms import api
from fedjax_het.algorithms import rounds
from fedjax_het.algorithms.shared import count_rounds
from fedjax_het.algorithms.shared import init_models
from fedjax_het.algorithms.shared import local_update


def check_homogeneous(layout, algorithm: str) -> None:
  """Raises ValueError when the federation has more than one architecture."""
  if layout.num_groups != 1:
    raise ValueError(
        f"{algorithm} needs model-homogeneous clients (config `models` set to one "
        f"architecture such as 'cnn1'); got architectures {list(layout.archs)}")


def fedavg(rt: api.Runtime, *, learning_rate: float, momentum: float = 0.0,
           weight_decay: float = 0.0, grad_clip: float = 0.0
           ) -> api.Algorithm:
  """Builds FedAvg.

  Args:
    rt: runtime; its layout must have exactly one architecture group.
    learning_rate, momentum: local SGD (the optimizer state is reset every round).
    weight_decay, grad_clip: coupled L2 and gradient-norm clipping (``api.sgd``).

  Returns:
    ``Algorithm``; ``state.server`` holds the global params; ``state.clients[0]`` only
    counts the rounds each client took part in (int32 [n]). The protocol downloads w,
    uploads w_k.
  """
  check_homogeneous(rt.layout, "fedavg")
  nets = init_models(rt, num_classes=rt.layout.num_classes)
  opt = api.sgd(learning_rate, momentum, weight_decay, grad_clip)

  def init_server(rng):
    return nets[0].init(jax.random.fold_in(rng, 1 << 20), rt.dummy_input())["params"]

  def server_aggregate(w, uploads, weights, train_key, server_data):
    del w, train_key, server_data
    (w_k,), (n_k,) = uploads, weights  # one group
    return cl.weighted_mean(w_k, n_k), {}  # w <- sum_k n_k w_k / sum_k n_k

  def predict(g, rounds_taken, w):
    del rounds_taken  # the global model, not a personal one
    return lambda x: nets[g].apply({"params": w}, x)[0]

  # a client: E epochs of SGD from the downloaded w, upload w_k (``shared.local_update``)
  proto = api.Protocol(count_rounds, init_server, lambda w, g: w,
                        local_update(rt, nets, opt), server_aggregate, predict,
                        trained_payload=api.own_upload)

  return rounds.from_protocol(rt, proto)


SPEC = api.Spec(lambda c, rt: fedavg(rt, **api.sgd_args(c)), {}, homogeneous_only=True, averages=True)
