"""FedMRL over Flower on loopback: one server and 3 client processes on real CIFAR-10.

- The deployment reproduces the simulator (same config, seed and partition, one device):
  per-client test accuracies equal to 1e-6 (the simulator averages them in float32, the
  server in float64) and train losses to rtol 1e-5; measured: equal to the printed digits.
- A client SIGKILLed while asked to train round 2 does not stop the round: with
  ``--min_fit_clients=2`` the server aggregates the other two and finishes the run.
- The whole federation (server and clients) SIGKILLed after the server checkpointed
  round 2 and started again with the same commands finishes round 3 exactly as the
  uninterrupted run did.

Every process is killed at teardown; each federation is bounded by ``TIMEOUT`` seconds.
"""
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from fedjax_het.training import loop

pytest.importorskip("flwr")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("FEDJAX_HET_DATA", "")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.xdist_group("flower"),  # one federation at a time on a 2-core machine
    pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "cifar10.npz")),
                       reason="needs FEDJAX_HET_DATA with cifar10.npz"),
]
TIMEOUT = 420
NUM_CLIENTS = 3
CONFIG = [f"--config={ROOT}/experiments/fedmrl.py:smoke",
          f"--config.num_clients={NUM_CLIENTS}"]


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


class Federation:
  """A server and its client processes; ``kill()`` ends every one of them.

  ``config``: the ``--config`` flags of every process; ``env``: extra environment.
  """

  def __init__(self, root, *, port, server_flags=(), client_flags=None, config=CONFIG,
               num_clients=NUM_CLIENTS, env=None):
    self.root, self.procs = str(root), []
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
               FEDJAX_HET_DATA=os.path.abspath(DATA), **(env or {}))
    env.pop("JAX_DEFAULT_PRNG_IMPL", None)  # JAX's default keys, as users run
    address = f"--address=127.0.0.1:{port}"
    self._start("server", [f"{ROOT}/experiments/flower_server.py", *config, address,
                           f"--workdir={self.root}/server", *server_flags], env)
    for k in range(num_clients):
      extra = (client_flags or {}).get(k, [])
      self._start(f"client{k}", [f"{ROOT}/experiments/flower_client.py", *config, address,
                                 f"--client_id={k}", f"--workdir={self.root}/client{k}",
                                 *extra], env)

  def _start(self, name, args, env):
    log = open(os.path.join(self.root, f"{name}.log"), "a")
    self.procs.append((name, subprocess.Popen([sys.executable, *args], stdout=log,
                                              stderr=subprocess.STDOUT, env=env,
                                              cwd=self.root, start_new_session=True)))

  def log(self, name) -> str:
    with open(os.path.join(self.root, f"{name}.log")) as f:
      return f.read()

  def wait(self, timeout=TIMEOUT) -> None:
    """Waits for every process; fails with the server's log tail if one is late."""
    deadline = time.time() + timeout
    for name, p in self.procs:
      try:
        p.wait(timeout=max(1.0, deadline - time.time()))
      except subprocess.TimeoutExpired:
        self.kill()
        pytest.fail(f"{name} still running after {timeout}s; server log:\n"
                    f"{self.log('server')[-3000:]}")

  def kill(self) -> None:
    for _, p in self.procs:
      if p.poll() is None:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def strip_wall(rs):
  return [{k: v for k, v in r.items() if k != "wall_s"} for r in rs]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
  """An uninterrupted 3-round deployment: (its workdir root, server summary)."""
  root = tmp_path_factory.mktemp("flower_full")
  fed = Federation(root, port=free_port())
  try:
    fed.wait()
  finally:
    fed.kill()
  assert fed.procs[0][1].returncode == 0, fed.log("server")[-3000:]
  with open(root / "server" / "summary.json") as f:
    return root, json.load(f)


def simulator_run(workdir):
  spec = importlib.util.spec_from_file_location("fedmrl_config",
                                                f"{ROOT}/experiments/fedmrl.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config("smoke")
  c.num_clients = NUM_CLIENTS
  c.runtime.num_devices = 1  # a deployment runs every client on one device
  # JAX's default (threefry) keys as in the deployed processes, not conftest's 'rbg':
  # rbg draws under vmap (the simulator's init) differ from one key at a time.
  previous = jax.config.jax_default_prng_impl
  jax.config.update("jax_default_prng_impl", "threefry2x32")
  try:
    return loop.run(c, str(workdir), log=lambda s: None)
  finally:
    jax.config.update("jax_default_prng_impl", previous)


def test_flower_federation_matches_simulator(uninterrupted, tmp_path):
  root, summary = uninterrupted
  sim = simulator_run(tmp_path / "sim")
  deployed = rows(root / "server")
  simulated = rows(tmp_path / "sim")
  assert [r["round"] for r in deployed] == [1, 2, 3]
  for d, s in zip(deployed, simulated):
    assert d["mean_test_acc"] == pytest.approx(s["mean_test_acc"], abs=1e-6)
    assert d["train_loss"] == pytest.approx(s["train_loss"], rel=1e-5)
    assert d["uplink_params"] == s["uplink_params"]  # theta only, per client
    assert d["downlink_params"] == s["downlink_params"]
    assert (d["clients_trained"], d["clients_failed"]) == (NUM_CLIENTS, 0)
  acc = [summary["per_client_test_acc"][str(k)] for k in range(NUM_CLIENTS)]
  np.testing.assert_allclose(acc, sim["per_client_test_acc"], atol=1e-6)
  assert summary["rounds_completed"] == 3


def test_killed_client_does_not_stop_the_round(tmp_path):
  fed = Federation(tmp_path, port=free_port(),
                   server_flags=["--min_fit_clients=2", "--min_available_clients=2"],
                   client_flags={2: ["--kill_at_round=2"]})
  try:
    fed.wait()
  finally:
    fed.kill()
  assert fed.procs[0][1].returncode == 0, fed.log("server")[-3000:]
  assert fed.procs[3][1].returncode == -signal.SIGKILL
  rs = rows(tmp_path / "server")
  assert [r["round"] for r in rs] == [1, 2, 3]
  assert [(r["clients_trained"], r["clients_failed"]) for r in rs] == [(3, 0), (2, 1),
                                                                        (2, 0)]
  assert [r["clients_evaluated"] for r in rs] == [3, 2, 2]
  assert "round 2: aggregated 2 uploads (1 failed)" in fed.log("server")


def test_whole_federation_resumes_from_the_server_checkpoint(uninterrupted, tmp_path):
  full_root, full_summary = uninterrupted
  port = free_port()
  fed = Federation(tmp_path, port=port)
  step2 = tmp_path / "server" / "checkpoints" / "2"
  deadline = time.time() + TIMEOUT
  while not step2.exists() and time.time() < deadline:  # orbax renames a finished step
    time.sleep(0.05)
  fed.kill()  # SIGKILL the server and every client
  assert step2.exists(), fed.log("server")[-3000:]
  fed = Federation(tmp_path, port=port)
  try:
    fed.wait()
  finally:
    fed.kill()
  assert "resumed from round 2" in fed.log("server")
  assert strip_wall(rows(tmp_path / "server")) == strip_wall(rows(full_root / "server"))
  with open(tmp_path / "server" / "summary.json") as f:
    resumed = json.load(f)
  assert resumed["per_client_test_acc"] == full_summary["per_client_test_acc"]
