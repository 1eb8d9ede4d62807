"""Research code outside the package (docs/extending.md), through the public entry points.

The guide's code lives in ``examples/`` (an algorithm, a model family, a dataset, a
partition); these tests import and run it through ``experiments/main.py``, the sweep and
a Flower deployment, on small synthetic datasets of 28x28x1 and 64x64x3 images, and
check that every bad array, reference and partition is refused before anything runs.
"""
import json
import os
import re
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from fedjax_het import algorithms
from fedjax_het import config as config_lib
from fedjax_het import models
from fedjax_het import validation
from fedjax_het.algorithms import SPECS
from fedjax_het.config_files import load_config_file
from fedjax_het.data import partition_file
from fedjax_het.data import pool as pool_lib
from fedjax_het.data import sources
from fedjax_het.data.augment import augment
from fedjax_het.data.augment import crop
from fedjax_het.sweeps import plan as plan_lib
from fedjax_het.sweeps import runner as sweep
from fedjax_het.training import experiment
from fedjax_het.training import loop
from fedjax_het.training import runfiles

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FEDPROX = os.path.join(ROOT, "examples", "configs", "fedprox.py")


@pytest.fixture(autouse=True)
def in_repository_root(monkeypatch):
  """The commands of docs/extending.md run from the repository root, so ``examples.*``
  references resolve from the current directory (``fedjax_het.plugins``)."""
  monkeypatch.chdir(ROOT)


@pytest.fixture(scope="module")
def gray28(tmp_path_factory):
  """examples/make_dataset.py: 200 + 100 grayscale 28x28 images of 10 classes."""
  from examples import make_dataset
  path = tmp_path_factory.mktemp("data") / "gray28.npz"
  return make_dataset.synthetic(str(path), (28, 28, 1), 10, 200, 100, seed=1)


@pytest.fixture(scope="module")
def rgb64(tmp_path_factory):
  """80 + 40 RGB 64x64 images of 6 classes."""
  from examples import make_dataset
  path = tmp_path_factory.mktemp("data") / "rgb64.npz"
  return make_dataset.synthetic(str(path), (64, 64, 3), 6, 80, 40, seed=2)


def small(c, data, name, **overrides):
  """``c`` shrunk to a run of seconds on the dataset ``data`` (an npz path)."""
  base = {"data.name": name, "data.path": data, "data.subsample": 0,
          "data.subsample_per_class": 0, "num_clients": 4, "num_rounds": 1,
          "batch_size": 16, "eval_every": 1, "checkpoint_every": 1,
          "partition.kind": "dirichlet", "runtime.num_devices": 1}
  return config_lib.override(c, {**base, **overrides})


def fedprox_config(data, **overrides):
  return small(load_config_file(FEDPROX), data, "gray28",
               **{"models": "tiny", **overrides})


def rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in f]


