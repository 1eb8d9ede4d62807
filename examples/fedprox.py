r"""FedProx (Li et al., "Federated Optimization in Heterogeneous Networks", MLSys 2020),
an algorithm written outside fedjax-het (docs/extending.md).

Each round the sampled clients start from the global model w, minimise their loss plus
the proximal term (mu / 2) ||w_k - w||^2 by E epochs of SGD and send w_k up; the server
sets w <- sum_k n_k w_k / sum_k n_k (``aggregation='uniform'``: the plain mean).

  python experiments/main.py --config=examples/configs/fedprox.py:smoke --workdir=/tmp/fedprox

The config names it by reference, ``config.algorithm = 'examples.fedprox:SPEC'``.
"""
import jax
import jax.numpy as jnp

from fedjax_het import clients as cl
from fedjax_het import models
from fedjax_het.algorithms import api
from fedjax_het.algorithms import rounds

AGGREGATION = ("weighted", "uniform")


def fedprox(rt: api.Runtime, *, learning_rate: float, momentum: float = 0.0,
            weight_decay: float = 0.0, grad_clip: float = 0.0, mu: float = 0.01,
            aggregation: str = "weighted") -> api.Algorithm:
  """Builds FedProx for a model-homogeneous federation (``rt.layout``: one group)."""
  net = models.get_model(rt.layout.archs[0], num_classes=rt.layout.num_classes,
                         dtype=rt.compute_dtype)
  opt = api.sgd(learning_rate, momentum, weight_decay, grad_clip)

  def prox_loss(w):  # the local objective, around the downloaded global model w
    def loss_fn(params, model_state, batch, rng):
      logits, _ = net.apply({"params": params}, batch.x)
      dist = sum(jnp.sum(jnp.square(a - b))
                 for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(w)))
      return cl.cross_entropy(logits, batch.y, batch.mask) + 0.5 * mu * dist, model_state
    return loss_fn

  def init_client(g, key):  # a client keeps only the number of rounds it took part in
    return jnp.zeros((), jnp.int32)

  def init_server(rng):
    return net.init(jax.random.fold_in(rng, 1 << 20), rt.dummy_input())["params"]

  def client_update(g, rounds, w, data, idx, mask, key):
    r = cl.local_train(prox_loss(w), opt, w, None, opt.init(w), data.x, data.y, idx, mask,
                       key, **rt.train_options())
    return rounds + 1, r.params, {"loss": r.loss}  # (client state, upload, aux)

  def aggregate(w, uploads, weights, train_key, server_data):
    (w_k,), (n_k,) = uploads, weights  # one group; n_k = 0 on padding slots
    if aggregation == "uniform":
      n_k = (n_k > 0).astype(jnp.float32)
    return cl.weighted_mean(w_k, n_k), {}

  def predict(g, rounds, w):
    return lambda x: net.apply({"params": w}, x)[0]

  proto = api.Protocol(init_client, init_server, lambda w, g: w, client_update, aggregate,
                        predict, trained_payload=api.own_upload)
  # init, round and evaluate from the protocol: the round every algorithm shares
  # (train the sampled clients, aggregate, count both links), rounds.protocol_round
  return rounds.from_protocol(rt, proto)


def check(config) -> None:
  """Values ``Spec.choices`` cannot express, checked before any data is read."""
  mu = config.algo.get("mu", SPEC.hparams["mu"])
  if not (isinstance(mu, (int, float)) and mu >= 0):
    raise ValueError(f"config.algo.mu={mu!r} is invalid: must be a number >= 0")


SPEC = api.Spec(lambda c, rt: fedprox(rt, **api.sgd_args(c), **c.algo),
                 hparams=api.hparams_of(fedprox),  # mu, aggregation: the defaults above
                 choices=dict(aggregation=AGGREGATION), homogeneous_only=True, check=check,
                 averages=True)
