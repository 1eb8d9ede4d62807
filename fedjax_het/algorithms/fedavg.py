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
from fedjax_het.algorithms.standalone import classifier_loss, dummy_input, init_models


def check_homogeneous(layout, algorithm: str) -> None:
  """Raises ValueError when the federation has more than one architecture."""
  if layout.num_groups != 1:
    raise ValueError(
        f"{algorithm} needs model-homogeneous clients (config `models` set to one "
        f"architecture such as 'cnn1'); got architectures {list(layout.archs)}")


def fedavg(rt: base.Runtime, *, learning_rate: float, momentum: float = 0.0
           ) -> base.Algorithm:
  """Builds FedAvg.

  Args:
    rt: runtime; its layout must have exactly one architecture group.
    learning_rate, momentum: local SGD (the optimizer state is reset every round).

  Returns:
    ``Algorithm``; ``state.server`` holds the global params; ``state.clients[0]`` only
    counts the rounds each client took part in (int32 [n]).
  """
  check_homogeneous(rt.layout, "fedavg")
  (net,) = init_models(rt, num_classes=rt.layout.num_classes)
  opt = base.sgd(learning_rate, momentum)
  loss_fn = classifier_loss(net)

  def init(rng):
    params = net.init(jax.random.fold_in(rng, 1 << 20), dummy_input())["params"]
    rounds_taken = jnp.zeros((rt.layout.padded_sizes[0],), jnp.int32)
    return base.State(jnp.zeros((), jnp.int32), rng, (rounds_taken,), params)

  def round_fn(state, data):
    sample_key, train_key = base.round_keys(state)
    global_params = state.server

    def client_fn(client, idx, mask, key):
      r = cl.local_train(loss_fn, opt, global_params, None, opt.init(global_params),
                         data.x, data.y, idx, mask, key, epochs=rt.local_epochs,
                         batch_size=rt.batch_size, dtype=rt.compute_dtype)
      return client + 1, (r.params, r.loss)

    res = base.train_group(rt, 0, state.clients[0], data, sample_key, train_key, client_fn)
    uploaded, _ = res.outputs
    new_global = cl.weighted_mean(uploaded, res.weights)
    size = base.count_params(global_params)
    metrics = base.round_metrics([res], lambda o: o[1], uplink=size, downlink=size)
    return state.replace(round=state.round + 1, clients=(res.clients,),
                         server=new_global), metrics

  def evaluate(state, data):
    def predict(g, client, server):
      return lambda x: net.apply({"params": server}, x)[0]
    return base.evaluate_groups(rt, state, data, predict)

  return base.Algorithm(init, round_fn, evaluate)


SPEC = base.Spec(lambda c, rt: fedavg(rt, **base.sgd_args(c)), {}, homogeneous_only=True)
