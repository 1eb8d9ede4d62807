"""Client partitions (iid / pathological / dirichlet), train/test splits, class counts."""
import importlib

import numpy as np
import pytest

# The module (``fedjax_het.data.partition`` the attribute is the re-exported function).
part = importlib.import_module("fedjax_het.data.partition")

# 10 classes x 20 examples, class-sorted (so index // 20 is the label).
LABELS = np.repeat(np.arange(10), 20)


def _check_disjoint_sorted(parts, n):
  flat = np.concatenate(parts)
  assert len(np.unique(flat)) == len(flat)  # disjoint
  assert flat.min() >= 0 and flat.max() < n
  for p in parts:
    np.testing.assert_array_equal(p, np.sort(p))


def test_split_counts_by_hand():
  # cut points floor([5, 7.5, 10]) = [5, 7, 10]
  np.testing.assert_array_equal(part.split_counts(np.array([0.5, 0.25, 0.25]), 10),
                                [5, 2, 3])
  np.testing.assert_array_equal(part.split_counts(np.array([1.0]), 7), [7])


@pytest.mark.parametrize("kind", part.PARTITIONS)
def test_deterministic_and_seed_dependent(kind):
  a = part.partition(LABELS, 5, kind=kind, seed=0, num_classes=10)
  b = part.partition(LABELS, 5, kind=kind, seed=0, num_classes=10)
  c = part.partition(LABELS, 5, kind=kind, seed=1, num_classes=10)
  assert len(a) == 5
  for x, y in zip(a, b):
    np.testing.assert_array_equal(x, y)
  assert any(not np.array_equal(x, y) for x, y in zip(a, c))
  _check_disjoint_sorted(a, len(LABELS))


def test_iid_sizes_and_covers_everything():
  parts = part.partition(np.zeros(10, int), 3, kind="iid", seed=0, num_classes=1)
  assert [len(p) for p in parts] == [4, 3, 3]
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(10))


def test_assign_classes_spreads_evenly():
  rng = np.random.default_rng(0)
  held = part.assign_classes(5, 10, 2, rng)  # 10 slots for 10 classes: each once
  np.testing.assert_array_equal(held.sum(1), [2] * 5)
  np.testing.assert_array_equal(held.sum(0), [1] * 10)
  held = part.assign_classes(3, 10, 4, rng)  # 12 slots: two classes held twice
  np.testing.assert_array_equal(held.sum(1), [4] * 3)
  assert sorted(held.sum(0).tolist()) == [1] * 8 + [2] * 2


@pytest.mark.parametrize("shares", part.SHARES)
def test_pathological_exact_classes_and_uneven_shares(shares):
  parts = part.partition(LABELS, 10, kind="pathological", seed=3, num_classes=10,
                         classes_per_client=2, alpha=0.5, shares=shares)
  counts = part.class_counts(LABELS, parts, 10)
  np.testing.assert_array_equal((counts > 0).sum(1), [2] * 10)  # exactly 2 classes each
  np.testing.assert_array_equal((counts > 0).sum(0), [2] * 10)  # each class held twice
  np.testing.assert_array_equal(counts.sum(0), [20] * 10)  # held classes fully used
  shared = [np.sort(col[col > 0]) for col in counts.T]
  assert any(s[0] != s[1] for s in shared)  # holders of a class get different amounts
  _check_disjoint_sorted(parts, len(LABELS))


def test_pathological_unheld_classes_are_unused():
  parts = part.partition(LABELS, 2, kind="pathological", seed=0, num_classes=10,
                         classes_per_client=3)
  counts = part.class_counts(LABELS, parts, 10)
  assert (counts.sum(0) > 0).sum() == 6 and counts.sum() == 6 * 20


def test_pathological_cifar100_ten_classes_each():
  labels = np.repeat(np.arange(100), 6)
  parts = part.partition(labels, 20, kind="pathological", seed=0, num_classes=100,
                         classes_per_client=10)
  counts = part.class_counts(labels, parts, 100)
  np.testing.assert_array_equal((counts > 0).sum(1), [10] * 20)
  np.testing.assert_array_equal((counts > 0).sum(0), [2] * 100)


def test_dirichlet_covers_all_classes_and_examples():
  parts = part.partition(LABELS, 4, kind="dirichlet", seed=0, num_classes=10, alpha=0.3)
  counts = part.class_counts(LABELS, parts, 10)
  np.testing.assert_array_equal(counts.sum(0), [20] * 10)
  np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(200))
  assert counts.sum(1).min() >= 2
  assert (counts == 0).any()  # alpha=0.3 is skewed: some client misses some class


def test_min_examples_is_respected():
  for seed in range(5):
    parts = part.partition(LABELS, 20, kind="dirichlet", seed=seed, num_classes=10,
                           alpha=0.5, min_examples=5)
    assert min(len(p) for p in parts) >= 5