GUIDE = os.path.join(ROOT, "docs", "extending.md")
# What the test does with each listing's names once the listing ran (as copied, in a
# fresh process, from an empty directory): small calls that a broken listing fails.
EXERCISES = {
    "examples/fedprox.py": """
from fedjax_het.algorithms import Spec
import ml_collections
assert isinstance(SPEC, Spec) and SPEC.hparams == {"mu": 0.01, "aggregation": "weighted"}
try:
  check(ml_collections.ConfigDict({"algo": {"mu": -1.0}}))
  raise AssertionError("check accepted mu=-1")
except ValueError as err:
  assert "must be a number >= 0" in str(err)
# the listing's algorithm traced (shapes only) on a tiny synthetic federation
import jax, numpy as np
from fedjax_het import config as config_lib, register_algorithm
from fedjax_het.data import make_synthetic
from fedjax_het.training import experiment
raw = make_synthetic(64, 32, 4, seed=0)
np.savez("d.npz", x_train=raw.x_train, y_train=raw.y_train, x_test=raw.x_test,
         y_test=raw.y_test)
register_algorithm("fedprox_listing", SPEC)
c = config_lib.override(config_lib.base_config(), {
    "algorithm": "fedprox_listing", "models": "tiny", "data.name": "d",
    "data.path": "d.npz", "data.subsample": 0, "data.subsample_per_class": 0,
    "num_clients": 2, "batch_size": 16, "partition.kind": "iid",
    "runtime.num_devices": 1})
c.algo.mu, c.algo.aggregation = 0.01, "uniform"
exp = experiment.prepare(c)
state = jax.eval_shape(exp.algorithm.init, jax.random.PRNGKey(0))
state, metrics = jax.eval_shape(exp.algorithm.round, state, exp.data)
assert metrics["train_loss"].shape == ()
""",
    "examples/drift_round.py": """
import jax, numpy as np
from fedjax_het import config as config_lib, register_algorithm
from fedjax_het.data import make_synthetic
from fedjax_het.training import experiment, program
raw = make_synthetic(64, 32, 4, seed=0)
np.savez("d.npz", x_train=raw.x_train, y_train=raw.y_train, x_test=raw.x_test,
         y_test=raw.y_test)
register_algorithm("drift_listing", SPEC)
drifts = []
for lr in (0.01, 0.02):  # one SGD step per client (B = 32 > its examples)
  c = config_lib.override(config_lib.base_config(), {
      "algorithm": "drift_listing", "models": "tiny", "data.name": "d",
      "data.path": "d.npz", "data.subsample": 0, "data.subsample_per_class": 0,
      "num_clients": 4, "batch_size": 32, "partition.kind": "iid",
      "runtime.num_devices": 1, "learning_rate": lr})
  exp = experiment.prepare(c)
  state = program.compile_fns(exp).init(jax.random.PRNGKey(0))
  state, metrics = jax.jit(exp.algorithm.round)(state, exp.data)
  drifts.append(float(metrics["drift"]))
  assert {"train_loss", "uplink_params", "drift"} <= set(metrics)
# one step from w: w_k - w = -lr (g_k + wd w), so the drift is linear in lr
assert drifts[0] > 0 and abs(drifts[1] / drifts[0] - 2) < 1e-4, drifts
""",
    "examples/configs/fedprox.py": """
c = get_config("smoke")
assert c.algorithm == "examples.fedprox:SPEC" and c.algo.mu == 0.01 and c.num_rounds <= 5
assert get_config().num_rounds > c.num_rounds
""",
    "examples/my_models.py": """
import jax, jax.numpy as jnp
x = jnp.zeros((2, 28, 28, 1))
for factory in (mlp, wide_mlp, convnet):
  (rep, feats), _ = jax.eval_shape(factory(rep_dim=8).init_with_output,
                                   jax.random.PRNGKey(0), x)
  assert rep.shape == (2, 8) and feats, factory
assert assign(4) == "examples.my_models:mlp"
""",
    "examples/make_partition.py": """
import numpy as np
train, test = shards(np.repeat(np.arange(10), 20), 5, seed=1)
everything = np.concatenate(train + test)
assert len(train) == len(test) == 5 and len(everything) == len(set(everything)) == 200
assert callable(write)
""",
    "examples/take_partition.py": """
import numpy as np
tables = {"train_0": np.array([0, 2]), "pool_split": np.array([0, 1, 1]),
          "pool_row": np.array([5, 6, 7])}
split, row = source_rows(tables, 0)
assert split.tolist() == [0, 1] and row.tolist() == [5, 7]
source = {"y_train": np.arange(10), "y_test": np.arange(10) + 100}
assert client_labels(tables, source, 0).tolist() == [5, 107]
""",
}


def guide_listings() -> list[tuple[str, str]]:
  """(file named by the first line ``# examples/<file>``, code) of every ``python``
  block of docs/extending.md."""
  with open(GUIDE) as f:
    blocks = re.findall(r"```python\n(.*?)```", f.read(), re.S)
  listings = []
  for code in blocks:
    header = code.split("\n", 1)[0]
    assert re.fullmatch(r"# examples/\S+\.py", header), (
        f"a listing of docs/extending.md must start with '# examples/<file>': {header!r}")
    listings.append((header[2:], code))
  return listings


