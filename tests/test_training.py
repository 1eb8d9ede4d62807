"""The experiment loop end to end: outputs, no recompilation, resume, data errors."""
import dataclasses
import importlib.util
import json
import logging
import os
import platform
import subprocess
import sys

import chex
import jax
import numpy as np
import pytest
from conftest import COMPILE_BOUND_ENV
from conftest import SHARDED
from conftest import assert_server_holds_no_client_leaf

from fedjax_het import config as config_lib
from fedjax_het.data import pool as pool_lib
from fedjax_het.training import compile_options
from fedjax_het.training import experiment
from fedjax_het.training import loop
from fedjax_het.training import program
from fedjax_het.training import runfiles

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import kill_resume  # noqa: E402


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _strip_wall(rows):
  return [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]


def test_standalone_run_writes_outputs(tiny_config, tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path.parent)
  summary = loop.run(tiny_config(), tmp_path.name, log=lambda s: None)  # a relative path
  rows = _rows(tmp_path)
  assert [r["round"] for r in rows] == [1, 2]
  for r in rows:
    assert 0.0 <= r["mean_test_acc"] <= 1.0
    assert r["uplink_params"] == 0 and r["downlink_params"] == 0
    assert r["wall_s"] > 0
  assert summary["rounds_completed"] == 2
  assert len(summary["per_client_test_acc"]) == 8
  np.testing.assert_allclose(summary["final_mean_test_acc"],
                             np.mean(summary["per_client_test_acc"]))
  part = json.load(open(tmp_path / "partition.json"))
  assert [c["arch"] for c in part["clients"]][:3] == ["tiny", "tiny2", "tiny"]
  assert all(sum(c["test_class_counts"]) >= 1 for c in part["clients"])
  assert json.load(open(tmp_path / "summary.json")) == summary
  env = summary["environment"]  # what it ran on: the versions and host of this process
  assert env["packages"]["jax"] == jax.__version__
  assert env["packages"]["numpy"] == np.__version__
  assert (env["backend"], env["visible_devices"]) == ("cpu", 4)  # conftest's forced devices
  assert env["python"] == platform.python_version() and env["cpu"]["model"]


def test_fedavg_counts_whole_model_both_ways(tiny_config, tmp_path):
  loop.run(tiny_config("fedavg", "tiny"), str(tmp_path), log=lambda s: None)
  rows = _rows(tmp_path)
  # conv1, conv2, fc1 (1*1*8 -> 32: tiny_config's 16x16 images, 5x5 convs and 2x2
  # pools: 16 -> 12 -> 6 -> 2 -> 1), fc2 (32 -> 500), header (500 -> 10)
  tiny = (5 * 5 * 3 * 4 + 4) + (5 * 5 * 4 * 8 + 8) + (8 * 32 + 32) + (32 * 500 + 500) + 5010
  assert rows[0]["uplink_params"] == tiny and rows[0]["downlink_params"] == tiny
  assert rows[1]["uplink_params"] == 2 * tiny  # cumulative


@pytest.mark.parametrize("algorithm,models", [("standalone", "tiny,cnn5"),
                                              ("fedavg", "tiny")])
def test_round_compiles_once(tiny_config, algorithm, models):
  exp = experiment.prepare(tiny_config(algorithm, models, {"participation": 0.5}))
  round_fn = jax.jit(chex.assert_max_traces(exp.algorithm.round, n=1))
  init = program.compile_fns(exp).init
  state = init(jax.random.PRNGKey(0))
  for _ in range(3):
    state, metrics = round_fn(state, exp.data)
  assert int(state.round) == 3
  assert np.isfinite(float(metrics["train_loss"]))
  assert_server_holds_no_client_leaf(state)


