"""fedjax_het.deploy.forkserver: children forked with a launcher's arguments, directory,
environment and streams; refusals; signals; the server's end with its parent.

The server runs ``forkserver_target`` (this directory) instead of Flower's ClientApp;
tests/test_deploy_flower.py checks that every ClientApp of a federation is forked.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

from fedjax_het.deploy import forkserver

HERE = os.path.dirname(os.path.abspath(__file__))
TARGET = "forkserver_target:make"


@pytest.fixture
def server(tmp_path):
  """(socket path, environment of the server and its launchers, the server process)."""
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([HERE, os.environ.get("PYTHONPATH", "")]))
  path = str(tmp_path / "socket")
  log = open(tmp_path / "server.log", "w")
  proc = subprocess.Popen([sys.executable, "-m", "fedjax_het.deploy.forkserver", "--socket",
                           path, "--target", TARGET, "--preload", "forkserver_target"],
                          env=env, stderr=log)
  assert forkserver.wait_until_listening(proc, path, environ={}) == (
      f"{forkserver.SERVING} {path} (pid {proc.pid})")
  yield path, env, proc
  proc.kill()
  proc.wait()
  log.close()


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
