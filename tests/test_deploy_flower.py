"""Real Flower processes on 127.0.0.1 (TLS, authenticated SuperNodes), real CIFAR-10.

One SuperLink and its SuperNodes (``fedjax_het.deploy.loopback``) serve every run of
this module, submitted with ``flwr run`` (the ``runs`` fixture says in which order):

- SuperNodes of clients 0, 1 and 2, the last two with the drill's faults (below, from
  round 3 and 2 on), and an intruder whose key was never registered: the SuperLink
  refuses it and every run goes on with the others.
- FedMRL (2 clients, 2 rounds): the SuperLink is SIGKILLed after its round-1
  checkpoint and restarted; the resubmitted run resumes from its checkpoint, side by
  side with FedMoE (2 clients) and FedAvg (3 clients), 1 round each. The three runs'
  metrics equal the simulator's (same config, seed and partition, one device):
  accuracies to 1e-6 (the simulator averages in float32, the server in float64), losses
  to rtol 1e-5; measured: equal to the printed digits. The 2-client runs refuse client
  2's SuperNode by its registered name.
- The adversarial drill: the FedAvg run continued to 6 rounds (``min-fit-clients=1``, an
  update bound of 100 x the round's reference that rejects): clients 2 (rounds 2-6) and 1 (rounds 3-5;
  in round 2 it serves FedMRL's) send malformed uploads, one kind each (``DRILLS``: a
  torch.Tensor payload, zip bytes, a .npy header longer than its bytes, a header of 2^40
  elements, truncated values, float64 bytes declared float32, NaN, a norm 1e30 times
  the others'), and client 1's SuperNode dies when asked to train round 6 (it never
  answers; the round waits 8 s for it once an upload is in). Client 0 uploads in every
  round. Every round aggregates the others, the server's log names each rejection, and
  no checkpoint holds a non-finite value.

``Federation`` runs the command line (experiments/flower_federation.py), as
tests/test_extending.py uses it. Every process is stopped at teardown.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest
from conftest import COMPILE_BOUND_ENV

pytest.importorskip("flwr")
from fedjax_het.deploy import certs  # noqa: E402
from fedjax_het.deploy import flower  # noqa: E402
from fedjax_het.deploy import forkserver  # noqa: E402
from fedjax_het.deploy import loopback  # noqa: E402
from fedjax_het.deploy import supernode  # noqa: E402
from fedjax_het.training import loop  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.environ.get("FEDJAX_HET_DATA", "")
# Every process compiles far more than it runs (a ClientApp lives for one message; the
# simulator runs 1-2 rounds), so all of them, and the simulator, compile at XLA's level
# 0 (conftest's ``compile_bound``; the processes through ``COMPILE_BOUND_ENV``).
pytestmark = [
    pytest.mark.usefixtures("compile_bound"),
    pytest.mark.slow,
    pytest.mark.xdist_group("flower"),  # one federation at a time on a 2-core machine
    pytest.mark.skipif(not os.path.exists(os.path.join(DATA, "cifar10.npz")),
                       reason="needs FEDJAX_HET_DATA with cifar10.npz"),
]
TIMEOUT = 600
NUM_CLIENTS = 2
# the drill's malformed uploads, {(round, client): (kind, what the server says)}: two a
# round where client 1 is free (FedMRL's round 2 is on its SuperNode too); client 1's
# SuperNode is killed in the last round (``DRILL_ROUNDS``)
DRILLS = {(2, 2): ("torch", "'torch.Tensor' payload; only numpy.ndarray is accepted"),
          (3, 2): ("zip", "not .npy bytes (they start b'PK"),
          (3, 1): ("overlong", ".npy header of 2000 bytes is larger than the 54 bytes"),
          (4, 2): ("huge", "its .npy header says <f4[1099511627776]"),
          (4, 1): ("truncated", "bytes of values after its .npy header"),
          (5, 2): ("dtype", "its .npy header says <f8"),
          (5, 1): ("nan", "array 0 holds non-finite values"),
          (6, 2): ("scaled", "exceeds upload-norm-bound 100 x the round's reference")}
DRILL_ROUNDS = 6


def drill_faults(client: int, kill: bool = False) -> str:
  """``client``'s fault drills (``NodeSettings.fault``): its ``DRILLS``, and a kill in
  the drill's last round."""
  faults = [f"{kind}@{r}" for (r, k), (kind, _) in DRILLS.items() if k == client]
  return ",".join(faults + ([f"kill@{DRILL_ROUNDS}"] if kill else []))