def test_the_guides_listings_are_the_examples_code():
  """Every ``python`` block of docs/extending.md is its file, or the file's lines in
  order with some left out (a docstring, a command line), so it cannot drift."""
  listings = guide_listings()
  assert sorted(name for name, _ in listings) == sorted(EXERCISES)
  for name, code in listings:
    with open(os.path.join(ROOT, name)) as f:
      lines = iter(f.read().splitlines())
    missing = [line for line in code.splitlines()[1:] if line not in lines]
    assert not missing, f"docs/extending.md quotes {name} as it no longer is: {missing[:3]}"


DRIVER = """
import runpy, sys, traceback
for path, name in zip(sys.argv[1::2], sys.argv[2::2]):
  try:
    namespace = runpy.run_path(path, run_name="listing")
    exec(open(path + ".exercise").read(), namespace)
  except Exception:
    print(f"FAILED {name}: {traceback.format_exc()}", flush=True)
    sys.exit(1)
  print(f"ok {name}", flush=True)
"""


def test_every_listing_of_the_guide_runs_as_copied(tmp_path):
  """Each listing alone in a file of an empty directory, run in a fresh process without
  the repository on the path, then exercised (``EXERCISES``): seconds, nothing trains."""
  args = []
  for i, (name, code) in enumerate(guide_listings()):
    path = tmp_path / f"listing_{i}.py"
    path.write_text(code)
    (tmp_path / f"listing_{i}.py.exercise").write_text(EXERCISES[name])
    args += [str(path), name]
  (tmp_path / "driver.py").write_text(DRIVER)
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  out = subprocess.run([sys.executable, str(tmp_path / "driver.py"), *args], cwd=tmp_path,
                       capture_output=True, text=True, timeout=300, env=env)
  assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
  assert out.stdout.splitlines() == [f"ok {name}" for name in args[1::2]]


# ------------------------------------------------------------------ 1. an algorithm


def test_own_algorithm_through_main_on_grayscale_images(gray28, tmp_path):
  out = subprocess.run(
      [sys.executable, "experiments/main.py", f"--config={FEDPROX}:smoke",
       f"--workdir={tmp_path}", "--config.models=tiny", "--config.data.name=gray28",
       f"--config.data.path={gray28}", "--config.num_rounds=1", "--config.num_clients=4",
       "--config.algo.mu=0.1"], capture_output=True, text=True, timeout=300, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-3000:]
  assert out.stdout.startswith("examples.fedprox:SPEC | gray28 (300 examples of 28x28x1, "
                               "10 classes, pool pooled;"), out.stdout
  summary = json.load(open(tmp_path / "summary.json"))
  assert summary["rounds_completed"] == 1 and summary["config"]["algo"]["mu"] == 0.1
  raw = sources.load_npz(gray28, "gray28")
  mean, std = sources.channel_stats(raw.x_train)  # computed from the training split
  assert summary["data"]["normalization"] == {"mean": list(mean), "std": list(std)}
  assert summary["data"]["image_shape"] == [28, 28, 1]
  assert summary["data"]["num_classes"] == 10  # inferred from the labels
  assert (tmp_path / partition_file.INDICES_FILE).exists()


def test_own_algorithm_keys_are_validated_like_the_builtins(gray28):
  c = fedprox_config(gray28)
  validation.validate(c)
  spec = algorithms.get_spec(c.algorithm)
  assert spec.hparams == {"mu": 0.01, "aggregation": "weighted"}
  bad = [({"algo.nu": 1.0}, r"unknown config keys \['algo.nu'\]; valid keys are "
                            r"\['algo.aggregation', 'algo.mu'\]"),
         ({"algo.aggregation": "median"}, r"config.algo.aggregation='median' is invalid: "
                                          r"valid choices are \['weighted', 'uniform'\]"),
         ({"algo.mu": -1.0}, r"config.algo.mu=-1.0 is invalid: must be a number >= 0"),
         ({"models": "tiny,cnn5"}, r"needs model-homogeneous clients")]
  for overrides, match in bad:
    c = fedprox_config(gray28)
    if "algo.nu" in overrides:
      c.algo.nu = 1.0
    else:
      config_lib.override(c, overrides)
    with pytest.raises(ValueError, match=match):
      validation.validate(c)


