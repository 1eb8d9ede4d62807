"""Data sources: where a dataset is read from, npz/TFDS loading and validation."""
import os
import sys
import types

import numpy as np
import pytest

from fedjax_het.data import sources
from fedjax_het.data.sources import DataFormatError
from fedjax_het.data.sources import DataNotFoundError

THREE_WAYS = r"config\.data\.path.*FEDJAX_HET_DATA.*pip install -e '\.\[tfds\]'"


def _arrays(n_train=6, n_test=4, num_classes=10):
  raw = sources.make_synthetic(n_train, n_test, num_classes, seed=0)
  return dict(x_train=raw.x_train, y_train=raw.y_train, x_test=raw.x_test,
              y_test=raw.y_test)


def _write(path, **arrays):
  np.savez(path, **arrays)
  return str(path)


# --- resolve_source -------------------------------------------------------------------

def test_path_to_npz_file(tmp_path):
  f = _write(tmp_path / "anything.npz", **_arrays())
  assert sources.resolve_source("cifar10", f, environ={}) == ("npz", f)


def test_path_to_dir_holding_npz(tmp_path):
  f = _write(tmp_path / "cifar10.npz", **_arrays())
  assert sources.resolve_source("cifar10", str(tmp_path), environ={}) == ("npz", f)


def test_path_to_dir_without_npz_is_tfds_data_dir(tmp_path):
  _write(tmp_path / "cifar10.npz", **_arrays())
  assert sources.resolve_source("cifar100", str(tmp_path), environ={}) == (
      "tfds", str(tmp_path))


def test_path_wins_over_env(tmp_path):
  f = _write(tmp_path / "a.npz", **_arrays())
  env = {"FEDJAX_HET_DATA": str(tmp_path / "nowhere")}
  assert sources.resolve_source("cifar10", f, environ=env) == ("npz", f)


def test_env_dir_holding_npz(tmp_path):
  f = _write(tmp_path / "cifar10.npz", **_arrays())
  env = {"FEDJAX_HET_DATA": str(tmp_path)}
  assert sources.resolve_source("cifar10", "", environ=env) == ("npz", f)


def test_no_path_no_env_is_tfds_default():
  assert sources.resolve_source("cifar10", "", environ={}) == ("tfds", None)
  assert sources.resolve_source("cifar10", "", environ={"FEDJAX_HET_DATA": ""}) == (
      "tfds", None)


def test_missing_path_explains_three_ways(tmp_path):
  with pytest.raises(DataNotFoundError, match=r"does not exist.*" + THREE_WAYS):
    sources.resolve_source("cifar10", str(tmp_path / "missing"), environ={})


def test_env_without_file_explains_three_ways(tmp_path):
  env = {"FEDJAX_HET_DATA": str(tmp_path)}
  with pytest.raises(DataNotFoundError,
                     match=r"does not hold cifar100\.npz.*" + THREE_WAYS):
    sources.resolve_source("cifar100", "", environ=env)


def test_data_not_found_is_a_file_not_found_error():
  assert issubclass(DataNotFoundError, FileNotFoundError)
  assert issubclass(DataFormatError, ValueError)


def test_path_to_non_npz_file(tmp_path):
  f = tmp_path / "data.txt"
  f.write_text("x")
  with pytest.raises(DataFormatError, match=r"not an \.npz"):
    sources.resolve_source("cifar10", str(f), environ={})


def test_unknown_name_lists_valid():
  with pytest.raises(ValueError, match=r"'mnist'.*\['cifar10', 'cifar100'\]"):
    sources.resolve_source("mnist", "", environ={})


# --- load_npz -------------------------------------------------------------------------

