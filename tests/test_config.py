"""Config validation: bad values are rejected with the key and the valid choices."""
import pytest

from fedjax_het import config as config_lib


def _cfg(**overrides):
  return config_lib.override(config_lib.base_config(), overrides)


def test_base_config_is_valid():
  config_lib.validate(_cfg())


@pytest.mark.parametrize("key,value,match", [
    ("algorithm", "fedsgd", r"algorithm.*valid choices.*fedavg"),
    ("models", "resnet", r"models.*valid values.*cnn1"),
    ("models", "cnn1,vgg", r"models.*comma-separated"),
    ("participation", 0.0, r"participation.*> 0"),
    ("participation", 1.5, r"participation.*<= 1"),
    ("partition.classes_per_client", 11, r"classes_per_client.*<= 10"),
    ("partition.kind", "shards", r"partition.kind.*iid"),
    ("data.name", "my data/x", r"data.name.*cifar10"),  # any other name: data.path
    ("num_clients", 0, r"num_clients.*>= 1"),
    ("num_rounds", 0, r"num_rounds.*>= 1"),
    ("learning_rate", -1.0, r"learning_rate"),
    ("runtime.client_parallelism", "pmap", r"client_parallelism.*vmap"),
    ("runtime.compute_dtype", "float16", r"compute_dtype.*bfloat16"),
])
def test_bad_values_name_key_and_choices(key, value, match):
  with pytest.raises(ValueError, match=match):
    config_lib.validate(_cfg(**{key: value}))


def test_cifar100_allows_ten_classes_per_client():
  config_lib.validate(_cfg(**{"data.name": "cifar100", "partition.classes_per_client": 10}))


def test_unknown_keys_are_listed():
  c = _cfg()
  c.unlock() if hasattr(c, "unlock") else None
  c.num_client = 3
  with pytest.raises(ValueError, match=r"unknown config keys \['num_client'\]"):
    config_lib.validate(c)


def test_unknown_algo_key():
  c = _cfg()
  c.algo.d1 = 100
  with pytest.raises(ValueError, match=r"algo.d1"):
    config_lib.validate(c)


def test_fedavg_refuses_heterogeneous_models():
  with pytest.raises(ValueError, match="model-homogeneous"):
    config_lib.validate(_cfg(algorithm="fedavg", models="heterogeneous"))


def test_variants():
  c = config_lib.apply_variant(_cfg(), "smoke")
  assert c.num_rounds == 3 and c.data.subsample_per_class == 100 and c.data.subsample == 0
  cpu = config_lib.apply_variant(_cfg(), "cpu")
  assert (cpu.num_clients, cpu.num_rounds, cpu.data.subsample) == (10, 20, 6000)
  assert (cpu.momentum, cpu.weight_decay, cpu.grad_clip) == (0.9, 1e-3, 50.0)
  config_lib.validate(cpu)
  with pytest.raises(ValueError, match="valid: \\['cpu', 'smoke'\\]"):
    config_lib.apply_variant(_cfg(), "tiny")