@pytest.mark.parametrize("ref,match", [
    ("my_project.nowhere:SPEC", r"config.algorithm='my_project.nowhere:SPEC': module "
                                r"'my_project.nowhere' cannot be imported .* current "
                                r"directory .* PYTHONPATH"),
    ("examples.fedprox:SPECS", r"'examples.fedprox' has no attribute 'SPECS'; its public "
                               r"names are \[.*'SPEC'"),
    ("examples.fedprox:fedprox", r"names a function; expected a "
                                 r"fedjax_het.algorithms.Spec"),
    ("fedsgd", r"config.algorithm='fedsgd' is invalid: valid choices are \['standalone', "
               r".*'package.module:SPEC' reference"),
])
def test_bad_algorithm_references_are_named(ref, match):
  c = config_lib.base_config()
  c.algorithm = ref
  with pytest.raises(ValueError, match=match):
    validation.validate(c)


def test_main_says_where_a_module_must_be_importable_from(tmp_path):
  # a PYTHONPATH holding the repository (``PYTHONPATH=. pytest``) would make
  # ``examples`` importable and the run train instead
  path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
          if p and not os.path.isdir(os.path.join(p, "examples"))]
  out = subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "main.py"),
                        f"--config={FEDPROX}", f"--workdir={tmp_path}"],
                       capture_output=True, text=True, timeout=120, cwd=tmp_path,
                       env=dict(os.environ, PYTHONPATH=os.pathsep.join(path)))
  assert out.returncode == 2
  assert out.stderr.startswith("error: config.algorithm='examples.fedprox:SPEC': module "
                               "'examples.fedprox' cannot be imported")
  assert "PYTHONPATH" in out.stderr


def test_register_algorithm_and_architecture_in_python(gray28, monkeypatch):
  from examples import fedprox
  from examples import my_models
  monkeypatch.setattr(algorithms, "REGISTERED", {})
  monkeypatch.setattr(models.registry, "REGISTERED", {})
  algorithms.register_algorithm("fedprox", fedprox.SPEC)
  models.register_architecture("mlp", my_models.mlp)
  c = fedprox_config(gray28, algorithm="fedprox", models="mlp")
  validation.validate(c)
  assert models.client_archs("mlp,tiny", 3) == ["mlp", "tiny", "mlp"]
  with pytest.raises(ValueError, match="'fedavg' is a built-in algorithm"):
    algorithms.register_algorithm("fedavg", fedprox.SPEC)
  with pytest.raises(ValueError, match="'cnn1' is built in"):
    models.register_architecture("cnn1", my_models.mlp)
  with pytest.raises(ValueError, match="expected a factory taking keyword arguments "
                                       "rep_dim and dtype"):
    models.register_architecture("assign", my_models.assign)


# ------------------------------------------------------------------ 2. a model family


@pytest.mark.compile_bound
def test_fedmrl_over_own_model_family_on_64x64_rgb(rgb64, tmp_path):
  c = small(load_config_file(os.path.join(ROOT, "experiments", "fedmrl.py")), rgb64,
            "rgb64", models="examples.my_models:assign", num_clients=2,
            **{"algo.small_arch": "examples.my_models:mlp", "partition.kind": "iid"})
  summary = loop.run(c, str(tmp_path), log=lambda s: None)
  part = json.load(open(tmp_path / "partition.json"))
  assert [p["arch"] for p in part["clients"]] == ["examples.my_models:convnet",
                                                  "examples.my_models:mlp"]
  assert summary["data"]["image_shape"] == [64, 64, 3] and summary["data"]["num_classes"] == 6
  assert np.isfinite(rows(tmp_path)[0]["train_loss"])
  assert 0.0 <= summary["final_mean_test_acc"] <= 1.0


