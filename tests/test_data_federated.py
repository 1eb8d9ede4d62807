"""The padded device-side view: groups by architecture, padded index tables, unpadding."""
import dataclasses

import jax
import numpy as np
import pytest

from fedjax_het import data as data_lib
from fedjax_het.data.federated import ClientIndex
from fedjax_het.data.federated import FederatedData
from fedjax_het.data.federated import Layout
from fedjax_het.data.federated import build_federated_data
from fedjax_het.data.federated import group_clients
from fedjax_het.data.federated import pad_table
from fedjax_het.data.federated import unpad_clients

ARCHS = ["cnn1", "cnn2", "cnn3", "cnn4", "cnn5", "cnn1", "cnn2", "cnn3", "cnn4", "cnn5",
         "cnn1"]


def _tiny():
  """10 pooled examples, 3 clients: archs a, b, a."""
  x = np.arange(10, dtype=np.uint8)[:, None, None, None] * np.ones((1, 32, 32, 3), np.uint8)
  y = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0])
  train = [np.array([0, 1, 2]), np.array([3, 4]), np.array([5])]
  test = [np.array([6]), np.array([7, 8]), np.array([9])]
  return x, y, train, test, ["a", "b", "a"]


def test_group_clients_orders_by_first_appearance():
  archs, ids = group_clients(ARCHS)
  assert archs == ("cnn1", "cnn2", "cnn3", "cnn4", "cnn5")
  assert ids == ((0, 5, 10), (1, 6), (2, 7), (3, 8), (4, 9))
  assert group_clients(["b", "a", "b"]) == (("b", "a"), ((0, 2), (1,)))