CONFIG = [f"--config={ROOT}/experiments/fedmrl.py:smoke",
          f"--config.num_clients={NUM_CLIENTS}"]
free_port = loopback.free_port


class Federation:
  """experiments/flower_federation.py as a process (``procs[0]``, named 'server').

  Args:
    root: its --workdir (the server's outputs land in ``root/server``).
    port: the SuperLink's port.
    config: the --config flags.
    num_clients: unused (the launcher starts config.num_clients SuperNodes).
    env: extra environment.
    flags: further launcher flags.
    cwd: the launcher's working directory (default ``root``).
  """

  def __init__(self, root, *, port, config=CONFIG, num_clients=NUM_CLIENTS, env=None,
               flags=(), cwd=None):
    del num_clients
    self.root = str(root)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1",
               FEDJAX_HET_DATA=os.path.abspath(DATA), **COMPILE_BOUND_ENV, **(env or {}))
    env.pop("JAX_DEFAULT_PRNG_IMPL", None)  # JAX's default keys, as users run
    log = open(os.path.join(self.root, "server.log"), "a")
    self.procs = [("server", subprocess.Popen(
        [sys.executable, f"{ROOT}/experiments/flower_federation.py", *config,
         f"--workdir={self.root}", f"--port={port}", *flags],
        stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd or self.root))]

  def log(self, name) -> str:
    with open(os.path.join(self.root, f"{name}.log")) as f:
      return f.read()

  def wait(self, timeout=TIMEOUT) -> None:
    """Waits for the launcher; fails with its log tail if it is late."""
    try:
      self.procs[0][1].wait(timeout=timeout)
    except subprocess.TimeoutExpired:
      self.kill()
      pytest.fail(f"still running after {timeout}s:\n{self.log('server')[-3000:]}")

  def kill(self) -> None:
    """SIGTERM (the launcher stops its SuperLink and SuperNodes), SIGKILL if late."""
    p = self.procs[0][1]
    if p.poll() is None:
      p.send_signal(signal.SIGTERM)
      try:
        p.wait(timeout=60)
      except subprocess.TimeoutExpired:
        p.kill()
        p.wait()


def rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def summary(workdir):
  with open(os.path.join(workdir, "summary.json")) as f:
    return json.load(f)


def simulate(spec, overrides, workdir):
  """The simulator on one device with JAX's default keys, as the processes run."""
  c = flower.load_config(spec, overrides)
  c.runtime.num_devices = 1  # a deployment runs every client on one device
  # threefry as in the processes, not conftest's 'unsafe_rbg': its draws under vmap (the
  # simulator's init) differ from one key at a time
  previous = jax.config.jax_default_prng_impl
  jax.config.update("jax_default_prng_impl", "threefry2x32")
  try:
    return loop.run(c, str(workdir), log=lambda s: None)
  finally:
    jax.config.update("jax_default_prng_impl", previous)


def assert_equal_to_simulator(workdir, spec, overrides, sim_dir, num_clients):
  sim = simulate(spec, overrides, sim_dir)
  deployed, simulated = rows(workdir), rows(sim_dir)
  assert [r["round"] for r in deployed] == [r["round"] for r in simulated]
  for d, s in zip(deployed, simulated):
    assert d["mean_test_acc"] == pytest.approx(s["mean_test_acc"], abs=1e-6)
    assert d["train_loss"] == pytest.approx(s["train_loss"], rel=1e-5)
    assert (d["uplink_params"], d["downlink_params"]) == (s["uplink_params"],
                                                          s["downlink_params"])
    assert (d["clients_trained"], d["clients_failed"],
            d["clients_evaluated"]) == (num_clients, 0, num_clients)
  acc = summary(workdir)["per_client_test_acc"]
  np.testing.assert_allclose([acc[str(k)] for k in range(num_clients)],
                             sim["per_client_test_acc"], atol=1e-6)


@pytest.fixture(scope="module")
def link(tmp_path_factory):
  """The SuperLink and SuperNodes every run of this module goes to."""
  root = tmp_path_factory.mktemp("flower")
  env = {"FEDJAX_HET_DATA": os.path.abspath(DATA), "JAX_PLATFORMS": "cpu",
         **COMPILE_BOUND_ENV}
  lb = loopback.Loopback(str(root), port=free_port(), env=env, log=lambda s: None)
  lb.env.pop("JAX_DEFAULT_PRNG_IMPL", None)
  try:
    lb.start_superlink()
    lb.start_client(0)
    lb.start_client(1, fault=drill_faults(1, kill=True))  # and the drill's silent client
    lb.start_client(2, fault=drill_faults(2))
    key = certs.make_node_key(str(root / "intruder"), "client-0")  # never registered
    lb.start_supernode("intruder", {"client-id": 0, "workdir": str(root / "intruder")},
                       key=key)
    yield lb
  finally:
    lb.stop()


