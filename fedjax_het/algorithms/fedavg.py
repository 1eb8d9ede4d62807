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
import jax.numpy as jnp

from fedjax_het import clients as cl
from fedjax_het.algorithms import base
from fedjax_het.algorithms.standalone import classifier_loss, init_models


def check_homogeneous(layout, algorithm: str) -> None:
  """Raises ValueError when the federation has more than one architecture."""
  if layout.num_groups != 1:
    raise ValueError(
        f"{algorithm} needs model-homogeneous clients (config `models` set to one "
        f"architecture such as 'cnn1'); got architectures {list(layout.archs)}")


def fedavg(rt: base.Runtime, *, learning_rate: float, momentum: float = 0.0,
           weight_decay: float = 0.0, grad_clip: float = 0.0
           ) -> base.Algorithm:
  """Builds FedAvg.

  Args:
    rt: runtime; its layout must have exactly one architecture group.
    learning_rate, momentum: local SGD (the optimizer state is reset every round).
    weight_decay, grad_clip: coupled L2 and gradient-norm clipping (``base.sgd``).

  Returns:
    ``Algorithm``; ``state.server`` holds the global params; ``state.clients[0]`` only
    counts the rounds each client took part in (int32 [n]). The protocol downloads w,
    uploads w_k.
  """
  check_homogeneous(rt.layout, "fedavg")
  nets = init_models(rt, num_classes=rt.layout.num_classes)
  opt = base.sgd(learning_rate, momentum, weight_decay, grad_clip)

  def init_server(rng):
    return nets[0].init(jax.random.fold_in(rng, 1 << 20), rt.dummy_input())["params"]

  def server_aggregate(w, uploads, weights, train_key, server_data):
    del w, train_key, server_data
    (w_k,), (n_k,) = uploads, weights  # one group
    return cl.weighted_mean(w_k, n_k), {}  # w <- sum_k n_k w_k / sum_k n_k

  def predict(g, rounds_taken, w):
    del rounds_taken  # the global model, not a personal one
    return lambda x: nets[g].apply({"params": w}, x)[0]

  proto = base.Protocol(count_rounds, init_server, lambda w, g: w,
                        local_update(rt, nets, opt), server_aggregate, predict,
                        trained_payload=base.own_upload)

  return base.Algorithm(base.protocol_init(rt, proto), average_round(rt, proto),
                        base.protocol_evaluate(rt, proto), proto)


def average_round(rt: base.Runtime, proto: base.Protocol):
  """``Algorithm.round`` of a protocol whose server state is one averaged model.

  FedAvg's round, also that of the shared parts of FedMoE, LG-FedAvg, FML and FedAPEN:
  every sampled client downloads the server's model (or shared part), trains, sends its
  copy back, and ``proto.aggregate`` averages them. Both links carry that model whole.
  """
  def round_fn(state, data):
    results = base.train_protocol_groups(rt, proto, state, data)
    server, _ = base.aggregate_groups(proto, state, results)
    size = base.count_params(state.server)
    metrics = base.round_metrics(results, lambda o: o[1]["loss"], uplink=size,
                                 downlink=size)
    return state.replace(round=state.round + 1, clients=tuple(r.clients for r in results),
                         server=server), metrics
  return round_fn


def count_rounds(g, key):
  """``Protocol.init_client`` of FedAvg: a client keeps only its rounds taken (int32)."""
  del g, key
  return jnp.zeros((), jnp.int32)


def local_update(rt: base.Runtime, nets, opt):
  """``Protocol.client_update`` of FedAvg (also Moss's within-type FedAvg).

  The client starts from the downloaded model w with a fresh optimizer state, runs E
  epochs of SGD on its data, counts the round, and uploads its trained model w_k.
  """
  def client_update(g, rounds_taken, w, data, idx, mask, key):
    r = cl.local_train(classifier_loss(nets[g]), opt, w, None, opt.init(w), data.x,
                       data.y, idx, mask, key, **rt.train_options())
    return rounds_taken + 1, r.params, {"loss": r.loss}
  return client_update


SPEC = base.Spec(lambda c, rt: fedavg(rt, **base.sgd_args(c)), {}, homogeneous_only=True)
