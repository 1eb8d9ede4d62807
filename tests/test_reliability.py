"""Reliability: SIGKILL and resume, corrupted checkpoints, bad input, numerical faults."""
import errno
import json
import os
import re
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import COMPILE_BOUND_ENV
from conftest import TINY_DATA
from conftest import make_tiny_config

from fedjax_het.algorithms import SPECS
from fedjax_het.training import loop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import kill_resume  # noqa: E402

# Smoke configs shrunk further (tiny models, 16x16 synthetic images) so three processes per
# algorithm fit in CI; `python benchmarks/kill_resume.py --all` runs the full smokes.
SHRINK = {
    "fedmrl": ["--config.algo.small_arch=tiny", "--config.algo.d1=20"],
    "fedmoe": ["--config.algo.global_arch=tiny", "--config.algo.gating_hidden=8"],
    # two device types, so FILE weighs two proxies; the server carries WIRE's meta-networks,
    # their Adam state and regressors across the kills
    "moss": ["--config.models=tiny,tiny2", "--config.algo.wire_layers=rep"],
}


# The papers' protocol pieces that carry state or randomness across a kill: momentum and
# weight decay (optimizer state), augmentation keys, the sampled-client evaluation.
PROTOCOL = ["--config.momentum=0.9", "--config.weight_decay=1e-3", "--config.grad_clip=50",
            "--config.data.augment=flip_crop_erase", "--config.eval_sampled=True"]


@pytest.mark.parametrize("name", sorted(SHRINK))
def test_sigkill_and_resume_equals_an_uninterrupted_run(name, tiny_npz, tmp_path):
  cmd = [sys.executable, os.path.join(ROOT, "benchmarks", "kill_resume.py"),
         f"--config={os.path.join(ROOT, 'experiments', name + '.py')}:smoke", "--kills=2",
         f"--workdir={tmp_path}", "--", "--config.models=tiny", "--config.num_rounds=4",
         f"--config.data.path={tiny_npz}", f"--config.data.name={TINY_DATA}", *PROTOCOL,
         *SHRINK[name]]
  # four processes of 4 tiny rounds each (one uninterrupted, two killed, the last
  # resumed), all compiled at level 0 (conftest's ``compile_bound``)
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, **COMPILE_BOUND_ENV))
  assert out.returncode == 0, out.stdout + out.stderr[-3000:]
  assert "killed during a checkpoint write" in out.stdout
  assert "IDENTICAL" in out.stdout
  # the last process resumed from a checkpoint the killed ones wrote (not afresh)
  resumed = re.search(r"last process: resumed from round (\d+) of 4", out.stdout)
  assert resumed and int(resumed.group(1)) > 0, out.stdout


def test_all_means_every_algorithm_config_and_no_other_script():
  names = [os.path.basename(c).removesuffix(".py:smoke") for c in kill_resume.smoke_configs()]
  assert names == sorted(SPECS)  # not main.py, sweep.py, flower_federation.py, ...


def _write_run(workdir, rows, summary):
  os.makedirs(workdir)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump(summary, f)


def test_compare_reports_duplicated_rounds_and_changed_accuracy(tmp_path):
  rows = [{"round": 1, "mean_test_acc": 0.5, "wall_s": 1.0},
          {"round": 2, "mean_test_acc": 0.6, "wall_s": 2.0}]
  _write_run(tmp_path / "a", rows, {"final_mean_test_acc": 0.6})
  _write_run(tmp_path / "b", [dict(r, wall_s=9.0) for r in rows],
             {"final_mean_test_acc": 0.6})
  assert kill_resume.compare(tmp_path / "a", tmp_path / "b") == []  # wall time ignored
  _write_run(tmp_path / "c", rows[:1] + rows, {"final_mean_test_acc": 0.6})
  assert any("duplicated" in p for p in kill_resume.compare(tmp_path / "a", tmp_path / "c"))
  _write_run(tmp_path / "d", [rows[0], dict(rows[1], mean_test_acc=0.6000001)],
             {"final_mean_test_acc": 0.6000001})
  problems = kill_resume.compare(tmp_path / "a", tmp_path / "d")
  assert any(p.startswith("round 2") for p in problems)
  assert any("final_mean_test_acc" in p for p in problems)


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in f]


