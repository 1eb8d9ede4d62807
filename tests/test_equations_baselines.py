"""The baselines that average a model by example counts, with the counts read from the data.

FedAvg (McMahan et al., AISTATS 2017), FML (Shen et al., 2020), FedKD (Wu et al., Nat.
Commun. 2022) and FedAPEN (Qin et al., KDD 2023) set the server's model to
sum_k n_k w_k / sum_k n_k over the round's clients. Here every client of a Dirichlet
partition (unequal n_k) trains one ``Algorithm.round``, which reads the weights from the
federated data itself; the expected model is recomputed in float64 numpy with n_k taken
from the partition's class counts (``Experiment.class_counts``: what the partition gave
each client), and a uniform mean must not match. No library aggregation helper
(``weighted_mean``, ``weighted_average``) makes an expected value.
"""
import jax
import numpy as np
import pytest
from by_hand import assert_close
from by_hand import row
from by_hand import train_counts

from fedjax_het import packing
from fedjax_het.algorithms import base
from fedjax_het.training import experiment
from fedjax_het.training import program

pytestmark = pytest.mark.usefixtures("compile_bound")

# (algorithm, client architectures, overrides): every client trains in round 1; FedKD's
# updates are sent uncompressed (``svd_energy_start=0``), so that its server's theta is
# theta + sum_k n_k (theta_k - theta) / sum_k n_k = the weighted mean of the theta_k
CASES = [("fedavg", "tiny", {}), ("fml", "tiny,tiny2", {}),
         ("fedkd", "tiny,tiny2", {"algo.svd_energy_start": 0.0}),
         ("fedapen", "tiny,tiny2", {})]


def partition_counts(exp) -> list[np.ndarray]:
  """Each group's n_k in client-axis order, from the partition's class counts."""
  counts = np.asarray(exp.class_counts)[:, 0].sum(axis=1)  # [clients]: train examples
  return [counts[list(ids)] for ids in exp.runtime.layout.client_ids]


def by_hand_mean(rows, counts) -> dict:
  """sum_k n_k w_k / sum_k n_k of a list of pytrees, float64 numpy."""
  n = np.asarray(counts, np.float64)
  return jax.tree.map(lambda *leaves: np.tensordot(
      n, np.stack([np.asarray(x, np.float64) for x in leaves]), axes=1) / n.sum(), *rows)


def trained_models(exp, state0, state1) -> list:
  """Every client's trained copy of the shared model after round 1, per group in
  client-axis order. FML, FedKD and FedAPEN keep it in ``params['global']``; FedAvg's
  clients keep nothing, so their uploads come from the round's own client work
  (``train_protocol_groups`` on the same state and keys), put back in client order."""
  if exp.config.algorithm != "fedavg":
    return [[row(packing.as_tree(c).params["global"], j) for j in range(size)]
            for c, size in zip(state1.clients, exp.runtime.layout.group_sizes)]
  rt, proto = exp.runtime, exp.algorithm.protocol
  (result,) = jax.jit(lambda s: base.train_protocol_groups(rt, proto, s, exp.data))(state0)
  slots = np.asarray(base.group_draw(rt, 0, *base.round_keys(state0))[0])
  upload = result.outputs[0]
  by_client = {int(k): row(upload, s) for s, k in enumerate(slots)
               if k < rt.layout.group_sizes[0]}
  return [[by_client[k] for k in range(rt.layout.group_sizes[0])]]


@pytest.mark.parametrize("name,archs,overrides", CASES, ids=[c[0] for c in CASES])
def test_server_model_is_the_mean_weighted_by_the_partitions_counts(tiny_config, name,
                                                                    archs, overrides):
  exp = experiment.prepare(tiny_config(name, archs, {"participation": 1.0, **overrides}))
  counts = partition_counts(exp)
  for g, n in enumerate(counts):  # the tables the round reads hold the partition's n_k
    np.testing.assert_array_equal(train_counts(exp.data, g), n)
  flat = np.concatenate(counts)
  assert len(set(flat.tolist())) > 1, flat  # unequal, so weighting matters
  state0 = program.compile_fns(exp).init(jax.random.PRNGKey(0))
  state1, _ = jax.jit(exp.algorithm.round)(state0, exp.data)
  rows = [r for group in trained_models(exp, state0, state1) for r in group]
  assert len(rows) == exp.runtime.layout.num_clients  # every client trained
  server = state1.server["theta"] if name == "fedkd" else state1.server
  assert_close(server, by_hand_mean(rows, flat), rtol=1e-4, atol=1e-6)
  uniform = by_hand_mean(rows, np.ones_like(flat))
  assert not all(np.allclose(u, s, rtol=1e-4, atol=1e-6) for u, s in zip(
      jax.tree.leaves(uniform), jax.tree.leaves(server)))