def test_load_npz_round_trip_and_int32(tmp_path):
  a = _arrays()
  a["y_train"] = a["y_train"].astype(np.uint8).reshape(-1, 1)  # (n, 1) is accepted
  a["label_names"] = np.array(["x"] * 10)  # extra arrays are ignored
  raw = sources.load_npz(_write(tmp_path / "d.npz", **a), "cifar10")
  assert raw.num_classes == 10
  assert raw.x_train.shape == (6, 32, 32, 3) and raw.x_train.dtype == np.uint8
  assert raw.y_train.shape == (6,) and raw.y_train.dtype == np.int32
  np.testing.assert_array_equal(raw.y_train, a["y_train"][:, 0])
  np.testing.assert_array_equal(raw.x_test, a["x_test"])


def test_cifar100_uses_fine_labels(tmp_path):
  a = _arrays(num_classes=100)
  a.update(y_train_fine=np.array([99, 98, 0, 1, 50, 7]),
           y_test_fine=np.array([5, 6, 7, 80]),
           y_train=np.zeros(6, np.int64), y_test=np.ones(4, np.int64))  # coarse labels
  raw = sources.load_npz(_write(tmp_path / "c.npz", **a), "cifar100")
  np.testing.assert_array_equal(raw.y_train, [99, 98, 0, 1, 50, 7])
  np.testing.assert_array_equal(raw.y_test, [5, 6, 7, 80])
  assert raw.num_classes == 100


def test_cifar100_without_fine_uses_plain_labels(tmp_path):
  a = _arrays(num_classes=100)
  raw = sources.load_npz(_write(tmp_path / "c.npz", **a), "cifar100")
  np.testing.assert_array_equal(raw.y_train, a["y_train"])


def _bad(key, value):
  def edit(a):
    if value is None:
      del a[key]
    else:
      a[key] = value(a[key])
    return a
  return edit


@pytest.mark.parametrize("edit,match", [
    (_bad("y_test", None), r"missing arrays \['y_test'\].*holds \['x_test', 'x_train', "
                           r"'y_train'\]"),
    (_bad("x_train", lambda x: x[:, :28, :28]), r"x_train has shape \(6, 28, 28, 3\); "
                                               r"expected \[n, 32, 32, 3\]"),
    (_bad("x_test", lambda x: x[..., 0]), r"x_test has shape \(4, 32, 32\)"),
    (_bad("x_train", lambda x: x.astype(np.float32) / 255), r"x_train has dtype float32; "
                                                            r"expected uint8"),
    (_bad("y_train", lambda y: y[:5]), r"y_train has 5 labels but the images have 6 rows"),
    (_bad("y_test", lambda y: y + 10), r"y_test has labels in \[1\d, 1\d\]; expected "
                                       r"labels in \[0, 10\)"),
    (_bad("y_test", lambda y: y - 10), r"y_test has labels in \[-\d+, -\d+\]"),
    (_bad("y_train", lambda y: y.astype(np.float32)), r"y_train has dtype float32; "
                                                      r"expected integer"),
    (_bad("y_train", lambda y: np.stack([y, y], 1)), r"y_train has shape \(6, 2\); "
                                                     r"expected \(n,\) or \(n, 1\)"),
])
def test_npz_validation_errors(tmp_path, edit, match):
  f = _write(tmp_path / "bad.npz", **edit(_arrays()))
  with pytest.raises(DataFormatError, match=match):
    sources.load_npz(f, "cifar10")


def test_unreadable_npz(tmp_path):
  f = tmp_path / "broken.npz"
  f.write_bytes(b"not a zip file at all")
  with pytest.raises(DataFormatError, match="not a readable .npz"):
    sources.load_npz(str(f), "cifar10")


def test_npz_with_object_array(tmp_path):
  a = _arrays()
  a["y_train"] = np.array([1, 2, 3, 4, 5, 6], dtype=object)
  f = str(tmp_path / "obj.npz")
  np.savez(f, **a)
  with pytest.raises(DataFormatError, match=r"cannot read array 'y_train'"):
    sources.load_npz(f, "cifar10")