def test_corrupted_checkpoint_is_skipped_and_the_previous_one_used(tiny_config, tmp_path,
                                                                   caplog):
  config = lambda rounds: tiny_config(models="tiny", overrides={"num_rounds": rounds})
  full = loop.run(config(3), str(tmp_path / "full"), log=lambda s: None)
  run_dir = tmp_path / "run"
  loop.run(config(2), str(run_dir), log=lambda s: None)
  state_dir = run_dir / "checkpoints" / "2" / "state"
  for root, _, files in os.walk(state_dir):
    for name in files:
      open(os.path.join(root, name), "wb").close()  # truncate every file of step 2
  logs = []
  resumed = loop.run(config(3), str(run_dir), log=logs.append)
  assert any("resumed from round 1" in line for line in logs)
  assert "checkpoint step 2 is corrupted" in caplog.text
  assert (tmp_path / "run" / "checkpoints.corrupted" / "2").is_dir()
  assert _rows(run_dir) == _rows(tmp_path / "full")
  assert resumed["per_client_test_acc"] == full["per_client_test_acc"]


def _bad_npz(tmp_path, synthetic_npz, **change):
  arrays = dict(np.load(synthetic_npz))
  arrays.update(change)
  path = tmp_path / "bad.npz"
  np.savez(path, **arrays)
  return str(path)


