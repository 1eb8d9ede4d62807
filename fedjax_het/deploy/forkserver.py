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
import stat
import struct
import subprocess
import sys
import threading
import time
import traceback
import warnings
from typing import Callable, Mapping, Sequence

from fedjax_het.deploy import private

# the launchers' environment names the socket they ask (a SuperNode's, or the loopback's)
ENV_VAR = "FEDJAX_HET_CLIENTAPP_SERVER"
# the server's line per child, and the launcher's line when it runs its program itself
FORKED = "fedjax_het.deploy.forkserver: forked"
REFUSED = "fedjax_het.deploy.forkserver: not forked, this process starts afresh"
# the server's line when a connection of another user is refused
REFUSED_PEER = "fedjax_het.deploy.forkserver: refused a connection of"
# the line of a server that listens (``wait_until_listening``)
SERVING = "fedjax_het.deploy.forkserver: ClientApps fork from"
DEFAULT_TARGET = "fedjax_het.deploy.supernode:load_flwr_clientapp"
# variables a request's environment may add or change: Flower's SuperNode and SuperExec
# set them for their own imports (flwr.supercore.task_process.connector.browser_use, which
# a ClientApp of this library does not import)
IGNORED = frozenset({"BROWSER_USE_SETUP_LOGGING"})
_MAX_REQUEST = 1 << 20  # bytes of a request (its environment and arguments)
# seconds the server waits for a connection's request (others are served meanwhile),
# and a launcher for the server's answer before it starts its program itself
REQUEST_TIMEOUT = 5.0
LAUNCH_TIMEOUT = 20.0
FOLDER_PREFIX = "fedjax_het_forkserver_"  # + uid_pid_random: ``private.private_dir``


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
          remove_directory: bool = False, request_timeout: float = REQUEST_TIMEOUT) -> None:
  """Imports ``preload``, listens on ``path`` and forks a child per request.

  Args:
    path: the Unix socket (``SOCK_SEQPACKET``) to create; removed at the end. It is
      bound under a temporary name beside it and renamed into place once it listens,
      so a launcher never finds a socket that refuses connections.
    target: ``'module:factory'``: ``factory()`` returns the function each child runs
      (default Flower's ``flwr_clientapp``), resolved before the first request.
    preload: modules imported before the first request (the ClientApp's own).
    parent_pid: the server's parent: the server ends once it has ended (default: none
      watched).
    poll: seconds between checks of the parent and of the children that ended.
    remove_directory: also remove ``path``'s directory at the end (``start`` made it).
    request_timeout: seconds a connection may take to send its request; an idle one
      is closed then, and never delays the others (every connection waits in one
      ``select``).

  Only connections from this process's own user are served (``SO_PEERCRED``); a
  request is refused when the code the server imported changed on disk since
  (``code_changed``). Ends (removing the socket) when the parent has ended, or at
  SIGTERM (as a SuperNode's process group gets from ``fedjax_het.deploy.loopback``).
  """
  environ = dict(os.environ)  # what the preloaded modules saw
  run = _resolve(target)
  for name in preload:
    importlib.import_module(name)
  code = code_fingerprint(list(sys.modules), [target.partition(":")[0], *preload])
  added = {k: v for k, v in os.environ.items() if environ.get(k) != v}
  listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  temporary = f"{path}.{os.getpid()}.binding"
  for stale in (path, temporary):
    if os.path.lexists(stale):
      os.unlink(stale)
  listener.bind(temporary)
  listener.listen(64)
  os.rename(temporary, path)
  children: dict[int, socket.socket] = {}
  waiting: dict[socket.socket, float] = {}  # connections -> deadline of their request
  signal.signal(signal.SIGTERM, _end)
  try:
    while parent_pid is None or os.getppid() == parent_pid:  # (an ended parent's orphans
      # are adopted at once, where its pid may live on as an unreaped zombie)
      ready = select.select([listener, *waiting], [], [], poll)[0]
      for conn in ready:
        if conn is listener:
          _accept(listener, waiting, request_timeout)
          continue
        del waiting[conn]
        _handle(conn, listener, children, environ, added, run, code,
                [*waiting, *children.values()])
      now = time.monotonic()
      for conn in [c for c, deadline in waiting.items() if deadline < now]:
        del waiting[conn]
        _refuse(conn, [], f"no request within {request_timeout:g}s")
      _reap(children)
  finally:
    listener.close()
    for conn in [*children.values(), *waiting]:
      conn.close()
    if os.path.exists(path):
      os.unlink(path)
    if remove_directory:
      shutil.rmtree(os.path.dirname(path), ignore_errors=True)


def peer_uid(conn: socket.socket) -> int:
  """The user id of the process at the other end of a Unix socket (``SO_PEERCRED``)."""
  creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
  return struct.unpack("3i", creds)[1]


def _accept(listener, waiting, request_timeout) -> None:
  """Accepts a connection: from this user, it waits for its request; else refused."""
  try:
    conn, _ = listener.accept()
  except OSError:
    return
  uid = peer_uid(conn)
  if uid != os.getuid():
    print(f"{REFUSED_PEER} uid {uid}", file=sys.stderr, flush=True)
    _refuse(conn, [], f"uid {uid} is not this server's user")
    return
  waiting[conn] = time.monotonic() + request_timeout