@pytest.mark.parametrize("kwargs,match", [
    (dict(kind="shards"), r"partition.kind='shards'.*\('iid', 'pathological', "
                          r"'dirichlet'\)"),
    (dict(kind="pathological", classes_per_client=0),
     r"partition.classes_per_client=0.*\[1, 10\]"),
    (dict(kind="pathological", classes_per_client=11),
     r"partition.classes_per_client=11.*\[1, 10\]"),
    (dict(kind="dirichlet", alpha=0.0), r"partition.alpha=0.0: must be > 0"),
    (dict(kind="iid", num_clients=101), r"200 examples cannot give 101 clients at least "
                                        r"min_examples=2"),
    (dict(kind="iid", num_clients=0), r"num_clients=0"),
])
def test_invalid_arguments(kwargs, match):
  kwargs = dict(dict(num_clients=5, seed=0, num_classes=10), **kwargs)
  with pytest.raises(ValueError, match=match):
    part.partition(LABELS, **kwargs)


def test_labels_out_of_range():
  with pytest.raises(ValueError, match=r"labels lie in \[0, 9\].*num_classes=5"):
    part.partition(LABELS, 2, kind="iid", seed=0, num_classes=5)


def test_impossible_min_examples_fails_clearly(monkeypatch):
  monkeypatch.setattr(part, "MAX_DRAWS", 20)
  labels = np.repeat(np.arange(2), 10)
  with pytest.raises(ValueError, match=r"after 20 draws.*client \d+ got \d of 20.*"
                                       r"larger partition.alpha"):
    part.partition(labels, 10, kind="dirichlet", seed=0, num_classes=2, alpha=0.01)


def test_train_test_split_by_hand():
  clients = [np.arange(10), np.arange(10, 17), np.arange(17, 30), np.arange(30, 32),
             np.arange(32, 35), np.arange(35, 47)]
  train, test = part.train_test_split(clients, seed=0)
  # test = max(1, round(0.2 n)): n=10->2, 7->1, 13->3 (2.6), 2->1, 3->1, 12->2 (2.4)
  assert [len(t) for t in test] == [2, 1, 3, 1, 1, 2]
  assert [len(t) for t in train] == [8, 6, 10, 1, 2, 10]
  for c, tr, te in zip(clients, train, test):
    np.testing.assert_array_equal(np.sort(np.concatenate([tr, te])), c)
    np.testing.assert_array_equal(tr, np.sort(tr))
  again = part.train_test_split(clients, seed=0)
  for a, b in zip(test, again[1]):
    np.testing.assert_array_equal(a, b)


def test_train_test_split_errors():
  with pytest.raises(ValueError, match=r"client 1 has 1 example"):
    part.train_test_split([np.arange(4), np.array([7])], seed=0)
  with pytest.raises(ValueError, match=r"test_fraction=1.0"):
    part.train_test_split([np.arange(4)], seed=0, test_fraction=1.0)


def test_class_counts_by_hand():
  labels = np.array([0, 1, 1, 2])
  counts = part.class_counts(labels, [np.array([0, 1]), np.array([2, 3])], 3)
  np.testing.assert_array_equal(counts, [[1, 1, 0], [0, 1, 1]])
  assert counts.dtype == np.int64
  with pytest.raises(ValueError, match="num_classes=2"):
    part.class_counts(labels, [np.array([3])], 2)


def test_uniform_shares_are_within_1_5x_and_dirichlet_ones_are_not():
  labels = np.repeat(np.arange(10), 1000)
  def ratios(shares):
    parts = part.partition(labels, 50, kind="pathological", seed=0, num_classes=10,
                           classes_per_client=2, alpha=1.0, shares=shares)
    counts = part.class_counts(labels, parts, 10).astype(float)
    return [col[col > 0].max() / col[col > 0].min() for col in counts.T]
  # U(0.4, 0.6) draws: at most 0.6 / 0.4 = 1.5 apart, up to rounding to whole examples
  assert max(ratios("uniform")) <= 1.5 + 0.02
  assert max(ratios("dirichlet")) > 3.0


def test_split_like_gives_each_client_its_training_proportions():
  train_counts = np.array([[30, 10, 0], [0, 30, 0], [10, 0, 0]])
  test_labels = np.repeat(np.arange(3), [40, 40, 40])
  test = part.split_like(test_labels, train_counts, seed=0)
  counts = part.class_counts(test_labels, test, 3)
  np.testing.assert_array_equal(counts, [[30, 10, 0], [0, 30, 0], [10, 0, 0]])
  _check_disjoint_sorted(test, len(test_labels))
  assert test[0].tolist() == part.split_like(test_labels, train_counts, seed=0)[0].tolist()


def test_unknown_shares_are_named():
  with pytest.raises(ValueError, match="partition.shares='equal'"):
    part.partition(LABELS, 10, kind="pathological", seed=0, num_classes=10, shares="equal")