@pytest.mark.compile_bound
def test_every_algorithm_traces_on_grayscale_images(tmp_path):
  """Shapes only (``jax.eval_shape``): init, a round and the evaluation of every
  algorithm on a CNN and one of the user's architectures, on 28x28x1 images (64x64x3
  ones run end to end above)."""
  from examples import make_dataset
  data = make_dataset.synthetic(str(tmp_path / "d.npz"), (28, 28, 1), 4, 64, 32)
  for name in sorted(SPECS):
    archs = "tiny" if SPECS[name].homogeneous_only else "tiny,examples.my_models:mlp"
    c = small(config_lib.base_config(), data, "d", algorithm=name, models=archs,
              **{"partition.kind": "iid"})
    if name == "moss":
      config_lib.override(c, {"data.public": 16, "algo.public_size": 16,
                              "algo.public_batch": 8, "algo.wire_layers": "rep"})
    exp = experiment.prepare(c)
    state = jax.eval_shape(exp.algorithm.init, jax.random.PRNGKey(0))
    state, metrics = jax.eval_shape(exp.algorithm.round, state, exp.data)
    assert metrics["train_loss"].shape == (), name
    counts = jax.eval_shape(exp.algorithm.evaluate, state, exp.data)
    assert len(counts) == exp.runtime.layout.num_groups, name


def test_bad_architectures_are_named_before_anything_runs(gray28, monkeypatch):
  from examples import my_models
  monkeypatch.setattr(my_models, "BAD", ["tiny", "resnet"], raising=False)  # cycled
  with pytest.raises(ValueError, match=r"'cnn1' cannot take images of shape \(12, 12, 1\) "
                                       r"\(the CNNs' .* at least 16x16\)"):
    models.check_architectures(["cnn1"], (12, 12, 1), 10)
  with pytest.raises(ValueError, match=r"config.models='examples.my_models:nope': "
                                       r"'examples.my_models' has no attribute 'nope'"):
    validation.validate(fedprox_config(gray28, models="examples.my_models:nope"))
  with pytest.raises(ValueError, match=r"config.algo.small_arch='resnet' is invalid: valid "
                                       r"choices are \['cnn1', .*'package.module:factory'"):
    validation.validate(small(config_lib.base_config(), gray28, "gray28", algorithm="fedmrl",
                              models="tiny", **{"algo.small_arch": "resnet"}))
  with pytest.raises(ValueError, match=r"gives client 1 'resnet', which is no architecture"):
    models.client_archs("examples.my_models:BAD", 2)


# ------------------------------------------------------------------ 3. a dataset


def _npz(path, **edits):
  raw = sources.make_synthetic(8, 4, 3, seed=0, image_shape=(28, 28, 1))
  arrays = dict(x_train=raw.x_train, y_train=raw.y_train, x_test=raw.x_test,
                y_test=raw.y_test)
  for key, edit in edits.items():
    arrays[key] = edit(arrays[key])
  np.savez(path, **arrays)
  return str(path)


@pytest.mark.parametrize("edits,num_classes,match", [
    (dict(x_train=lambda x: x[..., 0]), 0, r"x_train has shape \(8, 28, 28\); expected "
                                           r"\[n, H, W, C\] .*x\[\.\.\., None\]"),
    (dict(x_test=lambda x: x.astype(np.float32)), 0, r"x_test has dtype float32; expected "
                                                     r"uint8"),
    (dict(x_test=lambda x: np.repeat(x, 3, -1)), 0, r"x_train has images of shape "
                                                    r"\(28, 28, 1\) but x_test's are "
                                                    r"\(28, 28, 3\)"),
    (dict(y_test=lambda y: y - 1), 0, r"y_test has labels in \[-1, 1\]; expected labels in "
                                      r">= 0"),
    ({}, 2, r"y_train has labels in \[0, 2\]; expected labels in \[0, 2\)"),
    (dict(y_train=lambda y: y[:5]), 0, r"y_train has 5 labels but the images have 8 rows"),
])
def test_bad_arrays_are_named_before_any_compute(tmp_path, edits, num_classes, match):
  c = small(config_lib.base_config(), _npz(tmp_path / "mine.npz", **edits), "mine",
            **{"data.num_classes": num_classes, "partition.kind": "iid"})
  with pytest.raises(sources.DataFormatError, match=match):
    experiment.prepare(c)


