"""ClientApps (and flwr commands) forked from a process that imported them already.

Flower's SuperExec starts a new ``flwr-clientapp`` process for every message a
SuperNode pulls. Most of such a process's CPU goes to imports: Flower's ClientApp
module, then JAX, Flax, Optax, Orbax and the library for ``fedjax_het.deploy.flower``
(1.75 of 2.8 CPU s per ClientApp on one 2-core machine). ``serve`` imports them once
and waits on a Unix socket; for each request it forks a child that runs the ClientApp
(Flower's ``flwr_clientapp``) with the requester's arguments, working directory,
environment and standard streams (passed as file descriptors). ``launch`` is the
requester, what the ``flwr-clientapp`` launcher of ``fedjax_het.deploy.supernode`` runs
first: it stays until its ClientApp ends, passes SIGTERM and SIGINT on to it and exits
with its exit code.

A request is refused, and the launcher then runs the ClientApp itself as before, when
its environment is not the one the server started with (modules imported in the server
may have read it; ``IGNORED`` names the variables Flower's own processes set): the
launcher writes why on its standard error. No JAX backend is initialized in the
server, so every child starts its own, as a new process does.

``fedjax_het.deploy.loopback`` runs its ``flwr`` commands the same way, from a server of
Flower's command line (``launch_or_run`` is both launchers' program).

Usage (``fedjax_het.deploy.supernode`` starts one per SuperNode with ``start``)::

  python -m fedjax_het.deploy.forkserver --socket /tmp/x/socket \
      --preload fedjax_het.deploy.flower --parent-pid 1234

Imports only the standard library (and, in the server, what it preloads).
"""
from __future__ import annotations

import argparse
import atexit
import importlib
import json
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from typing import Callable, Mapping, Sequence

# the launchers' environment names the socket they ask (a SuperNode's, or the loopback's)
ENV_VAR = "FEDJAX_HET_CLIENTAPP_SERVER"
# the server's line per child, and the launcher's line when it runs its program itself
FORKED = "fedjax_het.deploy.forkserver: forked"
REFUSED = "fedjax_het.deploy.forkserver: not forked, this process starts afresh"
# the line of a server that listens (``wait_until_listening``)
SERVING = "fedjax_het.deploy.forkserver: ClientApps fork from"
DEFAULT_TARGET = "fedjax_het.deploy.supernode:load_flwr_clientapp"
# variables a request's environment may add or change: Flower's SuperNode and SuperExec
# set them for their own imports (flwr.supercore.task_process.connector.browser_use, which
# a ClientApp of this library does not import)
IGNORED = frozenset({"BROWSER_USE_SETUP_LOGGING"})
_MAX_REQUEST = 1 << 20  # bytes of a request (its environment and arguments)


def _resolve(target: str) -> Callable[[], None]:
  """``'module:factory'`` -> ``factory()``, the function a child runs."""
  module, _, name = target.partition(":")
  return getattr(importlib.import_module(module), name)()


def _send(conn: socket.socket, **message) -> None:
  try:
    conn.send(json.dumps(message).encode())
  except OSError:
    pass  # the launcher has gone; its ClientApp runs on


def serve(path: str, *, target: str = DEFAULT_TARGET, preload: Sequence[str] = (),
          parent_pid: int | None = None, poll: float = 0.2,
          remove_directory: bool = False) -> None:
  """Imports ``preload``, listens on ``path`` and forks a child per request.

  Args:
    path: the Unix socket (``SOCK_SEQPACKET``) to create; removed at the end.
    target: ``'module:factory'``: ``factory()`` returns the function each child runs
      (default Flower's ``flwr_clientapp``), resolved before the first request.
    preload: modules imported before the first request (the ClientApp's own).
    parent_pid: the server's parent: the server ends once it has ended (default: none
      watched).
    poll: seconds between checks of the parent and of the children that ended.
    remove_directory: also remove ``path``'s directory at the end (``start`` made it).

  Ends (removing the socket) when the parent has ended, or at SIGTERM (as a SuperNode's
  process group gets from ``fedjax_het.deploy.loopback``).
  """
  environ = dict(os.environ)  # what the preloaded modules saw
  run = _resolve(target)
  for name in preload:
    importlib.import_module(name)
  added = {k: v for k, v in os.environ.items() if environ.get(k) != v}
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  if os.path.exists(path):
    os.unlink(path)
  listener.bind(path)
  listener.listen(64)
  children: dict[int, socket.socket] = {}
  signal.signal(signal.SIGTERM, _end)
  try:
    while parent_pid is None or os.getppid() == parent_pid:  # (an ended parent's orphans
      # are adopted at once, where its pid may live on as an unreaped zombie)
      if select.select([listener], [], [], poll)[0]:
        conn, _ = listener.accept()
        _handle(conn, listener, children, environ, added, run)
      _reap(children)
  finally:
    listener.close()
    for conn in children.values():
      conn.close()
    if os.path.exists(path):
      os.unlink(path)
    if remove_directory:
      shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def _end(sig, frame):
  del sig, frame
  raise SystemExit(0)


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def _reap(children: dict[int, socket.socket]) -> None:
  """Sends each ended child's exit code to its launcher."""
  while children:
    try:
      pid, status = os.waitpid(-1, os.WNOHANG)
    except ChildProcessError:
      return
    if not pid:
      return
    conn = children.pop(pid, None)
    if conn is not None:
      _send(conn, exit=os.waitstatus_to_exitcode(status))
      conn.close()