def test_pad_table_by_hand():
  idx, mask, counts = pad_table([np.array([4, 5, 6]), np.array([7])], 3, 2)
  np.testing.assert_array_equal(idx, [[4, 5, 6, 0], [7, 0, 0, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(mask, [[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
  np.testing.assert_array_equal(counts, [3, 1, 0])
  assert idx.dtype == np.int32 and mask.dtype == bool and counts.dtype == np.int32


def test_build_pads_clients_and_examples():
  x, y, train, test, archs = _tiny()
  fed, layout = build_federated_data(x, y, train, test, archs, num_classes=3,
                                     pad_clients_to=4, pad_examples_to=2)
  assert layout == Layout(archs=("a", "b"), client_ids=((0, 2), (1,)),
                          padded_sizes=(4, 4), num_clients=3, num_classes=3)
  a, b = fed.groups
  # group a = clients 0 and 2 (+2 dummies); max_train 3 -> 4, max_test 1 -> 2.
  np.testing.assert_array_equal(a.train_idx, [[0, 1, 2, 0], [5, 0, 0, 0], [0] * 4, [0] * 4])
  np.testing.assert_array_equal(a.train_mask, [[1, 1, 1, 0], [1, 0, 0, 0], [0] * 4,
                                               [0] * 4])
  np.testing.assert_array_equal(a.test_idx, [[6, 0], [9, 0], [0, 0], [0, 0]])
  np.testing.assert_array_equal(a.num_train, [3, 1, 0, 0])
  np.testing.assert_array_equal(a.num_test, [1, 1, 0, 0])
  # group b = client 1 (+3 dummies); max_train 2, max_test 2.
  assert b.train_idx.shape == (4, 2) and b.test_idx.shape == (4, 2)
  np.testing.assert_array_equal(b.test_mask, [[1, 1], [0, 0], [0, 0], [0, 0]])
  assert fed.x.shape == (10, 32, 32, 3) and fed.x.dtype == np.uint8
  assert fed.y.dtype == np.int32


def test_no_padding_keeps_exact_shapes():
  x, y, train, test, archs = _tiny()
  fed, layout = build_federated_data(x, y, train, test, archs, num_classes=3)
  assert layout.padded_sizes == (2, 1)
  assert fed.groups[0].train_idx.shape == (2, 3) and fed.groups[1].train_idx.shape == (1, 2)


def test_layout_is_static_and_data_is_a_pytree():
  x, y, train, test, archs = _tiny()
  fed, layout = build_federated_data(x, y, train, test, archs, num_classes=3,
                                     pad_clients_to=4)
  hash(layout)
  assert jax.tree.leaves(layout) == [layout]  # not a pytree: fine as a static argument
  with pytest.raises(dataclasses.FrozenInstanceError):
    layout.num_clients = 5
  assert len(jax.tree.leaves(fed)) == 2 + 6 * 2
  copied = jax.tree.map(np.copy, fed)
  assert isinstance(copied, FederatedData) and isinstance(copied.groups[0], ClientIndex)
  assert layout.num_groups == 2 and layout.group_sizes == (2, 1)
  assert [layout.group_of(k) for k in range(3)] == [(0, 0), (1, 0), (0, 1)]
  with pytest.raises(ValueError, match=r"client_id=3 is not in \[0, 3\)"):
    layout.group_of(3)


def test_unpad_clients_orders_by_client_id():
  _, ids = group_clients(ARCHS)
  layout = Layout(archs=tuple(f"cnn{i}" for i in range(1, 6)), client_ids=ids,
                  padded_sizes=(4, 4, 4, 4, 4), num_clients=11, num_classes=10)
  # The value of a client is its id; dummy clients hold -1.
  per_group = [np.array(list(g) + [-1] * (4 - len(g)), float) for g in ids]
  np.testing.assert_array_equal(unpad_clients(per_group, layout), np.arange(11))
  with pytest.raises(ValueError, match=r"group 0: leading axis \(3,\) must be the padded"):
    unpad_clients([np.zeros(3)] + per_group[1:], layout)
  with pytest.raises(ValueError, match="expected one per group"):
    unpad_clients(per_group[:2], layout)


def test_unpad_keeps_trailing_axes():
  layout = Layout(("a", "b"), ((0, 2), (1,)), (2, 2), 3, 3)
  out = unpad_clients([np.array([[0, 0], [2, 2]]), np.array([[1, 1], [9, 9]])], layout)
  np.testing.assert_array_equal(out, [[0, 0], [1, 1], [2, 2]])


@pytest.mark.parametrize("edit,match", [
    (lambda a: a.update(archs=["a", "b"]), r"3 train_indices, 3 test_indices and 2 "
                                           r"client_archs"),
    (lambda a: a.update(test=a["test"][:2]), r"3 train_indices, 2 test_indices"),
    (lambda a: a.update(y=a["y"][:9]), r"x has 10 examples but y has 9"),
    (lambda a: a.update(train=[np.array([0]), np.array([10]), np.array([1])]),
     r"client 1: train indices must lie in \[0, 10\)"),
    (lambda a: a.update(y=a["y"] + 1), r"labels lie in \[1, 3\]; expected \[0, "
                                       r"num_classes=3\)"),
])
def test_build_validates(edit, match):
  x, y, train, test, archs = _tiny()
  args = dict(x=x, y=y, train=train, test=test, archs=archs)
  edit(args)
  with pytest.raises(ValueError, match=match):
    build_federated_data(args["x"], args["y"], args["train"], args["test"], args["archs"],
                         num_classes=3)


def test_layout_rejects_inconsistent_groups():
  with pytest.raises(ValueError, match="exactly once"):
    Layout(("a",), ((0, 0),), (2,), 2, 3)
  with pytest.raises(ValueError, match="padded size 1 < 2"):
    Layout(("a",), ((0, 1),), (1,), 2, 3)


def test_end_to_end_from_synthetic():
  raw = data_lib.make_synthetic(300, 100, 10, seed=0)
  x = np.concatenate([raw.x_train, raw.x_test])
  y = np.concatenate([raw.y_train, raw.y_test])
  parts = data_lib.partition(y, 11, kind="pathological", seed=0, num_classes=10)
  train, test = data_lib.train_test_split(parts, seed=0)
  fed, layout = data_lib.build_federated_data(x, y, train, test, ARCHS, num_classes=10,
                                              pad_clients_to=4, pad_examples_to=16)
  assert layout.padded_sizes == (4, 4, 4, 4, 4) and layout.group_sizes == (3, 2, 2, 2, 2)
  for g, index in enumerate(fed.groups):
    assert index.train_idx.shape[1] % 16 == 0 and index.test_idx.shape[1] % 16 == 0
    for pos, k in enumerate(layout.client_ids[g]):
      got = index.train_idx[pos][index.train_mask[pos]]
      np.testing.assert_array_equal(got, train[k])
      assert index.num_test[pos] == len(test[k])
  num_train = unpad_clients([i.num_train for i in fed.groups], layout)
  np.testing.assert_array_equal(num_train, [len(t) for t in train])