def submit(link, name, spec, overrides, **settings):
  """Submits a run whose server writes to <root>/<name>; returns (run id, run config)."""
  config = {"config": f"{ROOT}/{spec}", "overrides": overrides,
            "workdir": link.path(name), "round-timeout": 600.0, "startup-timeout": 600.0,
            **settings}
  return link.submit(config), config


def finish(link, run_id, config):
  status = link.wait(run_id, TIMEOUT)
  assert status == "finished:completed", (status, _tail(config["workdir"]))


def _tail(workdir):
  path = os.path.join(workdir, "server.log")
  return open(path).read()[-3000:] if os.path.exists(path) else "(no server.log)"


# two test-only tiny CNNs for the clients and the shared models (the smoke's CNN-1..5
# took most of every process's time in XLA compiles)
TINY = "models=tiny,tiny2"
SPECS = {"fedmrl": ("experiments/fedmrl.py:smoke", f"num_clients=2 num_rounds=2 eval_every=2 "
                    f"{TINY} algo.small_arch=tiny"),
         "fedmoe": ("experiments/fedmoe.py:smoke", f"num_clients=2 num_rounds=1 {TINY} "
                    "algo.global_arch=tiny"),
         "fedavg": ("experiments/fedavg.py:smoke", "num_clients=3 num_rounds=1 models=tiny")}


@pytest.fixture(scope="module")
def runs(link):
  """Every run of the module; {name: run config}.

  1. FedMRL until its server has checkpointed round 1; then the SuperLink is SIGKILLed
     (the ServerApp dies with it) and restarted (same database: the registered
     SuperNodes reconnect); the restart stops the dead run, so the SuperNodes stop
     pulling its round-2 message (kept running, it held them about 40 s).
  2. FedMRL resubmitted (it resumes from its checkpoint, and its clients from theirs),
     FedMoE and FedAvg submitted beside it: three runs side by side on the same
     SuperNodes. (FedMoE and FedAvg start after the restart: a SuperNode serves one
     message at a time, so their messages before it only delayed FedMRL's round 1.)
  3. The drill: FedAvg resubmitted with 6 rounds on a copy of its outputs (it resumes
     from round 1, and so do its clients, whose state is the config's): clients 1 and
     2's malformed uploads (``DRILLS``), client 1's SuperNode killed in round 6;
     ``min-fit-clients=1``, and a round waits 8 s for stragglers once an upload is in.
  """
  t0 = time.monotonic()
  first, fedmrl = submit(link, "fedmrl", *SPECS["fedmrl"])
  step1 = os.path.join(fedmrl["workdir"], "checkpoints", "1")
  while not os.path.exists(step1) and time.monotonic() < t0 + TIMEOUT:
    time.sleep(0.1)  # orbax renames a step's directory once it is complete
  assert os.path.exists(step1), _tail(fedmrl["workdir"])
  link.kill("superlink")  # SIGKILL
  link.start_superlink()  # stops the run that died with it (Loopback.stop_orphaned_runs)
  assert link.status(first).startswith("finished:")  # stopped, or failed by the SuperLink
  submitted = {"fedmrl": (link.submit(fedmrl), fedmrl)}
  submitted.update({name: submit(link, name, *SPECS[name]) for name in ("fedmoe", "fedavg")})
  for name in ("fedmrl", "fedmoe", "fedavg"):
    finish(link, *submitted[name])
  # alone: a round waits only 8 s for the others once one upload is in (a malformed one
  # counts), so another run's message on a SuperNode would make it a straggler
  faults = dict(submitted["fedavg"][1],
                overrides=(f"num_clients=3 num_rounds={DRILL_ROUNDS} "
                           f"eval_every={DRILL_ROUNDS} models=tiny"),
                workdir=link.path("faults"),
                **{"min-fit-clients": 1, "straggler-timeout": 8.0,
                   "upload-norm-bound": 100.0, "upload-norm-action": "reject",
                   "bench-after": 0})
  shutil.copytree(submitted["fedavg"][1]["workdir"], faults["workdir"])  # FedAvg, continued
  submitted["faults"] = (link.submit(faults), faults)
  finish(link, *submitted["faults"])
  print(f"runs: {time.monotonic() - t0:.0f}s")
  return {name: config for name, (_, config) in submitted.items()}


