"""fedjax_het.deploy.forkserver: children forked with a launcher's arguments, directory,
environment and streams; refusals; signals; the server's end with its parent.

The server runs ``forkserver_target`` (this directory) instead of Flower's ClientApp;
tests/test_deploy_flower.py checks that every ClientApp of a federation is forked.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from fedjax_het.deploy import forkserver

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = "forkserver_target:make"


def start_server(tmp_path, directory, *, target_dir=HERE, timeout=None):
  """(socket path, environment, process) of a server listening in ``directory``; its
  standard error goes to ``tmp_path/server.log``. The socket is usable the moment it
  appears (bound under a temporary name, renamed after ``listen``)."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(target_dir),
                                                     os.environ.get("PYTHONPATH", "")]))
  path = os.path.join(str(directory), "socket")
  log = open(tmp_path / "server.log", "a")
  code = ("import sys; from fedjax_het.deploy import forkserver as f; "
          f"f.serve({path!r}, target={TARGET!r}, preload=['forkserver_target']"
          + (f", request_timeout={timeout}" if timeout else "") + ")")
  proc = subprocess.Popen([sys.executable, "-c", code], env=env, stderr=log)
  log.close()
  assert forkserver.wait_until_listening(proc, path, environ={}) == (
      f"{forkserver.SERVING} {path} (pid {proc.pid})")
  probe = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  probe.connect(path)  # at once: no ECONNREFUSED window between bind and listen
  probe.close()
  assert not [n for n in os.listdir(directory) if n.endswith(".binding")]
  return path, env, proc


@pytest.fixture
def server(tmp_path):
  """(socket path, environment of the server and its launchers, the server process)."""
  path, env, proc = start_server(tmp_path, tmp_path)
  yield path, env, proc
  proc.kill()
  proc.wait()