def _handle(conn, listener, children, environ, added, run) -> None:
  """One request: refused (unreadable, or its environment differs), or forked."""
  fds = []
  try:
    data, fds, _, _ = socket.recv_fds(conn, _MAX_REQUEST, 3)
    request = json.loads(data)
    request = {"argv": list(request["argv"]), "cwd": str(request["cwd"]),
               "env": dict(request["env"])}
  except (OSError, ValueError, KeyError, TypeError) as err:
    _refuse(conn, fds, f"unreadable request ({err!r})")
    return
  differ = sorted(k for k in set(environ) | set(request["env"])
                  if environ.get(k) != request["env"].get(k) and k not in IGNORED)
  if differ or len(fds) != 3:
    _refuse(conn, fds, f"its environment differs from the server's in {', '.join(differ)}"
            if differ else "it passed no standard streams")
    return
  sys.stdout.flush()
  sys.stderr.flush()
  with warnings.catch_warnings():
    # Python >= 3.12 warns when a process with threads forks: the server's one other
    # thread is OpenBLAS's pool (numpy's import starts it; its fork handlers make a
    # child safe), and no JAX backend has started here
    warnings.filterwarnings("ignore", r"This process .* is multi-threaded",
                            DeprecationWarning)
    pid = os.fork()
  if pid == 0:
    _child(run, request, fds, added, [listener, conn, *children.values()])
  for fd in fds:
    os.close(fd)
  children[pid] = conn
  print(f"{FORKED} {pid} (cwd {request['cwd']})", file=sys.stderr, flush=True)
  _send(conn, pid=pid)


def _refuse(conn, fds, reason: str) -> None:
  """Closes a refused request's descriptors and connection, telling it ``reason``."""
  for fd in fds:
    os.close(fd)
  _send(conn, refused=reason)
  conn.close()


def _child(run, request, fds, added, sockets) -> None:
  """The forked ClientApp: the launcher's streams, directory, environment and
  arguments, then ``run()``; ends the process with its exit code (never returns)."""
  code = 1
  try:
    for s in sockets:
      s.close()
    for target, fd in zip((0, 1, 2), fds):
      if fd != target:  # (a server started without a stream of its own got its number)
        os.dup2(fd, target)
        os.close(fd)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as in a new process
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for k, v in added.items():  # what the preloaded modules set, as in a process of its own
      os.environ.setdefault(k, v)
    sys.argv[:] = request["argv"]
    random.seed()
    try:
      run()
      code = 0
    except SystemExit as e:
      code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
      if not isinstance(e.code, (int, type(None))):
        print(e.code, file=sys.stderr)
    except BaseException:  # pylint: disable=broad-exception-caught
      traceback.print_exc()
    # a process's own end: its threads joined, its exit handlers run
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
      shutdown()
    atexit._run_exitfuncs()  # pylint: disable=protected-access
  finally:
    for stream in (sys.stdout, sys.stderr):
      try:
        stream.flush()
      except Exception:  # pylint: disable=broad-exception-caught
        pass
    os._exit(code)  # pylint: disable=protected-access


