"""The dataset cache (fedjax_het.data.cache) as ``sources.load_dataset`` uses it."""
import os

import numpy as np
import pytest

from fedjax_het.data import cache
from fedjax_het.data import sources


def _npz(path, seed=0, n_train=30, n_test=10):
  raw = sources.make_synthetic(n_train, n_test, 10, seed=seed)
  np.savez(path, x_train=raw.x_train, y_train=raw.y_train, x_test=raw.x_test,
           y_test=raw.y_test)
  return str(path)


def _env(tmp_path, cache_dir):
  return {"FEDJAX_HET_DATA": str(tmp_path), cache.ENV_VAR: str(cache_dir)}


def _assert_same(a: sources.RawData, b: sources.RawData):
  for field in a._fields:
    x, y = getattr(a, field), getattr(b, field)
    if isinstance(x, np.ndarray):
      assert x.dtype == y.dtype, field
      np.testing.assert_array_equal(x, y, err_msg=field)
    else:
      assert x == y, field


def _entries(cache_dir):
  return sorted(e for e in os.listdir(cache_dir) if not e.startswith("."))


def test_a_cached_load_equals_the_source_and_maps_the_entry(tmp_path):
  _npz(tmp_path / "cifar10.npz")
  plain = sources.load_dataset("cifar10", environ={"FEDJAX_HET_DATA": str(tmp_path)})
  first = sources.load_dataset("cifar10", environ=_env(tmp_path, tmp_path / "c"))
  assert len(_entries(tmp_path / "c")) == 1  # the first reader wrote the entry
  again = sources.load_dataset("cifar10", environ=_env(tmp_path, tmp_path / "c"))
  for raw in (first, again):
    _assert_same(plain, raw)
    assert not raw.x_train.flags.writeable  # read-only views of the memory maps
    assert isinstance(raw.x_train.base, np.memmap) and type(raw.x_train) is np.ndarray


def test_a_hit_reads_nothing_but_the_entry(tmp_path, monkeypatch):
  _npz(tmp_path / "cifar10.npz")
  sources.load_dataset("cifar10", environ=_env(tmp_path, tmp_path / "c"))

  def no_decoding(*args, **kwargs):
    raise AssertionError("decoded the npz again")
  monkeypatch.setattr(sources, "load_npz", no_decoding)
  monkeypatch.setattr(sources, "canonical", no_decoding)
  sources.load_dataset("cifar10", environ=_env(tmp_path, tmp_path / "c"))


def test_an_edited_file_is_a_new_entry(tmp_path):
  path = _npz(tmp_path / "cifar10.npz", seed=0)
  env = _env(tmp_path, tmp_path / "c")
  before = sources.load_dataset("cifar10", environ=env)
  stat = os.stat(path)
  _npz(path, seed=1)  # same name and size, other images
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # same time stamp too
  after = sources.load_dataset("cifar10", environ=env)
  assert before.fingerprint != after.fingerprint
  _assert_same(sources.load_dataset("cifar10", environ={"FEDJAX_HET_DATA": str(tmp_path)}),
               after)
  assert len(_entries(tmp_path / "c")) == 2


def test_the_entry_depends_on_the_name_and_classes(tmp_path):
  path = _npz(tmp_path / "digits.npz")
  keys = {cache.entry_dir("c", path, name, k) for name in ("digits", "other")
          for k in (0, 10)}
  assert len(keys) == 4


def test_an_incomplete_entry_is_rewritten(tmp_path):
  _npz(tmp_path / "cifar10.npz")
  env = _env(tmp_path, tmp_path / "c")
  first = sources.load_dataset("cifar10", environ=env)
  (entry,) = _entries(tmp_path / "c")
  os.remove(tmp_path / "c" / entry / "x_test.npy")  # a disk that filled up, say
  _assert_same(first, sources.load_dataset("cifar10", environ=env))
  assert "x_test.npy" in os.listdir(tmp_path / "c" / entry)


def test_an_unwritable_cache_warns_and_reads_the_source(tmp_path):
  _npz(tmp_path / "cifar10.npz")
  (tmp_path / "c").write_text("a file where the cache directory should be")
  plain = sources.load_dataset("cifar10", environ={"FEDJAX_HET_DATA": str(tmp_path)})
  with pytest.warns(UserWarning, match="not writable"):
    raw = sources.load_dataset("cifar10", environ=_env(tmp_path, tmp_path / "c"))
  _assert_same(plain, raw)


def test_write_keeps_another_process_s_whole_entry(tmp_path):
  arrays, meta = {"a": np.arange(3)}, {"k": 1}
  entry = str(tmp_path / "e")
  assert cache.write(entry, arrays, meta)
  assert cache.write(entry, {"a": np.arange(3) + 1}, meta)  # written meanwhile: kept
  got, got_meta = cache.read(entry, ["a"])
  np.testing.assert_array_equal(got["a"], np.arange(3))
  assert got_meta == meta and os.listdir(tmp_path) == ["e"]  # no temporary left


def test_without_the_variable_nothing_is_cached(tmp_path):
  _npz(tmp_path / "cifar10.npz")
  raw = sources.load_dataset("cifar10", environ={"FEDJAX_HET_DATA": str(tmp_path)})
  assert raw.x_train.flags.writeable and os.listdir(tmp_path) == ["cifar10.npz"]