def test_every_flwr_command_is_forked_from_the_loopbacks_fork_server(runs, link):
  forked = [line for line in link.logs("flwr-cli").splitlines()
            if line.startswith(forkserver.FORKED)]
  # 3 registrations, a list (the restart) and a status, 5 runs submitted and their 5
  # statuses (a stop, if the dead run was still listed): a command the server refused
  # would run afresh, without a line here
  assert len(forked) >= 15, forked


def test_an_unregistered_supernode_is_refused(link):
  intruder = link.procs["intruder"]
  assert intruder.wait(timeout=120) != 0
  assert link.logs("intruder").startswith(supernode.KEPT_IN_STEP)  # fedjax_het's SuperNode
  assert "Failed to activate SuperNode" in link.logs("intruder")
  assert "No SuperNode found with the given public key" in link.logs("superlink")


def test_fedmrl_resumed_after_a_superlink_restart_equals_the_simulator(runs, link,
                                                                      tmp_path):
  workdir = runs["fedmrl"]["workdir"]
  server_log = _tail(workdir)
  assert "server: resumed from round 1" in server_log
  assert "registered as 'client-2': claims client id 2, not one of [0, 2)" in server_log
  for k in range(3):  # every SuperNode keeps its replies in step (deploy.supernode)
    assert link.logs(f"client-{k}").startswith(supernode.KEPT_IN_STEP)
    # ... and starts its ClientApps through the launcher, forked from its fork server
    lines = link.logs(f"client-{k}").splitlines()
    assert supernode.QUICK_CLIENTAPP in lines[1]
    assert lines[2].startswith(forkserver.SERVING)
    assert any(line.startswith(forkserver.FORKED) for line in lines)
    # (a refusal because the checkout's code changed meanwhile is right: a shared one)
    assert not any(forkserver.REFUSED in line and "code changed" not in line
                   for line in lines), lines
  assert_equal_to_simulator(workdir, *SPECS["fedmrl"], tmp_path / "sim", 2)


@pytest.mark.parametrize("algorithm,num_clients", [("fedmoe", 2), ("fedavg", 3)])
def test_fedmoe_and_a_baseline_equal_the_simulator(runs, tmp_path, algorithm,
                                                    num_clients):
  assert_equal_to_simulator(runs[algorithm]["workdir"], *SPECS[algorithm],
                            tmp_path / "sim", num_clients)


def _checkpointed_arrays(workdir):
  """{step: the leaves of the server state's checkpoint} under ``workdir``."""
  import orbax.checkpoint as ocp
  root = os.path.join(workdir, "checkpoints")
  out = {}
  for step in sorted(int(d) for d in os.listdir(root) if d.isdigit()):
    with ocp.StandardCheckpointer() as ckpt:
      out[step] = jax.tree.leaves(ckpt.restore(os.path.join(root, str(step), "state")))
  return out


def test_the_adversarial_drill_runs_on_with_the_other_clients(runs, link):
  workdir = runs["faults"]["workdir"]
  assert [(r["round"], r["clients_evaluated"]) for r in rows(workdir)] == [
      (1, 3), (DRILL_ROUNDS, 2)]
  with open(os.path.join(workdir, "server.log")) as f:
    server_log = f.read()
  assert "server: resumed from round 1" in server_log
  for (r, k), (kind, why) in DRILLS.items():  # each malformed upload: its client's failure
    lines = [line for line in server_log.splitlines()
             if f"round {r}: client {k} failed: " in line]
    assert len(lines) == 1 and why in lines[0], (kind, lines)
  for r in range(2, DRILL_ROUNDS + 1):  # ... and the round aggregates client 0's
    failed = len({k for (r_, k) in DRILLS if r_ == r} | ({1} if r == DRILL_ROUNDS else set()))
    assert f"round {r}: aggregated {3 - failed} uploads ({failed} failed)" in server_log, r
  assert (f"round {DRILL_ROUNDS}: client 1 failed: no reply within round-timeout"
          in server_log)
  assert link.procs["client-1"].wait(timeout=60) == -signal.SIGKILL
  assert "Traceback" not in server_log
  assert summary(workdir)["rounds_completed"] == DRILL_ROUNDS
  assert np.isfinite(summary(workdir)["final_mean_test_acc"])
  checkpoints = _checkpointed_arrays(workdir)
  assert max(checkpoints) == DRILL_ROUNDS
  for step, leaves in checkpoints.items():
    assert all(np.all(np.isfinite(np.asarray(a))) for a in leaves), step
  assert summary(workdir)["environment"]["packages"]["jax"] == jax.__version__  # the server's