BAD_INPUTS = {
    "unknown key": (lambda d, p: {"learning_rat": 0.1}, ValueError, "learning_rat"),
    "unknown value": (lambda d, p: {"partition.kind": "patho"}, ValueError,
                      "valid choices"),
    "unknown algo key": (lambda d, p: {"algo.d1": 3}, ValueError, "algo.d1"),
    "missing data path": (lambda d, p: {"data.path": str(p / "none.npz")},
                          FileNotFoundError, "FEDJAX_HET_DATA"),
    "npz shapes": (lambda d, p: {"data.path": _bad_npz(
        p, d, x_train=np.zeros((600, 28, 28, 3), np.uint8))}, ValueError, "shape"),
    "npz dtype": (lambda d, p: {"data.path": _bad_npz(
        p, d, x_train=np.zeros((600, 32, 32, 3), np.float64))}, ValueError, "dtype"),
    "npz labels": (lambda d, p: {"data.path": _bad_npz(
        p, d, y_train=np.full((600,), 10))}, ValueError, "label"),
    "fewer examples than clients": (lambda d, p: {"num_clients": 900}, ValueError,
                                    "num_clients"),
    "partition leaves a client without data": (
        lambda d, p: {"num_clients": 390, "partition.alpha": 0.01}, ValueError,
        "some client still had fewer"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_fails_before_compute_and_keeps_the_previous_run(
    case, synthetic_npz, tmp_path, monkeypatch):
  workdir = tmp_path / "run"
  workdir.mkdir()
  before = {}
  for name in ("metrics.jsonl", "summary.json", "config.json", "partition.json"):
    (workdir / name).write_text(f"previous {name}\n")
    before[name] = (workdir / name).read_text()
  make_overrides, error, message = BAD_INPUTS[case]

  def no_compile(*args, **kwargs):
    raise AssertionError("compiled before the input was checked")

  monkeypatch.setattr(loop, "compile_fns", no_compile)
  with pytest.raises(error, match=message):
    # CIFAR-10's name and shape: its npz is checked against them
    loop.run(make_tiny_config(synthetic_npz, overrides=make_overrides(synthetic_npz, tmp_path)),
             str(workdir), log=lambda s: None)
  assert sorted(os.listdir(workdir)) == sorted(before)
  assert {n: (workdir / n).read_text() for n in before} == before


def _poisoned(at_round: int, group: int, where: str):
  """Standalone whose round writes a NaN into group ``group`` at round ``at_round``."""
  def build(c, rt):
    alg = SPECS[c.algorithm].build(c, rt)

    def round_fn(state, data):
      state, metrics = alg.round(state, data)
      hit = state.round == at_round
      if where == "params":
        clients = list(state.clients)
        clients[group] = jax.tree.map(
            lambda x: jnp.where(hit, jnp.nan, x) if jnp.issubdtype(x.dtype, jnp.floating)
            else x, clients[group])
        state = state.replace(clients=tuple(clients))
      else:
        loss = metrics["group_train_loss"]
        metrics = dict(metrics, group_train_loss=loss.at[group].set(
            jnp.where(hit, jnp.nan, loss[group])))
      return state, metrics

    return alg._replace(round=round_fn)
  return build


@pytest.mark.parametrize("where,what", [("params", "parameter"), ("loss", "train loss")])
def test_non_finite_stops_with_round_and_group_keeping_good_checkpoints(
    where, what, tiny_config, tmp_path):
  config = tiny_config(overrides={"num_rounds": 4})
  with pytest.raises(FloatingPointError,
                     match=f"non-finite {what} at round 3 in client group 1 \\(tiny2\\)"):
    loop.run(config, str(tmp_path), log=lambda s: None, build=_poisoned(3, 1, where))
  assert sorted(int(s) for s in os.listdir(tmp_path / "checkpoints")) == [1, 2]
  assert [r["round"] for r in _rows(tmp_path)] == [1, 2]


def test_a_key_newer_than_a_checkpoint_counts_at_its_default():
  from fedjax_het import validation
  from fedjax_het.training import checkpoint as ckpt
  defaults = validation.flat_defaults("fedmrl")
  assert defaults["algo.aggregation"] == "paper" and defaults["drop_last"] is False
  saved = {"num_clients": 10}
  assert ckpt.fingerprint_diff(saved, {"num_clients": 10, "drop_last": False},
                               defaults) == []
  assert ckpt.fingerprint_diff(saved, {"num_clients": 10, "drop_last": True},
                               defaults) == ["drop_last"]
  assert ckpt.fingerprint_diff(saved, {"num_clients": 10, "drop_last": False}) == [
      "drop_last"]


def test_a_relative_checkpoint_directory_restores(tmp_path, monkeypatch):
  """orbax refuses relative paths on restore; a Checkpointer given one (as
  ``claims_page.py --results=results`` gives the gates reader) must still read its steps,
  not quarantine them as corrupted."""
  from fedjax_het.training import checkpoint as ckpt_lib
  monkeypatch.chdir(tmp_path)
  state = {"w": jnp.arange(3.0)}
  ckpt = ckpt_lib.Checkpointer("run/checkpoints", max_to_keep=2, fingerprint={"a": 1})
  ckpt.save(1, state, {"round": 1})
  ckpt.close()
  ckpt = ckpt_lib.Checkpointer("run/checkpoints", max_to_keep=2, fingerprint={"a": 1})
  restored, _ = ckpt.restore_latest(jax.eval_shape(lambda: state))
  ckpt.close()
  np.testing.assert_array_equal(restored["w"], [0.0, 1.0, 2.0])
  assert not os.path.exists(tmp_path / "run" / "checkpoints.corrupted")


# tensorstore's words, as orbax passed them on when a claims sweep filled its disk
ENOSPC_TEXT = ('RESOURCE_EXHAUSTED: Error writing "clients.0.opt_state.2.0.trace.local.'
               'extractor.conv2.kernel/0.0.0.0.0" in OCDBT database at local file "x/": '
               'Failed to write 81678336 bytes to file 17: No space left on device '
               "[os_error_code='28']")


def _save_fails_at(monkeypatch, step, error):
  """orbax's save of ``step`` leaves a half-written step directory and raises ``error``."""
  import orbax.checkpoint as ocp
  real = ocp.CheckpointManager.save

  def save(self, at, *args, **kwargs):
    if at != step:
      return real(self, at, *args, **kwargs)
    os.makedirs(os.path.join(os.fspath(self.directory), f"{at}.orbax-checkpoint-tmp-7",
                             "state"))
    raise error

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)


def test_a_full_disk_removes_the_half_step_and_names_the_one_kept(tmp_path, monkeypatch):
  from fedjax_het.training import checkpoint as ckpt_lib
  directory = tmp_path / "checkpoints"
  ckpt = ckpt_lib.Checkpointer(str(directory), max_to_keep=2, fingerprint={"a": 1})
  state = {"w": jnp.arange(3.0)}
  _save_fails_at(monkeypatch, 1, ValueError(ENOSPC_TEXT))
  with pytest.raises(ckpt_lib.DiskFull, match=r"round 1 not written .*no space left on "
                     r"device .*no earlier checkpoint: free space and rerun"):
    ckpt.save(1, state, {"round": 1})
  assert os.listdir(directory) == []
  monkeypatch.undo()
  ckpt.save(1, state, {"round": 1})
  for error in (ValueError(ENOSPC_TEXT), OSError(errno.ENOSPC, "No space left on device")):
    _save_fails_at(monkeypatch, 2, error)
    with pytest.raises(ckpt_lib.DiskFull,
                       match=r"checkpoint of round 2 not written to .*checkpoints: no space "
                       r"left on device \(\d+ MiB free there now\); the newest complete "
                       r"checkpoint, round 1, is kept: free space and rerun") as raised:
      ckpt.save(2, state, {"round": 2})
    assert raised.value.errno == errno.ENOSPC and raised.value.__cause__ is error
    assert os.listdir(directory) == ["1"] and ckpt.steps() == [1]
  _save_fails_at(monkeypatch, 2, ValueError("something else"))
  with pytest.raises(ValueError, match="^something else$"):  # other errors pass unchanged
    ckpt.save(2, state, {"round": 2})
  os.rename(directory / "2.orbax-checkpoint-tmp-7", tmp_path / "left")  # orbax's to mend
  # a step that would not fit (less free space than the newest step takes) is not begun
  _save_fails_at(monkeypatch, 2, AssertionError("the write was begun"))
  monkeypatch.setattr(ckpt_lib.shutil, "disk_usage", lambda path: types.SimpleNamespace(
      free=ckpt_lib._size(str(directory / "1")) - 1))
  with pytest.raises(ckpt_lib.DiskFull, match=r"round 2 not written to .*checkpoints: it "
                     r"needs about \d+\.\d MiB \(the size of round 1's\) and \d+\.\d MiB are "
                     r"free there; the newest complete checkpoint, round 1, is kept"):
    ckpt.save(2, state, {"round": 2})
  assert os.listdir(directory) == ["1"]
  monkeypatch.undo()
  restored, meta = ckpt.restore_latest(jax.eval_shape(lambda: state))
  ckpt.close()
  assert meta["round"] == 1
  np.testing.assert_array_equal(restored["w"], [0.0, 1.0, 2.0])


def test_a_run_that_fills_the_disk_stops_and_its_rerun_resumes(tiny_config, tmp_path,
                                                               monkeypatch):
  from fedjax_het.sweeps import runner
  from fedjax_het.sweeps.plan import Run
  from fedjax_het.training import checkpoint as ckpt_lib
  config = tiny_config(overrides={"num_rounds": 3, "checkpoint_every": 1})
  _save_fails_at(monkeypatch, 2, ValueError(ENOSPC_TEXT))
  run = Run("standalone", "N=8", 0, config, str(tmp_path / "run"))
  with pytest.raises(ckpt_lib.DiskFull, match="round 1, is kept"):
    runner.run_batch([run], lambda line: None)  # not a failed run: the sweep stops on it
  monkeypatch.undo()
  logs = []
  loop.run(config, str(tmp_path / "run"), log=logs.append)
  assert logs[0].startswith("resumed from round 1")
  assert [r["round"] for r in _rows(tmp_path / "run")] == [1, 2, 3]


def test_prune_keeps_the_last_step_none_or_all(tmp_path):
  from fedjax_het.training import checkpoint as ckpt_lib

  def make():
    d = tmp_path / "checkpoints"
    for name in ("10", "20", "30.orbax-checkpoint-tmp-1"):  # the tmp: a killed write
      os.makedirs(d / name)
      (d / name / "state").write_bytes(b"x" * 100)
    os.makedirs(f"{d}.corrupted/5")
    return str(d)

  d = make()
  assert ckpt_lib.prune(d, "all") == 0 and len(os.listdir(d)) == 3
  assert ckpt_lib.prune(d, "last") == 200
  assert os.listdir(d) == ["20"] and os.path.isdir(f"{d}.corrupted/5")
  assert ckpt_lib.prune(d, "last") == 0  # nothing left to remove
  assert ckpt_lib.prune(d, "none") == 100
  assert not os.path.exists(d) and not os.path.exists(f"{d}.corrupted")
  assert ckpt_lib.prune(d, "none") == 0  # no directory: nothing to do
  with pytest.raises(ValueError, match="keep='some'"):
    ckpt_lib.prune(make(), "some")
  assert len(os.listdir(d)) == 3  # refused before removing anything
