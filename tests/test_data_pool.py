"""The run's data pool: pooled (8:2 per client) and official (train/test splits)."""
import numpy as np
import pytest

from fedjax_het import config as config_lib
from fedjax_het.data import pool as pool_lib


def config(**overrides):
  c = config_lib.base_config()
  c.num_clients = 5
  return config_lib.override(c, overrides)


@pytest.fixture
def npz(tmp_path):
  rng = np.random.default_rng(0)
  path = tmp_path / "cifar10.npz"
  np.savez(path, x_train=rng.integers(0, 255, (500, 32, 32, 3), np.uint8),
           y_train=np.arange(500) % 10, x_test=rng.integers(0, 255, (100, 32, 32, 3), np.uint8),
           y_test=np.arange(100) % 10)
  return str(path)


def test_pooled_concatenates_and_subsamples_the_first_examples(npz):
  p = pool_lib.load_pool(config(**{"data.path": npz, "data.subsample": 550}))
  assert p.x.shape == (550, 32, 32, 3) and p.num_train == 500 and p.num_classes == 10


def test_official_keeps_the_splits_and_holds_out_validation(npz):
  c = config(**{"data.path": npz, "data.pool": "official", "data.validation": 100})
  p = pool_lib.load_pool(c)
  assert p.num_train == 400 and len(p.y) == 500
  train, test, counts = pool_lib.partition_clients(c, p.y, 10, p.num_train)
  flat_train, flat_test = np.concatenate(train), np.concatenate(test)
  assert flat_train.max() < 400 <= flat_test.min()  # train from train, test from test
  assert len(set(flat_train.tolist())) == len(flat_train)
  # each client tests on its own training classes, in about the same proportions
  for k in range(5):
    tr, te = counts[k, 0], counts[k, 1]
    np.testing.assert_array_equal(tr > 0, te > 0)
    np.testing.assert_allclose(te / te.sum(), tr / tr.sum(), atol=0.1)
  sub = pool_lib.load_pool(config(**{"data.path": npz, "data.pool": "official",
                                      "data.subsample": 300}))
  assert sub.num_train == 250 and len(sub.y) == 300  # in proportion 5:1


def test_validation_only_with_the_official_pool():
  c = config(**{"data.validation": 10})
  with pytest.raises(ValueError, match="data.validation"):
    config_lib.validate(c)
