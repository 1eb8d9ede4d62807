"""The config: a leaf module of defaults, and its validation (bad values are rejected
with the key and the valid choices, data sizes before any data is read)."""
import ast
import glob
import os
import subprocess
import sys

import pytest

from fedjax_het import config as config_lib
from fedjax_het import validation


def _cfg(**overrides):
  return config_lib.override(config_lib.base_config(), overrides)


def test_base_config_is_valid():
  validation.validate(_cfg())


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
    validation.validate(_cfg(**{key: value}))


def test_cifar100_allows_ten_classes_per_client():
  validation.validate(_cfg(**{"data.name": "cifar100", "partition.classes_per_client": 10}))


def test_unknown_keys_are_listed():
  c = _cfg()
  c.unlock() if hasattr(c, "unlock") else None
  c.num_client = 3
  with pytest.raises(ValueError, match=r"unknown config keys \['num_client'\]"):
    validation.validate(c)


def test_unknown_algo_key():
  c = _cfg()
  c.algo.d1 = 100
  with pytest.raises(ValueError, match=r"algo.d1"):
    validation.validate(c)


def test_fedavg_refuses_heterogeneous_models():
  with pytest.raises(ValueError, match="model-homogeneous"):
    validation.validate(_cfg(algorithm="fedavg", models="heterogeneous"))


def test_variants():
  c = config_lib.apply_variant(_cfg(), "smoke")
  assert c.num_rounds == 3 and c.data.subsample_per_class == 100 and c.data.subsample == 0
  cpu = config_lib.apply_variant(_cfg(), "cpu")
  assert (cpu.num_clients, cpu.num_rounds, cpu.data.subsample) == (10, 20, 6000)
  assert (cpu.momentum, cpu.weight_decay, cpu.grad_clip) == (0.9, 1e-3, 50.0)
  validation.validate(cpu)
  with pytest.raises(ValueError, match="valid: \\['cpu', 'smoke'\\]"):
    config_lib.apply_variant(_cfg(), "tiny")


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_config_module_imports_nothing_of_the_library():
  tree = ast.parse(open(os.path.join(ROOT, "fedjax_het", "config.py")).read())
  imported = {alias.name.split(".")[0] for node in tree.body
              if isinstance(node, ast.Import) for alias in node.names}
  imported |= {node.module.split(".")[0] for node in tree.body
               if isinstance(node, ast.ImportFrom)}
  assert imported <= {"__future__", "ml_collections"}, imported
  nested = [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
            and node not in tree.body]
  assert not nested  # none hidden in a function either


def test_experiment_config_files_load_without_the_library():
  files = sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py")))
  configs = [f for f in files if "def get_config" in open(f).read()]
  assert len(configs) >= 10
  code = f"""
import importlib.util, sys
for path in {configs!r}:
  spec = importlib.util.spec_from_file_location("cfg", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  for arg in (None, "smoke", "cpu"):
    assert module.get_config(arg).algorithm, path
loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("fedjax_het", "jax"))
assert loaded == ["fedjax_het", "fedjax_het.config"], loaded
"""
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                       text=True, env=dict(os.environ, PYTHONPATH=ROOT))
  assert out.returncode == 0, out.stderr[-2000:]


def test_data_args_are_the_data_layers_keywords():
  import inspect

  from fedjax_het.data import pool as pool_lib
  c = _cfg()
  for fn, args in ((pool_lib.load_pool, config_lib.pool_args(c)),
                   (pool_lib.partition_clients, config_lib.partition_args(c)),
                   (pool_lib.load_clients, config_lib.data_args(c))):
    params = inspect.signature(fn).parameters
    assert set(args) <= set(params), (fn.__name__, set(args) - set(params))
    assert {k for k, p in params.items() if p.kind is p.KEYWORD_ONLY} <= set(args), fn


@pytest.mark.parametrize("overrides,match", [
    ({"data.public": 59995}, r"data.public=59995 leaves too few of the 60000 examples"),
    ({"data.pool": "official", "data.validation": 49995},
     r"data.validation=49995 leaves too few of the 50000 training examples"),
    ({"data.pool": "official", "data.public": 49995},
     r"data.public=49995 leaves too few of the 50000 examples"),
    ({"data.subsample": 8, "partition.kind": "iid"}, r"num_clients=10 exceeds the 8"),
    ({"data.subsample_per_class": 1, "num_clients": 12}, r"num_clients=12 exceeds the 10"),
])
def test_data_sizes_are_checked_before_any_data_is_read(overrides, match):
  c = _cfg(**{"data.path": "/nonexistent/cifar10.npz", **overrides})
  with pytest.raises(ValueError, match=match):
    validation.validate(c)


def test_a_partition_file_holds_out_no_public_set_itself():
  validation.validate(_cfg(**{"data.public": 59995, "partition.kind": "file",
                              "partition.path": "/nonexistent/p.npz"}))


def test_an_algorithms_config_file_lists_every_switch_at_its_default():
  """``--config.algo.<key>=...`` reaches a key only if the experiment's config file has
  it (the command line refuses others): every hyper-parameter of the algorithm, at the
  default the algorithm's function takes."""
  from fedjax_het.algorithms import SPECS
  from fedjax_het.config_files import load_config_file
  for name, spec in sorted(SPECS.items()):
    algo = load_config_file(os.path.join(ROOT, "experiments", f"{name}.py")).algo
    assert dict(algo) == spec.hparams, name
