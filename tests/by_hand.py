"""Hand computations the equation tests compare the algorithms with (tests/test_equations_*).

Everything an algorithm's equations do is written out here in plain numpy / jax: the
normalization of a batch, linear layers, cross-entropy, weighted means, cosines. Only the
CNNs themselves (``models.get_model(...).apply``: the model, not an algorithm's equation)
come from the library. The algorithms are run through their ``Protocol`` functions on ONE
client (no client axis), or through ``Algorithm.round`` where the weights must come from a
partition.
"""
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from fedjax_het import packing
from fedjax_het.algorithms import base
from fedjax_het.data.federated import Layout

IMAGE_SHAPE = (16, 16, 3)  # the smallest the tiny CNNs take: 5x5 valid convs and 2x2 pools
NUM_CLASSES = 10
# a normalization of our own, so the test's pixels do not go through the library's
MEAN, STD = (0.5, 0.4, 0.3), (0.25, 0.2, 0.5)


class Pool(NamedTuple):
  """A client's examples (``Protocol.client_update``'s ``data``)."""
  x: np.ndarray  # uint8 [P, H, W, C]
  y: np.ndarray  # int32 [P]


def runtime(archs=("tiny",), clients=(1,), batch_size=4, **kw) -> base.Runtime:
  """A runtime of groups of ``archs`` with ``clients`` clients each, on ``IMAGE_SHAPE``."""
  ids, start = [], 0
  for n in clients:
    ids.append(tuple(range(start, start + n)))
    start += n
  layout = Layout(tuple(archs), tuple(ids), tuple(clients), start, NUM_CLASSES, IMAGE_SHAPE)
  return base.Runtime(layout, batch_size=batch_size, normalization=(MEAN, STD), **kw)


def pool(n, seed=0) -> Pool:
  """``n`` random uint8 images and labels."""
  rng = np.random.default_rng(seed)
  x = rng.integers(0, 256, (n,) + IMAGE_SHAPE, dtype=np.uint8)
  return Pool(x, rng.integers(0, NUM_CLASSES, n).astype(np.int32))


def one_batch(n):
  """A train table of all ``n`` examples, real (one step of batch size ``n``)."""
  return jnp.arange(n, dtype=jnp.int32), jnp.ones(n, bool)


def normalized(x) -> jnp.ndarray:
  """(x / 255 - mean) / std per channel, float32."""
  return (jnp.asarray(x, jnp.float32) / 255.0 - jnp.asarray(MEAN)) / jnp.asarray(STD)


def dense(h, p):
  """h @ kernel + bias."""
  return h @ p["kernel"] + p["bias"]


def ce(logits, y):
  """Mean softmax cross-entropy of integer labels."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, jnp.asarray(y)[:, None], axis=-1))


def rep(model, params, x):
  """The model's representation (its extractor's output, ``features['rep']``)."""
  return model.apply({"params": params}, x)[1]["rep"]


def sgd(params, grads, lr):
  """One plain SGD step."""
  return jax.tree.map(lambda p, g: p - lr * g, params, grads)


def weighted_mean(rows, counts):
  """sum_k n_k u_k / sum_k n_k over a list of pytrees, in float64 numpy."""
  counts = np.asarray(counts, np.float64)
  return jax.tree.map(lambda *a: sum(n * np.asarray(x, np.float64) for n, x in zip(counts, a))
                      / counts.sum(), *rows)


def train_counts(data, g):
  """Real train examples of every client of group ``g``, counted from its table's mask."""
  return np.asarray(data.groups[g].train_mask).sum(axis=1)


def row(tree, j):
  """Client j's leaves out of a group's stacked state."""
  return jax.tree.map(lambda a: np.asarray(a)[j], tree)


def assert_close(actual, expected, rtol=1e-5, atol=1e-6):
  """Same tree structure, every leaf within tolerance."""
  assert jax.tree.structure(actual) == jax.tree.structure(expected), (
      jax.tree.structure(actual), jax.tree.structure(expected))
  for a, e in zip(jax.tree.leaves(actual), jax.tree.leaves(expected)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol, atol=atol)


def majority_baseline(data, num_groups):
  """Mean over clients of the test accuracy of predicting the client's most frequent
  train label: what a model that learned only the label prior gets."""
  y = np.asarray(data.y)
  accs = []
  for g in range(num_groups):
    index = data.groups[g]
    for tr, tm, te, em in zip(*(np.asarray(a) for a in (
        index.train_idx, index.train_mask, index.test_idx, index.test_mask))):
      if tm.sum() == 0 or em.sum() == 0:
        continue
      top = np.bincount(y[tr[tm]], minlength=NUM_CLASSES).argmax()
      accs.append(np.mean(y[te[em]] == top))
  return float(np.mean(accs))


def mean_test_acc(counts):
  """Mean over real clients of correct / total (``Algorithm.evaluate``'s counts)."""
  accs = [c / t for correct, total in counts
          for c, t in zip(np.asarray(correct), np.asarray(total)) if t > 0]
  return float(np.mean(accs))


def assert_weighted_by_counts(exp, state, shared, rtol=1e-4, atol=1e-6):
  """After a round in which every client trained: the server's ``state.server`` is the
  mean of every client's ``shared(tree of state.clients[g])`` weighted by its train examples,
  counted from the partition's tables; the counts are unequal, so a uniform mean fails."""
  rows, counts = [], []
  for g, size in enumerate(exp.runtime.layout.group_sizes):
    n = train_counts(exp.data, g)
    for j in range(size):
      rows.append(row(shared(packing.as_tree(state.clients[g])), j))
      counts.append(n[j])
  assert len(set(counts)) > 1, counts
  assert_close(state.server, weighted_mean(rows, counts), rtol=rtol, atol=atol)
  uniform = jax.tree.leaves(weighted_mean(rows, np.ones(len(counts))))
  assert not all(np.allclose(u, s, rtol=rtol, atol=atol)
                 for u, s in zip(uniform, jax.tree.leaves(state.server)))


def assert_learned(exp, counts):
  """Every client's test accuracy (``evaluate``'s counts), averaged, is at least twice
  chance: twice 1/C and twice the accuracy of the clients' label priors."""
  acc = mean_test_acc(counts)
  prior = majority_baseline(exp.data, exp.runtime.layout.num_groups)
  assert acc >= 2 * max(1.0 / NUM_CLASSES, prior), (acc, prior)


# ``tiny_config`` overrides of the round tests that also check learning: 5 rounds of 2
# local epochs of SGD with momentum 0.9 at 0.02; on tiny_npz (seed 0, 8 Dirichlet(1)
# clients, label priors 0.23-0.25) FedMRL, FedMoE and Moss reached 0.69, 0.77 and 0.74
# mean test accuracy after round 5 against a bar of 0.46-0.50 (twice the prior)
LEARNS = {"num_rounds": 5, "local_epochs": 2, "momentum": 0.9, "learning_rate": 0.02}
