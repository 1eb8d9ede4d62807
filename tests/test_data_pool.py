"""The run's data pool: pooled (8:2 per client) and official (train/test splits)."""
import numpy as np
import pytest

from fedjax_het import config as config_lib
from fedjax_het import validation
from fedjax_het.data import pool as pool_lib


def config(**overrides):
  c = config_lib.base_config()
  c.num_clients = 5
  return config_lib.override(c, overrides)


def load_pool(c):
  return pool_lib.load_pool(**config_lib.pool_args(c))


@pytest.fixture
def npz(tmp_path):
  rng = np.random.default_rng(0)
  path = tmp_path / "cifar10.npz"
  np.savez(path, x_train=rng.integers(0, 255, (500, 32, 32, 3), np.uint8),
           y_train=np.arange(500) % 10, x_test=rng.integers(0, 255, (100, 32, 32, 3), np.uint8),
           y_test=np.arange(100) % 10)
  return str(path)


def test_pooled_concatenates_and_subsamples_the_first_examples(npz):
  p = load_pool(config(**{"data.path": npz, "data.subsample": 550}))
  assert p.x.shape == (550, 32, 32, 3) and p.num_train == 500 and p.num_classes == 10


def test_official_keeps_the_splits_and_holds_out_validation(npz):
  c = config(**{"data.path": npz, "data.pool": "official", "data.validation": 100})
  p = load_pool(c)
  assert p.num_train == 400 and len(p.y) == 500
  train, test, counts = pool_lib.partition_clients(p.y, 10, p.num_train,
                                                   **config_lib.partition_args(c))
  flat_train, flat_test = np.concatenate(train), np.concatenate(test)
  assert flat_train.max() < 400 <= flat_test.min()  # train from train, test from test
  assert len(set(flat_train.tolist())) == len(flat_train)
  # each client tests on its own training classes, in about the same proportions
  for k in range(5):
    tr, te = counts[k, 0], counts[k, 1]
    np.testing.assert_array_equal(tr > 0, te > 0)
    np.testing.assert_allclose(te / te.sum(), tr / tr.sum(), atol=0.1)
  sub = load_pool(config(**{"data.path": npz, "data.pool": "official",
                                      "data.subsample": 300}))
  assert sub.num_train == 250 and len(sub.y) == 300  # in proportion 5:1


def test_validation_only_with_the_official_pool():
  c = config(**{"data.validation": 10})
  with pytest.raises(ValueError, match="data.validation"):
    validation.validate(c)


def test_pool_sizes_by_hand():
  # pooled: the first 550 of 500 + 100 (500 train rows, 50 test rows)
  assert pool_lib.pool_sizes(500, 100, num_clients=5, subsample=550) == (500, 50, 550)
  assert pool_lib.pool_sizes(500, 100, num_clients=5) == (500, 100, 600)
  # official: 100 held out of the train split, then 300 in proportion 400:100
  sizes = pool_lib.pool_sizes(500, 100, num_clients=5, pool="official", validation=100,
                              subsample=300)
  assert sizes == (240, 60, 240) and sizes.size == 300
  with pytest.raises(ValueError, match="data.validation=496 leaves too few of the 500"):
    pool_lib.pool_sizes(500, 100, num_clients=5, pool="official", validation=496)
  with pytest.raises(ValueError, match="data.public=595 leaves too few of the 600"):
    pool_lib.pool_sizes(500, 100, num_clients=5, public=595)
  with pytest.raises(ValueError, match="num_clients=5 exceeds the 4 examples"):
    pool_lib.pool_sizes(500, 100, num_clients=5, subsample=4)


def test_the_pool_keeps_its_own_guard(npz):
  # a dataset of unknown sizes passes validation; reading it applies the same check
  c = config(**{"data.path": npz, "data.name": "mine", "data.pool": "official",
                "data.validation": 496})
  validation.validate(c)
  with pytest.raises(ValueError, match="data.validation=496 leaves too few of the 500"):
    load_pool(c)
  c = config(**{"data.path": npz, "data.name": "mine", "num_clients": 12,
                "data.subsample": 10})
  validation.validate(c)
  with pytest.raises(ValueError, match="num_clients=12 exceeds the 10 examples"):
    pool_lib.load_clients(**config_lib.data_args(c))