def launch(path: str | None = None, argv: Sequence[str] | None = None,
           environ: Mapping[str, str] | None = None) -> int | None:
  """Asks the server at ``path`` (default ``$FEDJAX_HET_CLIENTAPP_SERVER``) to run
  ``argv`` (default ``sys.argv``) as a forked child, with this process's working
  directory, ``environ`` (default ``os.environ``) and standard streams.

  Returns:
    the child's exit code once it ended (negative: the signal that ended it); None
    where no server answers or it refused (the reason then on standard error): the
    caller runs the ClientApp itself.
  """
  path = path or os.environ.get(ENV_VAR)
  if not path:
    return None
  request = {"argv": list(sys.argv if argv is None else argv), "cwd": os.getcwd(),
             "env": dict(os.environ if environ is None else environ)}
  conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  try:
    conn.connect(path)
    socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
    reply = json.loads(conn.recv(_MAX_REQUEST) or b"{}")
  except (OSError, ValueError) as err:
    conn.close()
    print(f"{REFUSED}: no fork server at {path} ({err})", file=sys.stderr, flush=True)
    return None
  if "pid" not in reply:
    conn.close()
    print(f"{REFUSED}: {reply.get('refused', 'the server ended')}", file=sys.stderr,
          flush=True)
    return None
  pid = reply["pid"]

  def forward(sig, frame):
    del frame
    try:
      os.kill(pid, sig)
    except ProcessLookupError:
      pass
  previous = {sig: signal.signal(sig, forward) for sig in (signal.SIGTERM, signal.SIGINT)}
  try:
    try:
      reply = json.loads(conn.recv(_MAX_REQUEST) or b"{}")
    except (OSError, ValueError):
      reply = {}
    if "exit" in reply:
      return reply["exit"]
    while _alive(pid):  # the server ended first: wait for the child itself
      time.sleep(0.2)
    return 1
  finally:
    conn.close()
    for sig, handler in previous.items():
      signal.signal(sig, handler)


def launch_or_run(target: str) -> None:
  """A launcher's whole program: ``launch()``, else ``target``'s function
  (``'module:factory'``, as ``serve`` takes it) run in this process; exits with the
  ClientApp's (or command's) exit code."""
  code = launch()
  if code is None:
    _resolve(target)()
    return
  sys.exit(code if code >= 0 else 128 - code)


def start(preload: Sequence[str] = (), *, target: str = DEFAULT_TARGET,
          environ: dict | None = None, stderr=None) -> tuple[subprocess.Popen, str]:
  """Starts a server for this process's ClientApps (it ends with this process).

  Sets ``environ[ENV_VAR]`` (default ``os.environ``, which the SuperExec inherits) to
  its socket before starting it, so that the server's environment is theirs. Does not
  wait for it (``wait_until_listening``). Its socket is in a folder of its own under
  ``<temporary directory>/fedjax_het_forkservers_<uid>``, removed when it ends (not when
  it is SIGKILLed, as fault drills kill a SuperNode's process group). ``stderr``: where
  its lines go (default this process's standard error).

  Returns:
    (the server's process, its socket's path).
  """
  environ = os.environ if environ is None else environ
  parent = os.path.join(tempfile.gettempdir(), f"fedjax_het_forkservers_{os.getuid()}")
  os.makedirs(parent, mode=0o700, exist_ok=True)
  directory = tempfile.mkdtemp(dir=parent)
  path = os.path.join(directory, "socket")
  environ[ENV_VAR] = path
  proc = subprocess.Popen(
      [sys.executable, "-m", "fedjax_het.deploy.forkserver", "--socket", path,
       "--target", target, "--parent-pid", str(os.getpid()), "--remove-directory",
       *[f"--preload={m}" for m in preload]], env=environ, stderr=stderr)
  return proc, path


def wait_until_listening(proc: subprocess.Popen, path: str, *, environ: dict | None = None,
                         timeout: float = 60) -> str:
  """Waits (at most ``timeout`` s) until ``start``'s server listens; returns the line
  saying which server ClientApps fork from, or why none (``ENV_VAR`` is then removed
  from ``environ``, default ``os.environ``, so every ClientApp starts afresh)."""
  environ = os.environ if environ is None else environ
  deadline = time.monotonic() + timeout
  while not os.path.exists(path):
    if proc.poll() is not None or time.monotonic() > deadline:
      if proc.poll() is None:
        proc.kill()
      environ.pop(ENV_VAR, None)
      return (f"{REFUSED} (its fork server did not start, exit code {proc.poll()}): "
              "every launcher runs its program itself")
    time.sleep(0.05)
  return f"{SERVING} {path} (pid {proc.pid})"


def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--socket", required=True, help="the Unix socket to listen on")
  parser.add_argument("--target", default=DEFAULT_TARGET,
                      help="'module:factory': factory() is the function each child runs "
                      "(default: Flower's flwr_clientapp)")
  parser.add_argument("--preload", action="append", default=[],
                      help="a module to import before the first request (repeatable)")
  parser.add_argument("--parent-pid", type=int, default=None,
                      help="end once this parent process has ended")
  parser.add_argument("--remove-directory", action="store_true",
                      help="remove the socket's folder at the end")
  args = parser.parse_args(argv)
  serve(args.socket, target=args.target, preload=args.preload, parent_pid=args.parent_pid,
        remove_directory=args.remove_directory)


if __name__ == "__main__":
  main()