def launch(path, env, *args, cwd=None, **kwargs):
  """A launcher process: ``forkserver.launch(path, ['prog', *args])``, exit code as its own."""
  code = ("import sys; from fedjax_het.deploy import forkserver as f; "
          f"c = f.launch({path!r}, ['prog', *sys.argv[1:]]); "
          "print('launcher: none' if c is None else f'launcher: {c}', flush=True); "
          "sys.exit(0 if c is None else c)")
  return subprocess.Popen([sys.executable, "-c", code, *args], env=env, cwd=cwd,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def test_a_child_runs_with_the_launchers_arguments_directory_environment_and_streams(
    server, tmp_path):
  path, env, proc = server
  out, err = launch(path, dict(env, FOO_IGNORED_BY_NOBODY="x"), "3", cwd=tmp_path
                    ).communicate(timeout=60)
  assert "differs from the server's in FOO_IGNORED_BY_NOBODY" in err  # a new variable
  assert "launcher: none" in out
  child = launch(path, env, "3", "hello", cwd=tmp_path)
  out, err = child.communicate(timeout=60)
  seen = json.loads(out.splitlines()[0])
  assert child.returncode == 3 and out.splitlines()[-1] == "launcher: 3"
  assert seen["argv"] == ["prog", "3", "hello"] and seen["cwd"] == str(tmp_path)
  assert seen["pid"] != child.pid and seen["ppid"] == proc.pid  # forked by the server
  assert seen["preloaded_in"] == proc.pid  # its module imported once, by the server
  assert seen["env"] == env["PYTHONPATH"]
  assert err == "child stderr\n"
  forked = (tmp_path / "server.log").read_text().splitlines()
  assert forked == [f"{forkserver.FORKED} {seen['pid']} (cwd {tmp_path})"]
  again = json.loads(launch(path, env, "0").communicate(timeout=60)[0].splitlines()[0])
  assert again["numpy_random"] != seen["numpy_random"]  # numpy reseeded in each child


def test_a_refused_or_unanswered_request_leaves_the_clientapp_to_the_launcher(server,
                                                                              tmp_path):
  path, env, _ = server
  for variable, value in (("JAX_PLATFORMS", "tpu"), ("BROWSER_USE_SETUP_LOGGING", "false")):
    out, err = launch(path, dict(env, **{variable: value}), "0").communicate(timeout=60)
    if variable in forkserver.IGNORED:  # Flower's own processes set it
      assert out.splitlines()[-1] == "launcher: 0" and err == "child stderr\n"  # forked
    else:
      assert err.startswith(f"{forkserver.REFUSED}: its environment differs from the "
                            f"server's in {variable}")
      assert out.splitlines() == ["launcher: none"]
  for garbage in (b"not json", b'{"argv": []}'):  # refused; the server serves on
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(path)
    conn.send(garbage)
    assert json.loads(conn.recv(1 << 16))["refused"].startswith("unreadable request")
    conn.close()
  assert launch(path, env, "0").communicate(timeout=60)[0].splitlines()[-1] == "launcher: 0"
  out, err = launch(str(tmp_path / "none"), env, "0").communicate(timeout=60)
  assert err.startswith(f"{forkserver.REFUSED}: no fork server at {tmp_path / 'none'}")
  assert forkserver.launch(None, environ={}) is None  # no $FEDJAX_HET_CLIENTAPP_SERVER


def test_sigterm_to_the_launcher_ends_its_child(server):
  path, env, _ = server
  child = launch(path, env, "sleep")
  line = child.stdout.readline()
  assert json.loads(line)["argv"] == ["prog", "sleep"]
  child.send_signal(signal.SIGTERM)
  out, _ = child.communicate(timeout=60)
  assert out.splitlines()[-1] == f"launcher: {-signal.SIGTERM}"  # passed on, it ended so


def _running(pid) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has ended
  except FileNotFoundError:
    return False


def test_the_server_ends_with_its_parent():
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
  # a parent that starts the server (as a SuperNode does) and ends at once
  parent = subprocess.run(
      [sys.executable, "-c", "import sys; from fedjax_het.deploy import forkserver as f; "
       f"p, path = f.start(target={TARGET!r}); print(p.pid, path, flush=True); "
       "print(f.wait_until_listening(p, path), flush=True)"],
      env=env, capture_output=True, text=True, timeout=60)
  pid, path = parent.stdout.split()[:2]
  assert parent.stdout.splitlines()[1].startswith(forkserver.SERVING)
  deadline = time.monotonic() + 30
  while _running(pid) and time.monotonic() < deadline:
    time.sleep(0.1)
  assert not _running(pid) and not os.path.exists(os.path.dirname(path))  # start's folder


def test_sigterm_ends_the_server_and_removes_its_socket(server):
  path, _, proc = server
  proc.send_signal(signal.SIGTERM)
  assert proc.wait(timeout=30) == 0 and not os.path.exists(path)


def in_another_users_process(fn, uid=65534):
  """Runs ``fn()`` in a forked child that first becomes user ``uid`` (needs root);
  returns what it returned (a string), or the repr of what it raised."""
  read, write = os.pipe()
  pid = os.fork()
  if pid == 0:  # the child: never returns
    os.close(read)
    try:
      os.setgid(uid)
      os.setuid(uid)
      out = str(fn())
    except BaseException as err:  # noqa: BLE001 - reported to the parent
      out = repr(err)
    os.write(write, out.encode())
    os._exit(0)
  os.close(write)
  with os.fdopen(read) as f:
    out = f.read()
  os.waitpid(pid, 0)
  return out


@pytest.mark.skipif(os.geteuid() != 0, reason="another user id needs root (setuid)")
def test_another_user_cannot_reach_or_use_the_fork_server(tmp_path):
  """Two layers: ``start``'s folder is 0700, so another user cannot even connect; and
  were the socket exposed (here: its folder and socket opened to everyone on purpose),
  the server refuses any connection of another uid (``SO_PEERCRED``) before reading it.
  Not simulated: another user on another machine (a Unix socket is local only), and a
  process of the same uid (the same user can ptrace the server anyway)."""
  proc, path = forkserver.start(target=TARGET, environ=dict(
      os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")])),
      stderr=subprocess.DEVNULL)
  try:
    assert forkserver.wait_until_listening(proc, path, environ={}).startswith(
        forkserver.SERVING)
    assert os.stat(os.path.dirname(path)).st_mode & 0o777 == 0o700

    def connect():
      conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
      conn.settimeout(10)
      conn.connect(path)
      return conn.recv(1 << 16).decode()
    assert "PermissionError" in in_another_users_process(connect)
  finally:
    proc.terminate()
    proc.wait(timeout=30)
  exposed = tempfile.mkdtemp()  # a folder another user may enter
  try:
    os.chmod(exposed, 0o711)
    path, env, proc = start_server(tmp_path, exposed)
    os.chmod(path, 0o777)
    try:
      answer = in_another_users_process(connect)
      assert json.loads(answer)["refused"] == "uid 65534 is not this server's user"
      assert f"{forkserver.REFUSED_PEER} uid 65534" in (tmp_path / "server.log").read_text()
      assert launch(path, env, "0").communicate(timeout=60)[0].splitlines()[-1] == (
          "launcher: 0")  # its own user is served on
    finally:
      proc.kill()
      proc.wait()
  finally:
    shutil.rmtree(exposed, ignore_errors=True)


def test_a_launcher_sends_nothing_to_a_socket_another_user_could_have_planted(server,
                                                                            tmp_path):
  path, env, _ = server
  os.chmod(tmp_path, 0o777)  # the socket's folder: world-writable
  try:
    out, err = launch(path, env, "0").communicate(timeout=60)
    assert out.splitlines() == ["launcher: none"]
    assert "its folder: it is group- or world-writable (mode 0777)" in err
  finally:
    os.chmod(tmp_path, 0o700)
  if os.geteuid() == 0:
    os.chown(path, 65534, 65534)  # a socket of another user in our folder
    out, err = launch(path, env, "0").communicate(timeout=60)
    assert out.splitlines() == ["launcher: none"] and "not a socket of uid" in err


def test_an_idle_connection_does_not_stall_a_launch(tmp_path, capsys):
  path, env, proc = start_server(tmp_path, tmp_path, timeout=3.0)
  try:
    idle = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    idle.connect(path)  # connects, never sends its request
    out, _ = launch(path, env, "0").communicate(timeout=60)
    assert out.splitlines()[-1] == "launcher: 0"  # forked meanwhile ...
    idle.setblocking(False)
    with pytest.raises(BlockingIOError):  # ... before the idle one was even given up
      idle.recv(1 << 16)
    idle.settimeout(60)  # (only so that a server that never answers fails the test)
    assert json.loads(idle.recv(1 << 16)) == {"refused": "no request within 3s"}
    assert idle.recv(1 << 16) == b""  # then the server closed it: it holds nothing of it
    assert launch(path, env, "0").communicate(timeout=60)[0].splitlines()[-1] == (
        "launcher: 0")  # and serves on
  finally:
    proc.kill()
    proc.wait()
  # ... and a server that never answers holds a launcher only its timeout
  mute = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
  mute_path = str(tmp_path / "mute")
  mute.bind(mute_path)
  mute.listen(1)  # never accepts: the launcher's connect succeeds, its answer never comes
  capsys.readouterr()
  assert forkserver.launch(mute_path, ["prog", "0"], environ={}, timeout=0.5) is None
  assert capsys.readouterr().err == (  # given up by its own timeout, no other failure
      f"{forkserver.REFUSED}: no fork server at {mute_path} (timed out)\n")
  mute.close()


def test_a_request_is_refused_once_the_imported_code_changed(tmp_path):
  target_dir = tmp_path / "code"
  target_dir.mkdir()
  shutil.copy(os.path.join(HERE, "forkserver_target.py"), target_dir)
  path, env, proc = start_server(tmp_path, tmp_path, target_dir=target_dir)
  try:
    assert launch(path, env, "0").communicate(timeout=60)[0].splitlines()[-1] == (
        "launcher: 0")
    with open(target_dir / "forkserver_target.py", "a") as f:
      f.write("\n# changed after the server imported it\n")
    out, err = launch(path, env, "0").communicate(timeout=60)
    assert out.splitlines() == ["launcher: none"]  # the launcher runs the new code itself
    assert "the app's code changed since this server imported it" in err
    assert str(target_dir / "forkserver_target.py") in err
  finally:
    proc.kill()
    proc.wait()