def test_resume_equals_uninterrupted_run(tiny_config, tmp_path, caplog):
  full = loop.run(tiny_config(models="tiny", overrides={"num_rounds": 4}),
                  str(tmp_path / "full"), log=lambda s: None)
  part_dir = str(tmp_path / "part")
  # the number of rounds is no part of the compiled dispatch (program.dispatch_rows: 3
  # and 4 rounds size its buffers alike): the persistent cache serves the 4-round run's
  caplog.set_level(logging.DEBUG, logger="jax._src.compiler")
  loop.run(tiny_config(models="tiny", overrides={"num_rounds": 3}), part_dir,
           log=lambda s: None)
  logs = []
  resumed = loop.run(tiny_config(models="tiny", overrides={"num_rounds": 4}), part_dir,
                     log=logs.append)
  assert any("resumed from round 3" in line for line in logs)
  assert _strip_wall(_rows(part_dir)) == _strip_wall(_rows(tmp_path / "full"))
  assert resumed["per_client_test_acc"] == full["per_client_test_acc"]
  compiled = [r.getMessage() for r in caplog.records if "'jit_dispatch'" in r.getMessage()]
  assert len(compiled) == 2, compiled  # the 3-round run's and the resumed run's
  assert all(m.startswith("Persistent compilation cache hit") for m in compiled), compiled


def test_compile_dispatch_traces_the_round_and_evaluate_once(tiny_config):
  # the row buffers' shapes come from the loop body's trace (program.traced_once): two
  # seeds of a tiny FedMRL on a replica axis traced their dispatch in 3.9 s, now 2.2 s
  exp = experiment.prepare(tiny_config(models="tiny"))
  alg = exp.algorithm._replace(round=chex.assert_max_traces(exp.algorithm.round, n=1),
                               evaluate=chex.assert_max_traces(exp.algorithm.evaluate, n=1))
  exp = dataclasses.replace(exp, algorithm=alg)
  state = program.compile_fns(exp).init(jax.random.PRNGKey(0))
  state, rows, _ = program.compile_dispatch(exp, 2)(state, exp.data, 2)
  assert int(state.round) == 2 and np.asarray(rows["evaluated"]).tolist() == [True, True]


def test_run_gives_back_the_init_program_before_the_rounds(tiny_config, tmp_path,
                                                          monkeypatch):
  """The init runs once: its compiled program is dropped before the dispatch runs (it
  held about 200 MiB of the CPU quickstart's memory)."""
  made, seen = [], []
  compile_fns, dispatch = loop.compile_fns, loop.compile_dispatch

  def keep(exp):
    made.append(compile_fns(exp))
    return made[-1]

  def watch(*args, **kwargs):
    run = dispatch(*args, **kwargs)

    def checked(*a):  # what the init's jit holds when a dispatch starts
      seen.append(made[-1].init._cache_size())
      return run(*a)
    return checked
  monkeypatch.setattr(loop, "compile_fns", keep)
  monkeypatch.setattr(loop, "compile_dispatch", watch)
  loop.run(tiny_config(models="tiny"), str(tmp_path), log=lambda s: None)
  assert len(seen) == 2 and set(seen) == {0}  # two dispatches of one round each


def test_dispatch_rows_is_the_next_power_of_two_up_to_max_dispatch():
  assert [program.dispatch_rows(n) for n in (1, 2, 3, 4, 5, 100, 512, 513, 5000)] == [
      1, 2, 4, 4, 8, 128, 512, program.MAX_DISPATCH, program.MAX_DISPATCH]


def test_checkpoint_from_other_config_is_refused(tiny_config, tmp_path):
  loop.run(tiny_config(models="tiny"), str(tmp_path), log=lambda s: None)
  with pytest.raises(ValueError, match=r"differing keys: \['learning_rate'\]"):
    loop.run(tiny_config(models="tiny", overrides={"learning_rate": 0.02}), str(tmp_path),
             log=lambda s: None)
  loop.run(tiny_config(models="tiny", overrides={"learning_rate": 0.02}), str(tmp_path),
           log=lambda s: None, fresh_start=True)


def test_missing_data_is_a_clear_error_before_writing(tiny_config, tmp_path):
  workdir = tmp_path / "run"
  with pytest.raises(FileNotFoundError, match="FEDJAX_HET_DATA"):
    loop.run(tiny_config(overrides={"data.path": str(tmp_path / "nope.npz")}),
             str(workdir), log=lambda s: None)
  assert not workdir.exists()


