r"""A round of one's own, composed from public pieces: FedAvg's round plus client drift.

``drift``: the mean over the round's clients of ||w_k - w||, how far local training
moved each client's model w_k from the model w it downloaded (docs/extending.md). A
config runs it as ``config.algorithm = 'examples.drift_round:SPEC'`` (FedAvg's keys).
"""
import jax
import jax.numpy as jnp

from fedjax_het.algorithms import api
from fedjax_het.algorithms import fedavg
from fedjax_het.algorithms import rounds


def drift_round(rt: api.Runtime, proto: api.Protocol):
  """The round of every protocol (``rounds.protocol_round``), plus ``drift``."""
  def round_fn(state, data):
    results = rounds.train_protocol_groups(rt, proto, state, data)  # the clients' half
    new_state, metrics = rounds.finish_round(proto, state, data, results)  # the server's
    dist, active = [], []
    for r in results:  # per group: uploads [m_g, ...], weights [m_g] (0: padding slot)
      sq = sum(jnp.sum(jnp.square(u - w).reshape(u.shape[0], -1), axis=1) for u, w in
               zip(jax.tree.leaves(r.outputs[0]), jax.tree.leaves(state.server)))
      dist.append(jnp.sqrt(sq))
      active.append((r.weights > 0).astype(jnp.float32))
    dist, active = jnp.concatenate(dist), jnp.concatenate(active)
    metrics["drift"] = jnp.sum(dist * active) / jnp.maximum(jnp.sum(active), 1.0)
    return new_state, metrics
  return round_fn


def with_drift(alg: api.Algorithm, rt: api.Runtime) -> api.Algorithm:
  """``alg`` with ``drift_round`` (its server state: the model its clients download)."""
  return alg._replace(round=drift_round(rt, alg.protocol))


SPEC = fedavg.SPEC._replace(build=lambda c, rt: with_drift(fedavg.SPEC.build(c, rt), rt))