def test_single_array_file_named_npz(tmp_path):
  f = tmp_path / "one.npz"
  with open(f, "wb") as fh:
    np.save(fh, np.zeros(3))
  with pytest.raises(DataFormatError, match="single array, not an .npz archive"):
    sources.load_npz(str(f), "cifar10")

def test_load_npz_missing_file(tmp_path):
  with pytest.raises(DataNotFoundError, match=THREE_WAYS):
    sources.load_npz(str(tmp_path / "none.npz"), "cifar10")


def test_load_dataset_via_env(tmp_path):
  a = _arrays()
  _write(tmp_path / "cifar10.npz", **a)
  raw = sources.load_dataset("cifar10", environ={"FEDJAX_HET_DATA": str(tmp_path)})
  order = sources.canonical_order(a["x_test"], a["y_test"])
  np.testing.assert_array_equal(raw.y_test, a["y_test"][order])  # canonical row order
  assert raw.source == f"npz:{tmp_path / 'cifar10.npz'}" and len(raw.fingerprint) == 16


def test_npz_and_tfds_in_other_orders_give_the_same_rows_and_partition(tmp_path,
                                                                         monkeypatch):
  from fedjax_het import config as config_lib
  from fedjax_het.data import pool as pool_lib
  raw = sources.make_synthetic(300, 100, 10, seed=1)
  _write(tmp_path / "cifar10.npz", x_train=raw.x_train, y_train=raw.y_train,
         x_test=raw.x_test, y_test=raw.y_test)
  rng = np.random.default_rng(5)
  tr, te = rng.permutation(300), rng.permutation(100)  # TFDS lists them otherwise
  _fake_tfds(monkeypatch, lambda: [(raw.x_train[tr], raw.y_train[tr].astype(np.int64)),
                                   (raw.x_test[te], raw.y_test[te])])
  tfds_dir = tmp_path / "tfds"
  tfds_dir.mkdir()
  from_npz = sources.load_dataset("cifar10", str(tmp_path / "cifar10.npz"))
  from_tfds = sources.load_dataset("cifar10", str(tfds_dir))
  assert from_tfds.source.startswith("tfds:") and from_npz.source.startswith("npz:")
  for a, b in zip(from_npz[:4], from_tfds[:4]):
    np.testing.assert_array_equal(a, b)
  assert from_npz.fingerprint == from_tfds.fingerprint
  parts = []
  for path in (str(tmp_path / "cifar10.npz"), str(tfds_dir)):
    c = config_lib.override(config_lib.base_config(), {"data.path": path, "num_clients": 4})
    p = pool_lib.load_pool(**config_lib.pool_args(c))
    parts.append(pool_lib.partition_clients(p.y, p.num_classes, p.num_train,
                                            **config_lib.partition_args(c))[:2])
  for a, b in zip(*[sum(p, []) for p in parts]):
    np.testing.assert_array_equal(a, b)


# --- load_tfds (a fake tensorflow_datasets module; TFDS is an optional extra) ----------

def _fake_tfds(monkeypatch, load):
  calls = []
  def record(*args, **kwargs):
    calls.append((args, kwargs))
    return load()
  fake = types.SimpleNamespace(load=record, as_numpy=lambda tree: tree)
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", fake)
  return calls


