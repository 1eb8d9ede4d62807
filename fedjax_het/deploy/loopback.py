"""A federation on one machine: a SuperLink and SuperNodes as real processes on 127.0.0.1.

``Loopback`` starts ``flower-superlink`` (TLS with a throwaway CA, SuperNode
authentication, its state in an SQLite database so that a restarted SuperLink keeps its
registered SuperNodes), registers each SuperNode's public key under the name
``client-<k>`` (``flwr supernode register``), starts one SuperNode per client with its
node config (``flower-supernode`` as ``fedjax_het.deploy.supernode`` keeps it in step
with its replies after a run stops), submits the Flower App (``flwr run``) and follows
the run, all through Flower's own command-line tools. Everything lives under one
directory:

  <workdir>/tls/          ca.crt, ca.key, server.crt, server.key (``certs.make_tls``;
                          TESTING ONLY)
  <workdir>/tls/nodes/    <name>.crt, <name>.key: each SuperNode's own certificate for
                          its local Runtime API (``certs.make_supernode_tls``)
  <workdir>/keys/         client-<k>, client-<k>.pub (``certs.make_node_key``)
  <workdir>/flwr_home/    $FLWR_HOME of every process: the CLI's connection, installed apps
  <workdir>/superlink.db  the SuperLink's state
  <workdir>/logs/         one log per process (flwr-cli.log: the flwr commands' fork server)
  <workdir>/server/       the ServerApp's outputs (``ServerSettings.workdir``)
  <workdir>/client<k>/    client k's state, data cache and compiled programs

Every folder above is created with mode 0700 and refused, with one line, unless it is
owned by this user and writable by nobody else (``private.ensure_private``), and every
key and certificate is written with mode 0600 (``private.write_private``). The
SuperNodes fork their ClientApps from a fork server (``--fork-server``), and the
``flwr`` commands come from one too. Paths in ``env`` (``FEDJAX_HET_DATA``,
``FEDJAX_HET_DATA_CACHE``) and a client's ``data_path`` are made absolute first: every
process runs in ``workdir``.

``experiments/flower_federation.py`` is its command line; tests/test_deploy_flower.py
drives it directly. Insecure mode (no TLS, no authentication) exists for debugging only
and says so when it starts.
"""
from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from typing import Callable, Mapping

from fedjax_het.deploy import certs
from fedjax_het.deploy import forkserver
from fedjax_het.deploy import private

APP_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flower_app")
CONNECTION = "fedjax-loopback"  # the flwr CLI's name for this SuperLink
# seconds a SuperNode waits between pulls that found no message (Flower's own: 3 s; on
# one machine a pull costs next to nothing)
POLL_INTERVAL = 0.5
# environment variables holding paths, made absolute before any process starts
PATH_VARIABLES = ("FEDJAX_HET_DATA", "FEDJAX_HET_DATA_CACHE")
FINISHED = "finished"  # run statuses start with it: finished:completed, finished:failed
INSECURE_BANNER = (
    "WARNING: INSECURE MODE. Every connection (SuperLink <-> SuperNodes, flwr CLI <-> "
    "SuperLink) is plaintext and any process that can reach the port may join as a "
    "SuperNode. Use it to debug on a trusted machine only.")


