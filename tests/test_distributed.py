"""Multi-process runs: 2 processes x 2 CPU devices against 1 process x 4 devices.

The two processes run ``experiments/main.py`` with ``--coordinator_address``,
``--num_processes=2``, ``--process_id`` on a free loopback port (gloo collectives over
TCP); the reference runs in this pytest process (4 CPU devices from conftest). Both
shard the client axis over 4 devices the same way, so they compute the same program;
only the order in which a cross-device all-reduce adds its 4 partial sums differs
(XLA's in-process CPU collectives vs gloo's ring), which moves float32 sums by an ulp
or so. Hence: per-client accuracies and communication counters equal exactly, the means
reduced on the device (the train loss, the mean test accuracy over clients, the sampled
clients' mean accuracy) to ``rtol=1e-6`` (a few float32 ulps); a resumed 2-process run
equals an uninterrupted 2-process run exactly.
"""
import json
import os
import re
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import COMPILE_BOUND_ENV
from conftest import SHARDED

from fedjax_het import distributed
from fedjax_het.training import loop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from fedjax_het.config_files import flatten  # noqa: E402

MAIN = os.path.join(ROOT, "experiments", "main.py")
LAUNCH_TIMEOUT_S = 240


def config_flags(config) -> list[str]:
  """``--config.key=value`` for every leaf of a config, so a subprocess runs exactly it."""
  return [f"--config.{k}={v}" for k, v in flatten(config.to_dict()).items()]


def free_port() -> int:
  """A TCP port nothing listens on now (loopback)."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run_two_processes(config, workdir) -> list[str]:
  """Runs ``config`` as 2 processes x 2 CPU devices; returns each process's stdout.

  Both processes are killed if one fails or ``LAUNCH_TIMEOUT_S`` passes.
  """
  port = free_port()
  env = dict(os.environ, **COMPILE_BOUND_ENV, JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES="2",
             JAX_DEFAULT_PRNG_IMPL=jax.config.jax_default_prng_impl,  # this process's
             JAX_COORDINATOR_BIND_ADDRESS=f"127.0.0.1:{port}")
  base = [sys.executable, MAIN, f"--config={os.path.join(ROOT, 'experiments', 'fedavg.py')}",
          f"--workdir={workdir}", f"--coordinator_address=127.0.0.1:{port}",
          "--num_processes=2", *config_flags(config)]
  logs = [f"{workdir}.p{i}.log" for i in range(2)]
  procs = []
  try:
    for i, log in enumerate(logs):
      with open(log, "w") as f:  # a file, not a pipe: orbax logs a lot to stderr
        procs.append(subprocess.Popen(base + [f"--process_id={i}"], stdout=f,
                                      stderr=subprocess.STDOUT, cwd=ROOT, env=env))
    deadline = time.monotonic() + LAUNCH_TIMEOUT_S
    while any(p.poll() is None for p in procs):
      if any(p.poll() not in (None, 0) for p in procs) or time.monotonic() > deadline:
        break
      time.sleep(0.2)
  finally:
    for p in procs:  # the other process would wait for its peer until a timeout
      if p.poll() is None:
        p.kill()
      p.wait()
  outputs = [open(log).read() for log in logs]
  for i, (p, out) in enumerate(zip(procs, outputs)):
    assert p.returncode == 0, f"process {i} exited with {p.returncode}:\n{out[-4000:]}"
  return outputs


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in f]


def _summary(workdir):
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  summary.pop("timing")  # wall-clock figures differ between identical runs
  return summary


@pytest.mark.compile_bound  # 3 rounds: level 0, and so are the processes (COMPILE_BOUND_ENV)
def test_two_processes_match_one_process_and_resume(tiny_config, tmp_path):
  config = lambda rounds: tiny_config("fedavg", "tiny", {"num_rounds": rounds, **SHARDED})
  one = loop.run(config(3), str(tmp_path / "one"), log=lambda s: None)
  two_dir = tmp_path / "two"
  out0, out1 = run_two_processes(config(3), two_dir)

  # ---- the same metrics as one process with the same 4-device mesh
  assert one["config"] == _summary(two_dir)["config"]
  assert _summary(two_dir)["per_client_test_acc"] == one["per_client_test_acc"]
  assert [s["environment"]["processes"] for s in (one, _summary(two_dir))] == [1, 2]
  rows_one, rows_two = _rows(tmp_path / "one"), _rows(two_dir)
  assert [r["round"] for r in rows_two] == [1, 2, 3]
  # means reduced across devices on device: a few float32 ulps apart (module docstring)
  reduced = ("train_loss", "mean_test_acc", "sampled_test_acc", "best_sampled_test_acc")
  for a, b in zip(rows_one, rows_two):
    assert {k: v for k, v in a.items() if k not in reduced} == \
        {k: v for k, v in b.items() if k not in reduced}
    for k in reduced:
      np.testing.assert_allclose(b[k], a[k], rtol=1e-6)
  # ---- process 0 prints and writes; process 1 stays quiet
  assert "round 3/3" in out0 and "final mean test acc" in out0
  assert not re.search(r"^(round \d|resumed|final mean)", out1, re.MULTILINE)
  assert {"config.json", "partition.json", "metrics.jsonl", "summary.json",
          "checkpoints"} <= set(os.listdir(two_dir))

  # ---- 2 rounds, then resumed to 3: exactly the uninterrupted 2-process run
  resumed_dir = tmp_path / "resumed"
  run_two_processes(config(2), resumed_dir)
  out0, _ = run_two_processes(config(3), resumed_dir)
  assert "resumed from round 2" in out0
  assert _rows(resumed_dir) == rows_two
  assert _summary(resumed_dir) == _summary(two_dir)


def test_main_refuses_bad_process_flags_before_compute(tmp_path):
  cmd = [sys.executable, MAIN, f"--config={os.path.join(ROOT, 'experiments', 'fedavg.py')}",
         f"--workdir={tmp_path / 'run'}", "--coordinator_address=127.0.0.1:1",
         "--num_processes=2", "--process_id=2"]
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=ROOT,
                       env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 2
  assert "--process_id=2: must lie in [0, 2)" in out.stderr
  assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flags,message", [
    (("h:1", None, 0, False), "missing --num_processes"),
    ((None, 2, None, False), "missing --coordinator_address, --process_id"),
    (("h:1", 2, 0, True), "do not combine"),
    (("localhost", 2, 0, False), "expected host:port"),
    (("h:1", 0, 0, False), "--num_processes=0"),
    (("h:1", 2, -1, False), r"--process_id=-1: must lie in \[0, 2\)"),
])
def test_bad_process_flags_are_named(flags, message):
  with pytest.raises(ValueError, match=message):
    distributed.validate_flags(*flags)


def test_process_flags_resolve():
  assert distributed.validate_flags(None, None, None) is None
  assert distributed.validate_flags("", None, None, auto=True) == distributed.JoinArgs()
  assert distributed.validate_flags("10.0.0.1:1234", 4, 3) == ("10.0.0.1:1234", 4, 3)