@pytest.mark.parametrize("key,value,match", [
    ("data.num_classes", 12, r"cifar10 has 10 classes"),
    ("data.mean", "0.5,x", r"data.mean='0.5,x' is invalid: a comma-separated list"),
    ("data.mean", "0.5", r"data.std='' is invalid: give data.mean .* or neither"),
    ("data.name", "", r"data.name='' is invalid"),
])
def test_bad_dataset_keys(key, value, match):
  with pytest.raises(ValueError, match=match):
    validation.validate(config_lib.override(config_lib.base_config(), {key: value}))


def test_given_classes_and_statistics_are_used(gray28):
  c = small(config_lib.base_config(), gray28, "gray28", models="tiny",
            **{"data.num_classes": 12, "data.mean": "0.25", "data.std": "0.5"})
  exp = experiment.prepare(c)
  assert exp.runtime.layout.num_classes == 12 and exp.runtime.layout.image_shape == (28, 28, 1)
  assert exp.runtime.normalization == ((0.25,), (0.5,))
  with pytest.raises(sources.DataFormatError, match=r"data.mean='0.25,0.5' has 2 values but "
                                                    r"the images of 'gray28' have 1"):
    experiment.prepare(config_lib.override(c, {"data.mean": "0.25,0.5", "data.std": "1,1"}))


def test_a_silo_lays_out_only_builtin_datasets_without_data(gray28):
  from fedjax_het.deploy import federation
  with pytest.raises(ValueError, match=r"with_data=False\) lays out only the built-in "
                                       r"datasets \['cifar10', 'cifar100'\]; 'gray28' needs"):
    federation.prepare_federation(fedprox_config(gray28), with_data=False)


def test_channel_statistics_by_hand():
  x = np.array([[[[0, 255]]], [[[255, 255]]]], np.uint8)  # 2 images of 1x1x2
  assert sources.channel_stats(x) == ((0.5, 1.0), (0.5, 0.0))
  assert sources.channel_stats(x, chunk=1) == ((0.5, 1.0), (0.5, 0.0))


@pytest.mark.compile_bound
@pytest.mark.parametrize("shape", [(28, 28, 1), (64, 64, 3)])
def test_augmentation_keeps_any_image_shape(shape):
  x = jax.random.uniform(jax.random.PRNGKey(0), (2,) + shape) + 1.0  # > 0: 0 is padding
  assert augment(jax.random.PRNGKey(1), x, "flip_crop_erase").shape == x.shape
  out = np.asarray(crop(jax.random.PRNGKey(2), x[0]))  # a shifted window, zero filled
  h, w, _ = shape
  padded = np.pad(np.asarray(x[0]), ((4, 4), (4, 4), (0, 0)))
  assert any(np.array_equal(out, padded[dy:dy + h, dx:dx + w])
             for dy in range(9) for dx in range(9))


# ------------------------------------------------------------------ 4. a partition