def code_fingerprint(modules, roots: Sequence[str]) -> dict[str, tuple[int, int]]:
  """{file: (mtime_ns, size)} of the imported ``modules`` under the top-level packages
  of ``roots`` (what a changed app would change)."""
  tops = {r.split(".")[0] for r in roots if r}
  out = {}
  for name in modules:
    module = sys.modules.get(name)
    path = getattr(module, "__file__", None)
    if name.split(".")[0] in tops and path:
      try:
        st = os.stat(path)
      except OSError:
        continue
      out[path] = (st.st_mtime_ns, st.st_size)
  return out


def code_changed(fingerprint: Mapping[str, tuple[int, int]]) -> list[str]:
  """Files of ``code_fingerprint`` changed (or gone) since."""
  out = []
  for path, seen in fingerprint.items():
    try:
      st = os.stat(path)
    except OSError:
      out.append(path)
      continue
    if (st.st_mtime_ns, st.st_size) != tuple(seen):
      out.append(path)
  return sorted(out)


def _end(sig, frame):
  del sig, frame
  raise SystemExit(0)


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


def _handle(conn, listener, children, environ, added, run, code, others) -> None:
  """One request (ready to read): refused (unreadable, its environment differs, or the
  imported code changed), or forked."""
  fds = []
  try:
    conn.settimeout(REQUEST_TIMEOUT)
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
  changed = code_changed(code)
  if changed:
    _refuse(conn, fds, f"the app's code changed since this server imported it "
            f"({', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''}); restart "
            "the SuperNode to fork the new code")
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
    _child(run, request, fds, added, [listener, conn, *children.values(), *others])
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
    random.seed()  # a child's random state is its own, as a new process's
    if "numpy" in sys.modules:
      sys.modules["numpy"].random.seed()
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


def why_not_ours(path: str) -> str | None:
  """Why the socket at ``path`` is not one this user's fork server made (``lstat``:
  its folder private to this user, the socket this user's); None when it is."""
  why = private.why_insecure(os.path.dirname(os.path.abspath(path)))
  if why:
    return f"its folder: {why}"
  try:
    st = os.lstat(path)
  except OSError as err:
    return str(err)
  if not stat.S_ISSOCK(st.st_mode) or st.st_uid != os.getuid():
    return f"not a socket of uid {os.getuid()}"
  return None


def launch(path: str | None = None, argv: Sequence[str] | None = None,
           environ: Mapping[str, str] | None = None, *,
           timeout: float = LAUNCH_TIMEOUT) -> int | None:
  """Asks the server at ``path`` (default ``$FEDJAX_HET_CLIENTAPP_SERVER``) to run
  ``argv`` (default ``sys.argv``) as a forked child, with this process's working
  directory, ``environ`` (default ``os.environ``) and standard streams.

  Nothing is sent to a socket that is not this user's fork server's (``why_not_ours``;
  ``SO_PEERCRED`` of the server), and every wait for its first answer is bounded by
  ``timeout`` s.

  Returns:
    the child's exit code once it ended (negative: the signal that ended it); None
    where no server answers in time or it refused (the reason then on standard error):
    the caller runs the ClientApp itself.
  """
  path = path or os.environ.get(ENV_VAR)
  if not path:
    return None
  request = {"argv": list(sys.argv if argv is None else argv), "cwd": os.getcwd(),
             "env": dict(os.environ if environ is None else environ)}

  def refused(why: str) -> None:
    print(f"{REFUSED}: {why}", file=sys.stderr, flush=True)

  why = why_not_ours(path)
  if why:
    refused(f"no fork server at {path} ({why})")
    return None
  conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  conn.settimeout(timeout)
  try:
    conn.connect(path)
    if peer_uid(conn) != os.getuid():
      raise OSError(f"its server runs as uid {peer_uid(conn)}")
    socket.send_fds(conn, [json.dumps(request).encode()], [0, 1, 2])
    reply = json.loads(conn.recv(_MAX_REQUEST) or b"{}")
  except (OSError, ValueError) as err:  # socket.timeout is an OSError
    conn.close()
    refused(f"no fork server at {path} ({err or type(err).__name__})")
    return None
  if "pid" not in reply:
    conn.close()
    refused(reply.get("refused", "the server ended"))
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
    conn.settimeout(1.0)
    while True:  # the child runs as long as its ClientApp: no bound, but a check a second
      try:
        reply = json.loads(conn.recv(_MAX_REQUEST) or b"{}")
        break
      except socket.timeout:
        if not private.alive(pid):  # ended without its server telling: give it a last second
          try:
            reply = json.loads(conn.recv(_MAX_REQUEST) or b"{}")
          except (OSError, ValueError):
            reply = {}
          break
      except (OSError, ValueError):
        reply = {}
        break
    if "exit" in reply:
      return reply["exit"]
    while private.alive(pid):  # the server ended first: wait for the child itself
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
  wait for it (``wait_until_listening``). Its socket is in a private folder of its own
  (``private.private_dir``: mode 0700, an unguessable name, in ``$XDG_RUNTIME_DIR`` when
  it is private, else the temporary directory), removed when it ends; the folders of
  servers whose starter is gone (SIGKILLed, as fault drills kill a SuperNode's process
  group) are removed here first. ``stderr``: where its lines go (default this
  process's standard error).

  Returns:
    (the server's process, its socket's path).
  """
  environ = os.environ if environ is None else environ
  private.remove_stale(FOLDER_PREFIX)  # of servers whose SuperNode was SIGKILLed
  directory = private.private_dir(FOLDER_PREFIX)
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