def test_load_tfds_without_tfds_installed(monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # import raises
  with pytest.raises(DataNotFoundError, match=r"needs tensorflow_datasets.*" + THREE_WAYS):
    sources.load_tfds("cifar10", None)


def test_load_tfds_reads_supervised_splits(monkeypatch):
  a = _arrays()
  splits = [(a["x_train"], a["y_train"].astype(np.int64)), (a["x_test"], a["y_test"])]
  calls = _fake_tfds(monkeypatch, lambda: splits)
  raw = sources.load_tfds("cifar10", "/some/dir")
  np.testing.assert_array_equal(raw.y_train, a["y_train"])
  assert raw.y_train.dtype == np.int32
  assert calls == [(("cifar10",), dict(split=["train", "test"], data_dir="/some/dir",
                                       batch_size=-1, as_supervised=True, download=False))]
  sources.load_tfds("cifar10", None)
  assert calls[-1][1]["download"] is True


def test_load_tfds_validates(monkeypatch):
  a = _arrays()
  _fake_tfds(monkeypatch, lambda: [(a["x_train"], a["y_train"] + 10),
                                   (a["x_test"], a["y_test"])])
  with pytest.raises(DataFormatError, match=r"tfds:cifar10: y_train has labels"):
    sources.load_tfds("cifar10", None)


def test_load_tfds_missing_data_explains(monkeypatch):
  def missing():
    raise AssertionError("Dataset cifar10: could not find data in /d")
  _fake_tfds(monkeypatch, missing)
  with pytest.raises(DataNotFoundError, match=r"could not find data.*" + THREE_WAYS):
    sources.load_tfds("cifar10", "/d")


def test_load_tfds_other_errors_propagate(monkeypatch):
  def bug():
    raise TypeError("a bug")
  _fake_tfds(monkeypatch, bug)
  with pytest.raises(TypeError, match="a bug"):
    sources.load_tfds("cifar10", "/d")


def test_load_dataset_dispatches_to_tfds(monkeypatch, tmp_path):
  a = _arrays()
  calls = _fake_tfds(monkeypatch, lambda: [(a["x_train"], a["y_train"]),
                                           (a["x_test"], a["y_test"])])
  sources.load_dataset("cifar10", str(tmp_path), environ={})
  assert calls[0][1]["data_dir"] == str(tmp_path)


# --- make_synthetic -------------------------------------------------------------------

def test_synthetic_is_deterministic_balanced_and_learnable():
  a = sources.make_synthetic(200, 100, 4, seed=1)
  b = sources.make_synthetic(200, 100, 4, seed=1)
  c = sources.make_synthetic(200, 100, 4, seed=2)
  np.testing.assert_array_equal(a.x_train, b.x_train)
  assert not np.array_equal(a.x_train, c.x_train)
  assert a.x_train.dtype == np.uint8 and a.y_train.dtype == np.int32
  np.testing.assert_array_equal(np.bincount(a.y_train), [50, 50, 50, 50])
  # Nearest class mean (fit on train) classifies the test split.
  x_tr, x_te = (v.reshape(len(v), -1).astype(np.float32) for v in (a.x_train, a.x_test))
  means = np.stack([x_tr[a.y_train == k].mean(0) for k in range(4)])
  pred = np.argmin(((x_te[:, None] - means[None]) ** 2).sum(-1), axis=1)
  assert np.mean(pred == a.y_test) > 0.95
  assert sources.make_synthetic(3, 2, 2, seed=0, image_shape=(8, 8, 1)).x_test.shape == (
      2, 8, 8, 1)


# --- the real CIFAR-10 ----------------------------------------------------------------

def test_real_cifar10_npz():
  data_dir = os.environ.get("FEDJAX_HET_DATA", "")
  if not data_dir or not os.path.isfile(os.path.join(data_dir, "cifar10.npz")):
    pytest.skip("set FEDJAX_HET_DATA to a directory holding cifar10.npz")
  raw = sources.load_dataset("cifar10")
  assert raw.x_train.shape == (50000, 32, 32, 3) and raw.x_train.dtype == np.uint8
  assert raw.x_test.shape == (10000, 32, 32, 3) and raw.x_test.dtype == np.uint8
  assert raw.y_train.shape == (50000,) and raw.y_train.dtype == np.int32
  assert raw.y_test.shape == (10000,) and raw.y_test.dtype == np.int32
  np.testing.assert_array_equal(np.bincount(raw.y_train), [5000] * 10)
  np.testing.assert_array_equal(np.bincount(raw.y_test), [1000] * 10)
  assert raw.num_classes == 10