def test_an_exported_partition_gives_the_run_its_clients_back(gray28, tmp_path):
  """The file a run writes gives a run from it the same client tables, to the padded
  index arrays on the devices; nothing else of a run depends on partition.kind (seed
  and round key everything), so it is the same run (docs/extending.md shows one)."""
  first = fedprox_config(gray28)
  exp = experiment.prepare(first)
  runfiles.write_partition(str(tmp_path), exp)
  exported = str(tmp_path / partition_file.INDICES_FILE)
  again = experiment.prepare(fedprox_config(gray28, **{"partition.kind": "file",
                                                 "partition.path": exported}))
  same = jax.tree.map(np.array_equal, jax.device_get(exp.data),
                            jax.device_get(again.data))
  assert all(jax.tree.leaves(same))
  np.testing.assert_array_equal(exp.class_counts, again.class_counts)
  from examples import take_partition
  pool = pool_lib.load_pool(**config_lib.pool_args(first))
  with np.load(exported) as f, np.load(gray28) as source:
    assert int(f["pool_size"]) == len(f["pool_row"]) == len(pool.y) == 300
    for k in range(4):  # the source file's own labels of each client's examples
      for kind in ("train", "test"):
        np.testing.assert_array_equal(take_partition.client_labels(f, source, k, kind),
                                      pool.y[f[f"{kind}_{k}"]])


def test_own_partition_file_as_npz_and_json(gray28, tmp_path):
  from examples import make_partition
  c = fedprox_config(gray28)
  tables = make_partition.write(c, str(tmp_path / "shards.npz"))
  assert len(tables.train) == 4 and tables.pool_size == 300
  partition_file.save(str(tmp_path / "shards.json"), tables)
  for path in ("shards.npz", "shards.json"):
    exp = experiment.prepare(fedprox_config(gray28, **{"partition.kind": "file",
                                                "partition.path": str(tmp_path / path)}))
    # 2 label-sorted shards of 37 examples, classes of about 30: at most 6 classes
    assert (exp.class_counts[:, 0] > 0).sum(axis=1).max() <= 6
    for k in range(4):
      np.testing.assert_array_equal(exp.tables.train[k], tables.train[k])