def test_uneven_clients_are_padded_to_the_device_count(tiny_config):
  exp = experiment.prepare(tiny_config(overrides=SHARDED))
  assert exp.runtime.num_shards == jax.device_count() == 4
  for size, index in zip(exp.runtime.layout.padded_sizes, exp.data.groups):
    assert size % jax.device_count() == 0
    assert index.train_idx.shape[0] == size
    assert index.train_idx.shape[1] % 16 == 0


# Every experiments/*.py defining get_config (the commands beside them define none).
SMOKE_CONFIGS = sorted(
    f[:-3] for f in os.listdir(os.path.join(ROOT, "experiments"))
    if f.endswith(".py") and kill_resume.is_config_file(os.path.join(ROOT, "experiments", f)))


def load_experiment(name):
  """The module of ``experiments/<name>.py``."""
  spec = importlib.util.spec_from_file_location(
      f"experiment_{name}", os.path.join(ROOT, "experiments", name + ".py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_every_algorithm_has_a_smoke_config():
  from fedjax_het.algorithms import SPECS
  assert SMOKE_CONFIGS == sorted(SPECS)


# The papers' two methods and the floor they must beat run end to end through main.py on
# real CIFAR-10 (a subprocess each: the XLA:CPU compile of a 5-architecture round takes
# 30-100 s); every algorithm's round is run by tests/test_protocol.py on tiny models and
# every smoke config is built on the real data below.
MAIN_SMOKES = ("fedmrl", "fedmoe", "standalone")


@pytest.mark.skipif(not os.environ.get("FEDJAX_HET_DATA"), reason="needs FEDJAX_HET_DATA")
@pytest.mark.parametrize("name", SMOKE_CONFIGS)
def test_every_smoke_config_builds_on_real_cifar10(name):
  config = load_experiment(name).get_config("smoke")
  exp = experiment.prepare(config)
  assert exp.config.algorithm == name
  assert len(exp.client_archs) == config.num_clients
  assert exp.class_counts[:, 0].sum(axis=1).min() >= 1


@pytest.mark.skipif(not os.environ.get("FEDJAX_HET_DATA"), reason="needs FEDJAX_HET_DATA")
@pytest.mark.parametrize("name", MAIN_SMOKES)
def test_main_smoke_on_real_cifar10(name, tmp_path):
  cmd = [sys.executable, os.path.join(ROOT, "experiments/main.py"),
         f"--config={os.path.join(ROOT, 'experiments', name + '.py')}:smoke",
         f"--workdir={tmp_path}"]
  # a 5-architecture round compiles far longer than its 3 rounds run: level 0 (fedmrl
  # 40.6 -> 34.7 s, fedmoe 48.7 -> 40.0 s, standalone 22.0 -> 19.9 s; pytest -n 0)
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=600, cwd=ROOT,
                       env=dict(os.environ, **COMPILE_BOUND_ENV))
  assert out.returncode == 0, out.stderr[-3000:]
  assert "round 3/3" in out.stdout
  summary = json.load(open(tmp_path / "summary.json"))
  assert summary["rounds_completed"] == 3
  assert summary["config"]["algorithm"] == name


def test_public_holdout_is_held_by_no_client(tiny_config):
  config = tiny_config(overrides={"data.public": 100})
  y = np.arange(800) % 10
  part = lambda c: pool_lib.partition_clients(y, 10, **config_lib.partition_args(c))
  train, test, counts = part(config)
  held = np.concatenate(train + test)
  assert len(held) == len(set(held.tolist())) == 700
  assert counts.sum() == 700
  train0, test0, _ = part(tiny_config())
  assert len(np.concatenate(train0 + test0)) == 800
  with pytest.raises(ValueError, match="data.public=795"):
    part(tiny_config(overrides={"data.public": 795}))


def test_extra_metrics_are_the_algorithms_own_at_the_last_round():
  m = {"train_loss": np.ones(2), "group_finite": np.ones((2, 3), bool),
       "fidelity": np.array([[0.1, 0.2], [0.3, 0.4]]), "public_overlap": np.array([0.0, 0.5])}
  assert runfiles.extra_metrics(m) == {"fidelity": [0.3, 0.4], "public_overlap": 0.5}


def test_sampled_clients_evaluation_after_training(tiny_config, tmp_path):
  # Standalone at C = 100 %: the clients just trained are every client, and their
  # personalized model is all there is, so (b) equals (a) every round.
  loop.run(tiny_config(models="tiny"), str(tmp_path / "s"), log=lambda s: None)
  for row in _rows(tmp_path / "s"):
    assert row["sampled_test_acc"] == pytest.approx(row["mean_test_acc"], abs=1e-6)
  # One FedAvg client: the average of its upload is its upload, so (b) = (a) again.
  summary = loop.run(tiny_config("fedavg", "tiny", {"num_clients": 1}), str(tmp_path / "f"),
                     log=lambda s: None)
  rows = _rows(tmp_path / "f")
  for row in rows:
    assert row["sampled_test_acc"] == pytest.approx(row["mean_test_acc"], abs=1e-6)
  assert summary["best_sampled_test_acc"] == max(r["sampled_test_acc"] for r in rows)
  assert summary["data"]["source"].startswith("npz:") and summary["data"]["examples"] == 800
  assert len(summary["data"]["fingerprint"]) == 16
  assert summary["final_sampled_test_acc"] == rows[-1]["sampled_test_acc"]
  assert summary["timing"]["compile_s"] > 0 and summary["timing"]["round_s"] > 0
  off = loop.run(tiny_config(models="tiny", overrides={"eval_sampled": False}),
                 str(tmp_path / "off"), log=lambda s: None)
  assert "sampled_test_acc" not in _rows(tmp_path / "off")[0]
  assert "best_sampled_test_acc" not in off


def test_progress_lines_from_round_one(tiny_config, tmp_path):
  logs = []
  loop.run(tiny_config(models="tiny", overrides={"num_rounds": 4, "eval_every": 4}),
           str(tmp_path), log=logs.append)
  assert logs[0].startswith("standalone | synthetic (800 examples of 16x16x3, 10 classes, "
                             "pool pooled; npz:")
  assert " | 8 clients (tiny x8), 8 per round | " in logs[0]
  assert logs[1].startswith("round 1/4 | sampled clients acc")  # before any evaluation
  assert logs[2].startswith("compiled in ")
  assert logs[-1].startswith("round 4/4 | mean test acc")


def test_on_progress_is_called_after_every_dispatch(tiny_config, tmp_path):
  # the config of test_progress_lines_from_round_one (the compilation cache serves it);
  # checkpoint_every=1: every dispatch is one round
  calls = []
  loop.run(tiny_config(models="tiny", overrides={"num_rounds": 4, "eval_every": 4}),
           str(tmp_path), log=lambda s: None,
           on_progress=lambda done, total: calls.append((done, total)))
  assert calls == [(1, 4), (2, 4), (3, 4), (4, 4)]


def test_dispatch_size_policy():
  size = loop.dispatch_size
  fast = loop.PROGRESS_S / 10  # seconds per round: 10 rounds make a progress line
  # untimed: the first dispatch (compilation) and the second (a round's time) run one
  assert size(0, 100, None, max_rounds=50) == 1
  assert size(1, 100, None, max_rounds=50, processes=2) == 1
  # then about PROGRESS_S of rounds, capped by the next stop and by max_rounds
  assert size(2, 100, fast, max_rounds=50) == 10
  assert size(2, 5, fast, max_rounds=50) == 3
  assert size(2, 100, fast / 100, max_rounds=50) == 50
  assert size(2, 100, 0.0, max_rounds=50) == 50
  assert size(2, 100, loop.PROGRESS_S * 3, max_rounds=50) == 1  # slow rounds: one
  # a deadline shortens it to the rounds that fit before it (at least one)
  assert size(2, 100, fast, max_rounds=50, deadline=1000.0 + 3.5 * fast, now=1000.0) == 3
  assert size(2, 100, fast, max_rounds=50, deadline=990.0, now=1000.0) == 1
  assert size(2, 100, fast, max_rounds=50, deadline=2000.0, now=1000.0) == 10
  # processes of a multi-process run read no clock: straight to the stop
  assert size(2, 7, fast, max_rounds=50, processes=2) == 5
  assert size(2, 7, fast, max_rounds=50, processes=2, deadline=0.0, now=1000.0) == 5

def test_smoke_variant_learns_cifar100(tmp_path):
  from fedjax_het.data import make_synthetic
  raw = make_synthetic(9000, 1000, 100, seed=0)
  path = tmp_path / "cifar100.npz"
  np.savez(path, x_train=raw.x_train, y_train=raw.y_train, x_test=raw.x_test,
           y_test=raw.y_test)
  c = config_lib.apply_variant(config_lib.base_config(), "smoke")
  exp = experiment.prepare(config_lib.override(c, {"data.name": "cifar100",
                                                   "data.path": str(path)}))
  held = (exp.class_counts[:, 0] > 0).sum(axis=1)
  np.testing.assert_array_equal(held, [10] * 5)  # the papers' 10 of 100 classes each
  # Trained on tiny models (cheap to compile), 40 of the smoke's 100 examples per class
  # and momentum 0.9 (the papers'): the suite's unoptimised XLA:CPU code took 7.6 s a
  # round on the smoke's 10000 examples (8 rounds to pass 0.3 at momentum 0); 3.4 s here,
  # 0.67 at round 4 and 1.0 at round 5.
  c = config_lib.override(c, {"data.name": "cifar100", "data.path": str(path),
                              "data.subsample_per_class": 40, "momentum": 0.9,
                              "models": "tiny", "checkpoint_every": 0, "num_rounds": 5,
                              "runtime.num_devices": 1})
  summary = loop.run(c, str(tmp_path / "run"), log=lambda s: None)
  assert summary["best_mean_test_acc"] > 0.3  # chance within a client's 10 classes: 0.1


def test_resume_between_evaluations_keeps_the_best_sampled_accuracy(tiny_config, tmp_path,
                                                                   monkeypatch):
  from fedjax_het.training import checkpoint as ckpt_lib
  config = tiny_config(models="tiny", overrides={"num_rounds": 4, "eval_every": 4,
                                                 "checkpoint_every": 2})
  full = loop.run(config, str(tmp_path / "full"), log=lambda s: None)
  save = ckpt_lib.Checkpointer.save

  def crash_after_round_2(self, step, state, meta):
    save(self, step, state, meta)
    if step == 2:
      raise KeyboardInterrupt  # killed after the checkpoint, before any evaluation row
  monkeypatch.setattr(ckpt_lib.Checkpointer, "save", crash_after_round_2)
  with pytest.raises(KeyboardInterrupt):
    loop.run(config, str(tmp_path / "part"), log=lambda s: None)
  monkeypatch.setattr(ckpt_lib.Checkpointer, "save", save)
  resumed = loop.run(config, str(tmp_path / "part"), log=lambda s: None)
  assert resumed["best_sampled_test_acc"] == full["best_sampled_test_acc"]
  assert _strip_wall(_rows(tmp_path / "part")) == _strip_wall(_rows(tmp_path / "full"))


def test_an_init_compiled_at_the_init_level_draws_the_same_state(tiny_config, monkeypatch):
  # the XLA option reaches the compiler (an unknown one would fail it) and changes no
  # more than rounding: level 0's float transforms of the draws differ from level 1's in
  # the last bit at most (the suite's backend compiles at the init level, conftest)
  monkeypatch.setenv("XLA_FLAGS", "")
  monkeypatch.delenv(compile_options.INIT_LEVEL_ENV, raising=False)  # conftest's 0
  exp = experiment.prepare(tiny_config("fedmrl", "tiny,tiny2"), place=False)
  key = jax.random.PRNGKey(0)
  assert compile_options.init_compiler_options("cpu") == {"xla_backend_optimization_level": 1}
  at_init_level = program.jit_init(exp.algorithm.init, "cpu")(key)
  plain = jax.jit(exp.algorithm.init,
                  compiler_options={"xla_backend_optimization_level": 0})(key)
  chex.assert_trees_all_close(at_init_level, plain, atol=1e-7, rtol=0)
  chex.assert_trees_all_equal_shapes_and_dtypes(at_init_level, plain)