def free_port() -> int:
  """A TCP port free on 127.0.0.1 now."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def node_config(values: Mapping[str, object]) -> str:
  """``{'client-id': 0, 'workdir': '/w'}`` -> ``client-id=0 workdir="/w"`` (--node-config)."""
  return " ".join(f"{k}={json.dumps(v)}" for k, v in values.items())


# the flwr command line as a fork server runs it, and the launcher of one command
FLWR_CLI = "fedjax_het.deploy.loopback:flwr_cli"
_FLWR_LAUNCHER = ("import sys; sys.argv[0] = 'flwr'; from fedjax_het.deploy import "
                  f"forkserver; forkserver.launch_or_run({FLWR_CLI!r})")


def flwr_cli() -> Callable[[], None]:
  """Flower's ``flwr`` command line (``flwr.cli.app.app``, its arguments from
  ``sys.argv``) as a function that exits with its exit code."""
  from flwr.cli.app import app  # pylint: disable=import-outside-toplevel
  return lambda: sys.exit(app())


def _json_of(output: str) -> dict:
  """The JSON object a ``flwr ... --format json`` command printed."""
  return json.loads(output[output.index("{"):])


class Loopback:
  """A SuperLink, its SuperNodes and the runs submitted to it (see module docstring).

  Args:
    workdir: where everything lives (created).
    port: the SuperLink's port (Fleet, Control and Runtime APIs over HTTPS).
    insecure: plaintext and no SuperNode authentication (says so loudly).
    env: extra environment of every process (``FEDJAX_HET_DATA``, ``PYTHONPATH``).
    log: where progress lines go.
    import_dir: put first on every process's ``PYTHONPATH`` (default: the current
      directory), so that a config naming the user's own code
      (``algorithm='examples.fedprox:SPEC'``) imports it in the SuperLink's and the
      SuperNodes' processes, which run in ``workdir``, as it does in the launcher's.
  """

  def __init__(self, workdir: str, *, port: int, insecure: bool = False,
               env: Mapping[str, str] | None = None, log: Callable[[str], None] = print,
               import_dir: str | None = None):
    self.workdir, self.port, self.insecure, self.log = (os.path.abspath(workdir), port,
                                                        insecure, log)
    self.procs: dict[str, subprocess.Popen] = {}
    self.registered: set[str] = set()  # names registered by this object
    self._cli_server = None  # (the flwr CLI's fork server, its environment): ``flwr``
    bindir = os.path.dirname(sys.executable)  # flower-superexec & co. are found on PATH
    private.ensure_private(self.workdir)
    self.env = dict(os.environ, **(env or {}), FLWR_HOME=self.path("flwr_home"),
                    FLWR_TELEMETRY_ENABLED="0", FLWR_SUPEREXEC_TASK_POLL_INTERVAL="0.2",
                    PYTHONUNBUFFERED="1",
                    PATH=bindir + os.pathsep + os.environ.get("PATH", ""))
    self.env["PYTHONPATH"] = os.pathsep.join(
        p for p in (os.path.abspath(import_dir or os.getcwd()),
                    self.env.get("PYTHONPATH", "")) if p)
    for name in PATH_VARIABLES:  # every process runs in workdir
      if self.env.get(name):
        self.env[name] = os.path.abspath(self.env[name])
    self.bin = lambda name: os.path.join(bindir, name)
    for d in ("logs", "flwr_home", "keys"):
      private.ensure_private(self.path(d))
    self.tls = None if insecure else self._tls()
    self._write_connection()
    if insecure:
      log(INSECURE_BANNER)

  def path(self, *parts: str) -> str:
    return os.path.join(self.workdir, *parts)

  def _tls(self) -> certs.TlsFiles:
    files = certs.TlsFiles(self.path("tls", "ca.crt"), self.path("tls", "server.crt"),
                           self.path("tls", "server.key"))
    if all(map(os.path.exists, (files.ca_cert, files.server_cert, files.server_key))):
      return files
    return certs.make_tls(self.path("tls"))

  def _write_connection(self) -> None:
    """The flwr CLI's connection to this SuperLink ($FLWR_HOME/config.toml)."""
    lines = ["[superlink]", f'default = "{CONNECTION}"', "", f"[superlink.{CONNECTION}]",
             f'address = "127.0.0.1:{self.port}"']
    lines.append("insecure = true" if self.insecure else
                 f"root-certificates = {json.dumps(self.tls.ca_cert)}")
    with open(self.path("flwr_home", "config.toml"), "w") as f:
      f.write("\n".join(lines) + "\n")

  # ---- processes
  def _start(self, name: str, args: list[str]) -> subprocess.Popen:
    """Starts ``args`` in its own session (so it and its children stop together)."""
    log = open(self.path("logs", f"{name}.log"), "a")
    proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                            cwd=self.workdir, start_new_session=True)
    log.close()
    self.procs[name] = proc
    return proc

  def logs(self, name: str) -> str:
    with open(self.path("logs", f"{name}.log")) as f:
      return f.read()

  def flwr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    """Runs the ``flwr`` command line against this SuperLink.

    Each command is forked from a fork server of the command line (``forkserver``,
    started at the first command, stopped by ``stop``; its lines in
    ``logs/flwr-cli.log``): Flower's CLI imports took 0.8 of a command's 0.9 CPU s.
    Where that server cannot start, each command imports them.
    """
    if self._cli_server is None:
      env = dict(self.env)
      with open(self.path("logs", "flwr-cli.log"), "a") as log:
        proc, path = forkserver.start(target=FLWR_CLI, environ=env, stderr=log)
      line = forkserver.wait_until_listening(proc, path, environ=env)
      if line.startswith(forkserver.REFUSED):
        self.log(f"federation: flwr commands: {line}")
      self._cli_server = (proc, env)
    out = subprocess.run([sys.executable, "-c", _FLWR_LAUNCHER, *args], capture_output=True,
                         text=True, env=self._cli_server[1], cwd=self.workdir, timeout=120)
    if check and out.returncode:
      raise RuntimeError(f"flwr {' '.join(args)} failed ({out.returncode}):\n"
                         f"{out.stdout}\n{out.stderr}")
    return out

  def start_superlink(self, timeout: float = 60) -> None:
    """Starts (or restarts) the SuperLink and waits until it accepts connections.

    A restart (the database exists) then stops every run the database still holds as
    unfinished (``stop_orphaned_runs``).
    """
    restart = os.path.exists(self.path("superlink.db"))
    args = [self.bin("flower-superlink"), "--host", "127.0.0.1", "--port", str(self.port),
            "--database", self.path("superlink.db"),
            "--disable-runtime-dependency-installation"]
    if self.insecure:
      args.append("--insecure")
    else:
      args += ["--ssl-ca-certfile", self.tls.ca_cert, "--ssl-certfile",
               self.tls.server_cert, "--ssl-keyfile", self.tls.server_key,
               "--enable-supernode-auth"]
    proc = self._start("superlink", args)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
      if proc.poll() is not None:
        raise RuntimeError(f"the SuperLink exited:\n{self.logs('superlink')[-3000:]}")
      try:
        socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
      except OSError:
        time.sleep(0.2)
        continue
      if restart:
        self.stop_orphaned_runs()
      return
    raise RuntimeError(f"the SuperLink did not listen on {self.port} within {timeout}s")

  def stop_orphaned_runs(self) -> list[int]:
    """Stops (``flwr stop``) the runs a restarted SuperLink's database holds as not
    finished; returns the ids of those it stopped.

    Their ServerApps ran under the previous SuperLink and died with it, and so did the
    objects of the messages they had sent (a SuperLink keeps them in memory). Left
    running, such a run holds every SuperNode that was pulling one of its messages:
    Flower's SuperNode retries a missing object with a growing backoff until the run is
    marked failed for its missed heartbeats (about 40 s in tests/test_deploy_flower.py,
    before any message of a resubmitted run). Stopped, the next retry is refused and the
    SuperNode moves on. A resubmitted run is a new run, so nothing of the stopped ones
    is needed. A run the SuperLink finishes itself meanwhile is left as it is: Flower says
    ``Run is already finished``, or, where the run finished between its check and the
    stop, ``couldn't be stopped`` (its status then says finished).
    """
    out = self.flwr("list", CONNECTION, "--format", "json")
    orphans = [int(r["run-id"]) for r in _json_of(out.stdout).get("runs", [])
               if not str(r["status"]).startswith(FINISHED)]
    stopped = []
    for run_id in orphans:
      out = self.flwr("stop", str(run_id), CONNECTION, check=False)
      if (out.returncode and "already finished" not in out.stdout + out.stderr
          and not self.status(run_id).startswith(FINISHED)):
        raise RuntimeError(f"flwr stop {run_id} failed ({out.returncode}):\n"
                           f"{out.stdout}\n{out.stderr}")
      if not out.returncode:
        stopped.append(run_id)
        self.log(f"federation: stopped run {run_id}: its ServerApp died with the previous "
                 "SuperLink")
    return stopped

  def register(self, name: str) -> certs.NodeKey:
    """Makes SuperNode ``name``'s key pair (once) and registers its public key under
    ``name`` with the SuperLink (a key registered before is left as it is)."""
    key = certs.NodeKey(self.path("keys", name), self.path("keys", name + ".pub"))
    if name in self.registered:
      return key
    if not os.path.exists(key.private_key):
      key = certs.make_node_key(self.path("keys"), name)
    out = self.flwr("supernode", "register", key.public_key, CONNECTION, "--name", name,
                    check=False)
    if out.returncode and "already in use" not in out.stdout + out.stderr:
      raise RuntimeError(f"registering {name} failed:\n{out.stdout}\n{out.stderr}")
    self.registered.add(name)
    return key

  def start_supernode(self, name: str, values: Mapping[str, object], *,
                      key: certs.NodeKey | None = None) -> subprocess.Popen:
    """Starts a SuperNode with node config ``values``, authenticating with ``key``
    (None: the key registered as ``name``, registered now if needed)."""
    args = [sys.executable, "-m", "fedjax_het.deploy.supernode", "--poll-interval",
            str(POLL_INTERVAL), "--fork-server", "--superlink", f"127.0.0.1:{self.port}",
            "--port", str(free_port()), "--node-config", node_config(values)]
    if self.insecure:
      args.append("--insecure")
    else:
      key = key or self.register(name)
      own = self.supernode_tls(name)  # its own, not the SuperLink's key
      args += ["--root-certificates", self.tls.ca_cert, "--auth-supernode-private-key",
               key.private_key, "--ssl-certfile", own.server_cert, "--ssl-keyfile",
               own.server_key, "--ssl-ca-certfile", own.ca_cert]
    return self._start(name, args)

  def supernode_tls(self, name: str) -> certs.TlsFiles:
    """SuperNode ``name``'s own certificate and key for its local Runtime API (made
    once, signed by this federation's CA)."""
    files = certs.TlsFiles(self.tls.ca_cert, self.path("tls", "nodes", f"{name}.crt"),
                           self.path("tls", "nodes", f"{name}.key"))
    if os.path.exists(files.server_cert) and os.path.exists(files.server_key):
      return files
    return certs.make_supernode_tls(self.tls, self.path("tls", "nodes"), name)

  def start_client(self, client_id: int, *, data_path: str = "", fault: str = ""
                   ) -> subprocess.Popen:
    """Client ``client_id``'s SuperNode (state under ``<workdir>/client<k>``; a relative
    ``data_path`` is taken from this process's working directory)."""
    data_path = os.path.abspath(data_path) if data_path else ""
    values = {"client-id": client_id, "workdir": self.path(f"client{client_id}")}
    values.update({k: v for k, v in (("data-path", data_path), ("fault", fault)) if v})
    return self.start_supernode(f"client-{client_id}", values)

  def start_clients(self, client_ids, *, data_path: str = "",
                    faults: Mapping[int, str] | None = None) -> None:
    """``start_client`` for each id; the keys are registered in parallel first."""
    if not self.insecure:
      with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(self.register, [f"client-{k}" for k in client_ids]))
    for k in client_ids:
      self.start_client(k, data_path=data_path, fault=(faults or {}).get(k, ""))

  def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
    """Sends ``sig`` to process ``name`` and everything it started; waits for it."""
    proc = self.procs[name]
    if proc.poll() is None:
      try:
        os.killpg(proc.pid, sig)
      except ProcessLookupError:
        pass
      proc.wait()

  def stop(self, grace: float = 10) -> None:
    """Stops every process: SIGTERM to the SuperNodes (and runs' log streams), then to
    the SuperLink, each waited for ``grace`` s before SIGKILL; then the flwr CLI's fork
    server."""
    nodes = [n for n in self.procs if n != "superlink"]
    for names in (nodes, [n for n in self.procs if n == "superlink"]):
      for name in names:
        if self.procs[name].poll() is None:
          try:
            os.killpg(self.procs[name].pid, signal.SIGTERM)
          except ProcessLookupError:
            pass
      deadline = time.monotonic() + grace
      for name in names:
        try:
          self.procs[name].wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
          self.kill(name)
    if self._cli_server is not None:
      proc, self._cli_server = self._cli_server[0], None
      proc.terminate()  # it removes its socket
      try:
        proc.wait(timeout=grace)
      except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()

  def __enter__(self) -> "Loopback":
    return self

  def __exit__(self, *exc) -> None:
    self.stop()

  # ---- runs
  def submit(self, run_config: Mapping[str, object]) -> int:
    """Submits the Flower App with ``run_config`` (``flwr run``); returns the run id."""
    import tomli_w  # pylint: disable=import-outside-toplevel  (a dependency of flwr)
    path = self.path(f"run_config_{time.time_ns()}.toml")
    with open(path, "wb") as f:
      tomli_w.dump(dict(run_config), f)
    out = self.flwr("run", APP_DIR, CONNECTION, "--run-config", path, "--format", "json")
    return int(_json_of(out.stdout)["run-id"])

  def failure(self, run_id: int) -> str | None:
    """The last exception line (``ValueError: ...``) of run ``run_id``'s log, if any."""
    path = self.path("logs", f"run-{run_id}.log")
    if not os.path.exists(path):
      return None
    with open(path, errors="replace") as f:
      found = [line.strip() for line in f
               if re.match(r"^[A-Za-z_.]*(Error|Exception): ", line.strip())]
    return found[-1] if found else None

  def status(self, run_id: int) -> str:
    """The run's status (``pending``, ``running``, ``finished:completed``, ...)."""
    out = self.flwr("list", CONNECTION, "--run-id", str(run_id), "--format", "json")
    return _json_of(out.stdout)["runs"][0]["status"]

  def wait(self, run_id: int, timeout: float, *, follow: str | None = None,
           poll: float = 0.5) -> str:
    """Waits until run ``run_id`` finishes (at most ``timeout`` s); returns its status.

    The run's log streams into ``logs/run-<id>.log`` (``flwr log --stream``, which ends
    with the run). ``follow``: a file (the server's ``server.log``) whose new lines are
    logged meanwhile.
    """
    stream = self._start(f"run-{run_id}", [self.bin("flwr"), "log", str(run_id),
                                           CONNECTION, "--stream"])
    deadline, seen = time.monotonic() + timeout, 0
    while True:
      ended = stream.poll() is not None
      if follow and os.path.exists(follow):
        with open(follow) as f:
          lines = f.read().splitlines()
        for line in lines[seen:]:
          self.log(line)
        seen = len(lines)
      if ended or time.monotonic() >= deadline:
        status = self.status(run_id)
        if status.startswith(FINISHED) or time.monotonic() >= deadline:
          self.kill(f"run-{run_id}")
          return status
        stream = self._start(f"run-{run_id}", [self.bin("flwr"), "log", str(run_id),
                                               CONNECTION, "--stream"])
      time.sleep(poll)