def test_partition_cli(gray28, tmp_path):
  out = subprocess.run([sys.executable, "examples/make_partition.py", f"--config={FEDPROX}",
                        "--config.data.name=gray28", f"--config.data.path={gray28}",
                        "--config.data.subsample_per_class=0", "--config.num_clients=3",
                        f"--out={tmp_path}/p.json"], capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.startswith(f"wrote {tmp_path}/p.json: 3 clients of 300 pooled examples")


TABLES = dict(train=[[0, 1], [2, 3]], test=[[4], [5]])


@pytest.mark.parametrize("edit,match", [
    (lambda t: t["train"].append([6]), r"3 train tables but 2 test tables"),
    (lambda t: t["test"][1].append(0), r"index 0 is held by two clients: 0 \(train\) and 1 "
                                       r"\(test\)"),
    (lambda t: t["test"][0].append(1), r"client 0's train and test tables both hold index 1"),
    (lambda t: t["train"][1].append(3), r"client 1's train table holds index 3 twice"),
    (lambda t: t["train"][1].append(99), r"client 1's train indices lie in \[2, 99\]; the "
                                         r"pool has 10 examples"),
    (lambda t: t["test"].__setitem__(0, []), r"client 0 has no test examples"),
])
def test_partition_files_are_checked(tmp_path, edit, match):
  tables = json.loads(json.dumps(TABLES))
  edit(tables)
  path = tmp_path / "p.json"
  path.write_text(json.dumps(tables))
  with pytest.raises(ValueError, match=match):
    partition_file.read(str(path), num_clients=2, pool_size=10)


def test_partition_file_against_the_run(gray28, tmp_path):
  path = str(tmp_path / "p.npz")
  partition_file.save(path, partition_file.ClientTables(
      [np.array([0, 1]), np.array([2])], [np.array([3]), np.array([4])], 10, "abc"))
  partition_file.read(path, num_clients=2, pool_size=10, fingerprint="abc")
  for kwargs, match in [(dict(num_clients=3), r"holds 2 clients; config.num_clients=3"),
                        (dict(pool_size=12), r"written for a pool of 10 examples; this "
                                             r"config's pool has 12"),
                        (dict(fingerprint="xyz"), r"fingerprint abc; this config's data "
                                                  r"has xyz"),
                        (dict(public=6), r"leaves 5 for the public set of "
                                         r"config.data.public=6")]:
    with pytest.raises(ValueError, match=match):
      partition_file.read(path, **{**dict(num_clients=2, pool_size=10), **kwargs})
  with pytest.raises(ValueError, match=r"partition.path=.* a partition file is read only "
                                       r"with partition.kind='file'"):
    validation.validate(fedprox_config(gray28, **{"partition.path": path}))
  mine = tmp_path / "mine.json"  # no pool size or fingerprint: only the tables are checked
  mine.write_text(json.dumps(TABLES))
  with pytest.raises(ValueError, match=r"holds 2 clients; config.num_clients=4"):
    experiment.prepare(fedprox_config(gray28, **{"partition.kind": "file",
                                           "partition.path": str(mine)}))


# ------------------------------------------------------------------ the sweep, Flower


@pytest.mark.compile_bound
def test_sweep_runs_own_algorithm(gray28, tmp_path):
  c = load_config_file(os.path.join(ROOT, "examples", "configs", "sweep.py"))
  c.algorithms = [FEDPROX]  # the built-in rows run through the same code
  c.seeds = (0,)
  c.base_overrides = ml_collections.ConfigDict({
      "models": "tiny", "num_clients": 4, "num_rounds": 1, "batch_size": 16,
      "data": {"name": "gray28", "path": gray28, "subsample_per_class": 0}})
  c.settings = ml_collections.ConfigDict({"N=4": {}}, allow_dotted_keys=True)
  results = sweep.run_sweep(c, str(tmp_path), log=lambda s: None)
  assert [(r["algorithm"], r["status"]) for r in results] == [("fedprox", "done")]
  # the run's exported partition given back reproduces it (its compilation is cached)
  run = plan_lib.plan(c, str(tmp_path))[0]
  again = config_lib.override(run.config, {
      "partition.kind": "file",
      "partition.path": os.path.join(run.workdir, partition_file.INDICES_FILE)})
  loop.run(again, str(tmp_path / "again"), log=lambda s: None)
  assert rows(tmp_path / "again") == rows(run.workdir)


@pytest.mark.slow
@pytest.mark.compile_bound  # as test_deploy_flower's processes (its Federation) compile
@pytest.mark.xdist_group("flower")
def test_flower_deploys_own_algorithm_as_the_simulator_runs_it(gray28, tmp_path):
  pytest.importorskip("flwr")
  from test_deploy_flower import Federation
  from test_deploy_flower import free_port
  flags = [f"--config={FEDPROX}:smoke", "--config.models=tiny", "--config.num_clients=2",
           "--config.num_rounds=1", "--config.data.name=gray28",
           f"--config.data.path={gray28}", "--config.data.subsample_per_class=0"]
  # launched from the repository root as docs/extending.md does, no PYTHONPATH: the
  # processes (which run in tmp_path) import examples.fedprox from the launcher's cwd
  fed = Federation(tmp_path, port=free_port(), config=flags, num_clients=2, cwd=ROOT)
  try:
    fed.wait(timeout=300)
  finally:
    fed.kill()
  assert fed.procs[0][1].returncode == 0, fed.log("server")[-3000:]
  deployed = rows(tmp_path / "server")
  c = fedprox_config(gray28, num_clients=2, **{"partition.kind": "pathological"})
  previous = jax.config.jax_default_prng_impl  # the processes' default keys
  jax.config.update("jax_default_prng_impl", "threefry2x32")
  try:
    loop.run(c, str(tmp_path / "sim"), log=lambda s: None)
  finally:
    jax.config.update("jax_default_prng_impl", previous)
  simulated = rows(tmp_path / "sim")
  assert deployed[0]["round"] == simulated[0]["round"] == 1
  assert deployed[0]["mean_test_acc"] == pytest.approx(simulated[0]["mean_test_acc"],
                                                       abs=1e-6)
  assert deployed[0]["train_loss"] == pytest.approx(simulated[0]["train_loss"], rel=1e-5)
