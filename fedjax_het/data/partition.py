"""Splitting a labelled pool into clients: IID, pathological and Dirichlet non-IID.

Every function is pure numpy and deterministic in its ``seed``
(``np.random.default_rng(seed)``), so a resumed run rebuilds the same clients.

Kinds (``PARTITIONS``):

- ``'iid'``: shuffle all examples and cut them into ``num_clients`` near-equal parts.
- ``'pathological'``: every client holds ``classes_per_client`` classes; a holder's share
  of a class is U(0.4, 0.6) normalised over the class's holders (pFedHN, the split
  FedMRL, NeurIPS 2024, and pFedMoE cite), or Dir(alpha) (``shares='dirichlet'``); see
  ``partition``.
- ``'dirichlet'``: per class, shares over all clients ~ Dir(alpha) (Hsu et al., 2019).

A partition is built in two steps: draw an integer count matrix ``[num_clients,
num_classes]`` (redrawn while some client has fewer than ``min_examples``), then hand
out each class's shuffled examples in those counts.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

PARTITIONS = ("iid", "pathological", "dirichlet")
SHARES = ("uniform", "dirichlet")  # pathological: how a class is shared by its holders
UNIFORM_SHARE = (0.4, 0.6)  # pFedHN's U(low_prob, high_prob), as both papers
MAX_DRAWS = 1000

_ADVICE = {
    "iid": "use fewer clients or more data",
    "pathological": "use fewer clients, a larger partition.alpha, more "
                    "partition.classes_per_client or more data",
    "dirichlet": "use fewer clients, a larger partition.alpha or more data",
}


def papers_classes_per_client(num_classes: int) -> int:
  """The papers' classes per client: 2 of CIFAR-10's, 10 of CIFAR-100's (``max(2, C // 10)``).

  ``partition.classes_per_client = 0`` (the default) resolves to it.
  """
  return max(2, num_classes // 10)


def split_counts(proportions: np.ndarray, total: int) -> np.ndarray:
  """Integer counts summing to ``total``, following ``proportions``.

  Cut points are ``floor(cumsum(proportions) * total)``, the last forced to ``total``.

  Args:
    proportions: float [k], non-negative, summing to 1.
    total: number of items to hand out.

  Returns:
    int64 [k] counts.
  """
  cuts = np.floor(np.cumsum(proportions) * total).astype(np.int64)
  cuts = np.minimum(cuts, total)
  cuts[-1] = total
  return np.diff(cuts, prepend=0)


def assign_classes(num_clients: int, num_classes: int, classes_per_client: int,
                   rng: np.random.Generator) -> np.ndarray:
  """Which classes each client holds, spread as evenly as possible over the classes.

  Clients choose in turn the ``classes_per_client`` classes held by the fewest clients so
  far (ties broken at random), so every class ends up held by
  ``floor(N * cpc / C)`` or ``ceil(N * cpc / C)`` clients and a client's classes are
  distinct.

  Args:
    num_clients: N.
    num_classes: C.
    classes_per_client: cpc, in [1, C].
    rng: random generator.

  Returns:
    bool [N, C]: ``held[k, c]`` when client k holds class c.
  """
  held = np.zeros((num_clients, num_classes), bool)
  holders = np.zeros(num_classes, np.int64)
  for k in range(num_clients):
    order = np.lexsort((rng.random(num_classes), holders))
    chosen = order[:classes_per_client]
    held[k, chosen] = True
    holders[chosen] += 1
  return held


def pathological_counts(class_sizes: np.ndarray, num_clients: int,
                        classes_per_client: int, alpha: float,
                        rng: np.random.Generator, shares: str = "uniform") -> np.ndarray:
  """Examples of each class per client for the pathological split.

  Args:
    class_sizes: int [C] examples of each class.
    num_clients: N.
    classes_per_client: classes each client holds.
    alpha: Dirichlet concentration of the shares ('dirichlet' shares).
    rng: random generator.
    shares: 'uniform': each holder draws U(0.4, 0.6), normalised over the holders
      (pFedHN); 'dirichlet': Dir(alpha) over the holders.

  Returns:
    int64 [N, C]. Each holder of a class gets one example of it, then the rest of the
    class is shared in the drawn proportions (if the class has fewer examples than
    holders, all of it is shared so). A class held by no client has a zero column
    (its examples are unused).
  """
  held = assign_classes(num_clients, len(class_sizes), classes_per_client, rng)
  counts = np.zeros(held.shape, np.int64)
  for c, size in enumerate(class_sizes):
    owners = np.flatnonzero(held[:, c])
    if len(owners):
      if shares == "uniform":
        share = rng.uniform(*UNIFORM_SHARE, size=len(owners))
        share = share / share.sum()
      else:
        share = rng.dirichlet(np.full(len(owners), alpha))
      floor = 1 if size >= len(owners) else 0  # every holder sees its class if possible
      counts[owners, c] = floor + split_counts(share, int(size) - floor * len(owners))
  return counts


def dirichlet_counts(class_sizes: np.ndarray, num_clients: int, alpha: float,
                     rng: np.random.Generator) -> np.ndarray:
  """Examples of each class per client: per class, shares over all clients ~ Dir(alpha).

  Returns:
    int64 [N, C]; every example is assigned.
  """
  counts = np.zeros((num_clients, len(class_sizes)), np.int64)
  for c, size in enumerate(class_sizes):
    counts[:, c] = split_counts(rng.dirichlet(np.full(num_clients, alpha)), int(size))
  return counts


def iid_counts(num_examples: int, num_clients: int) -> np.ndarray:
  """Near-equal client sizes (the first ``n % N`` clients get one more)."""
  return np.array([len(a) for a in np.array_split(np.arange(num_examples), num_clients)])


def _check_args(labels: np.ndarray, num_clients: int, kind: str, num_classes: int,
                classes_per_client: int, alpha: float, min_examples: int,
                shares: str) -> None:
  """ValueError naming the first invalid argument of ``partition``."""
  if kind not in PARTITIONS:
    raise ValueError(f"partition.kind={kind!r} is invalid; valid choices: {PARTITIONS}")
  if shares not in SHARES:
    raise ValueError(f"partition.shares={shares!r} is invalid; valid choices: {SHARES}")
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(f"labels must be a 1-D integer array; got {labels.dtype} "
                     f"{labels.shape}")
  if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
    raise ValueError(f"labels lie in [{labels.min()}, {labels.max()}]; expected "
                     f"[0, num_classes={num_classes})")
  if num_clients < 1:
    raise ValueError(f"num_clients={num_clients}: must be >= 1")
  if min_examples < 0:
    raise ValueError(f"min_examples={min_examples}: must be >= 0")
  if len(labels) < num_clients * min_examples:
    raise ValueError(f"{len(labels)} examples cannot give {num_clients} clients at "
                     f"least min_examples={min_examples} each; use fewer clients or "
                     "more data")
  if kind == "pathological" and not 1 <= classes_per_client <= num_classes:
    raise ValueError(f"partition.classes_per_client={classes_per_client} is invalid: "
                     f"must be in [1, {num_classes}] (the number of classes)")
  if kind != "iid" and not alpha > 0:
    raise ValueError(f"partition.alpha={alpha}: must be > 0")


def _draw_counts(kind: str, labels: np.ndarray, num_clients: int, num_classes: int,
                 classes_per_client: int, alpha: float, min_examples: int,
                 rng: np.random.Generator, shares: str = "uniform") -> np.ndarray:
  """A count matrix [N, C] (iid: [N, 1]) where every client has >= min_examples."""
  class_sizes = np.bincount(labels, minlength=num_classes)
  for _ in range(MAX_DRAWS):
    if kind == "iid":
      counts = iid_counts(len(labels), num_clients)[:, None]
    elif kind == "pathological":
      counts = pathological_counts(class_sizes, num_clients, classes_per_client, alpha,
                                   rng, shares)
    else:
      counts = dirichlet_counts(class_sizes, num_clients, alpha, rng)
    sizes = counts.sum(axis=1)
    if sizes.min() >= min_examples:
      return counts
  worst = int(np.argmin(sizes))
  raise ValueError(
      f"partition kind={kind!r}: after {MAX_DRAWS} draws some client still had fewer "
      f"than min_examples={min_examples} examples (last draw: client {worst} got "
      f"{int(sizes[worst])} of {len(labels)} examples for {num_clients} clients, "
      f"alpha={alpha}); {_ADVICE[kind]}")


def _hand_out(groups: Sequence[np.ndarray], counts: np.ndarray) -> list[np.ndarray]:
  """Gives client k ``counts[k, j]`` of the (shuffled) indices ``groups[j]``.

  Returns:
    per-client sorted int64 index arrays.
  """
  parts = [[] for _ in range(counts.shape[0])]
  for j, idx in enumerate(groups):
    pieces = np.split(idx, np.cumsum(counts[:, j]))[:-1]  # the tail is unused
    for k, piece in enumerate(pieces):
      parts[k].append(piece)
  return [np.sort(np.concatenate(p)).astype(np.int64) for p in parts]


def partition(labels: np.ndarray, num_clients: int, *, kind: str, seed: int,
              num_classes: int, classes_per_client: int = 2, alpha: float = 0.5,
              min_examples: int = 2, shares: str = "uniform") -> list[np.ndarray]:
  """Splits examples into ``num_clients`` disjoint clients.

  ``'pathological'`` (label skew with unequal amounts): client k holds exactly
  ``classes_per_client`` (cpc) distinct classes. Clients pick, one after another, the
  cpc classes held by the fewest clients so far (random tie-break), so every class is
  held by ``floor(N * cpc / C)`` or ``ceil(N * cpc / C)`` clients. Each holder first
  gets one example of each of its classes (so a client's labels are exactly its classes
  whenever a class has at least as many examples as holders); the rest of a class is
  shared among its holders in drawn proportions, so clients hold different amounts of a
  shared class. A class held by no client (``N * cpc < C``) is unused.

  Shares (``shares``): ``'uniform'`` (default) is pFedHN's rule, which FedMRL and
  pFedMoE cite and the FedMRL authors' ``experiments/dataset.py`` runs: each holder
  draws U(0.4, 0.6) and the draws are normalised over the class's holders, so shares of
  a class stay within 1.5x of each other. ``'dirichlet'`` draws them from Dir(alpha)
  (``partition.alpha``; Dir(1.0) gives a 2-class client a 72-76 % majority class and
  13x size differences between clients).

  Differences from the reference code: it gives every class ``N * cpc // C`` holder
  slots and lets each client take the classes with the most free slots (random
  tie-break), which is the same even spread as here when ``N * cpc`` is a multiple of
  ``C`` (every paper setting); it floors each holder's amount, leaving up to one example
  per holder unused, where we hand out the whole class; it redraws nothing. PFLlib /
  HtFLlib ``separate_data(partition='pat')`` walks the classes in order instead and
  gives each to the first ``ceil(N * cpc / C)`` clients with free class slots.

  ``'dirichlet'``: for each class, shares over all N clients ~ Dir(alpha); every example
  is used. ``'iid'``: shuffled and cut into near-equal parts.

  If some client gets fewer than ``min_examples`` the split is redrawn from the same
  generator, up to ``MAX_DRAWS`` times.

  Args:
    labels: int [n] class of each example, in [0, num_classes).
    num_clients: N.
    kind: one of ``PARTITIONS``.
    seed: seed of ``np.random.default_rng``.
    num_classes: C.
    classes_per_client: classes per client ('pathological'), in [1, C].
    alpha: Dirichlet concentration ('dirichlet', and 'pathological' with
      ``shares='dirichlet'``); smaller is more skewed.
    min_examples: fewest examples any client may get.
    shares: 'uniform' or 'dirichlet' (pathological only; see above).

  Returns:
    list of N sorted, disjoint int64 arrays of indices into ``labels``.

  Raises:
    ValueError: invalid arguments, or no valid draw within ``MAX_DRAWS``.
  """
  labels = np.asarray(labels)
  _check_args(labels, num_clients, kind, num_classes, classes_per_client, alpha,
              min_examples, shares)
  rng = np.random.default_rng(seed)
  counts = _draw_counts(kind, labels, num_clients, num_classes, classes_per_client,
                        alpha, min_examples, rng, shares)
  if kind == "iid":
    groups = [rng.permutation(len(labels))]
  else:
    groups = [rng.permutation(np.flatnonzero(labels == c)) for c in range(num_classes)]
  return _hand_out(groups, counts)


def split_like(labels: np.ndarray, train_counts: np.ndarray, *, seed: int
               ) -> list[np.ndarray]:
  """Splits a test set so that each client gets its training class proportions.

  For every class c, the class's examples (shuffled) are shared among the clients in
  proportion to their training counts ``train_counts[:, c]`` (the FedMRL authors' code
  applies a client's training shares of a class to the test split the same way). A
  class no client trains on is unused.

  Args:
    labels: int [n] labels of the test set.
    train_counts: int [N, C] training examples of each class per client.
    seed: seed of ``np.random.default_rng``.

  Returns:
    N sorted int64 index arrays into ``labels``.
  """
  labels = np.asarray(labels)
  rng = np.random.default_rng(seed)
  counts = np.zeros_like(train_counts)
  groups = []
  for c in range(train_counts.shape[1]):
    idx = rng.permutation(np.flatnonzero(labels == c))
    groups.append(idx)
    held = train_counts[:, c].sum()
    if held:
      counts[:, c] = split_counts(train_counts[:, c] / held, len(idx))
  return _hand_out(groups, counts)


def train_test_split(client_indices: Sequence[np.ndarray], *, seed: int,
                     test_fraction: float = 0.2) -> tuple[list[np.ndarray],
                                                          list[np.ndarray]]:
  """Splits every client's examples into its own train and test sets.

  A client of n examples gets ``max(1, round(test_fraction * n))`` test examples
  (rounding half up, and at most n - 1); the rest are for training.

  Args:
    client_indices: per-client index arrays (each of at least 2 examples).
    seed: seed of ``np.random.default_rng``.
    test_fraction: share of test examples, in (0, 1); 0.2 is the papers' 8:2 split.

  Returns:
    ``(train, test)``: two lists of sorted int64 index arrays, one entry per client.

  Raises:
    ValueError: ``test_fraction`` outside (0, 1) or a client with fewer than 2 examples.
  """
  if not 0 < test_fraction < 1:
    raise ValueError(f"partition.test_fraction={test_fraction}: must be in (0, 1)")
  rng = np.random.default_rng(seed)
  train, test = [], []
  for k, idx in enumerate(client_indices):
    idx = np.asarray(idx, np.int64)
    n = len(idx)
    if n < 2:
      raise ValueError(f"client {k} has {n} example(s); a train/test split needs >= 2 "
                       "(partition with min_examples >= 2)")
    num_test = min(n - 1, max(1, int(np.floor(test_fraction * n + 0.5))))
    order = rng.permutation(idx)
    test.append(np.sort(order[:num_test]))
    train.append(np.sort(order[num_test:]))
  return train, test


def class_counts(labels: np.ndarray, client_indices: Sequence[np.ndarray],
                 num_classes: int) -> np.ndarray:
  """Examples of each class held by each client.

  Args:
    labels: int [n] labels in [0, num_classes).
    client_indices: per-client index arrays into ``labels``.
    num_classes: C.

  Returns:
    int64 [num_clients, C].
  """
  labels = np.asarray(labels)
  rows = [np.bincount(labels[np.asarray(idx, np.int64)], minlength=num_classes)
          for idx in client_indices]
  counts = np.stack(rows) if rows else np.zeros((0, num_classes), np.int64)
  if counts.shape[1] != num_classes:
    raise ValueError(f"labels reach {counts.shape[1] - 1}; expected < "
                     f"num_classes={num_classes}")
  return counts.astype(np.int64)
