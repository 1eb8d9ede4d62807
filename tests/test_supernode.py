"""fedjax_het.deploy.supernode: Flower 1.42's SuperNode pull, as Flower runs it, with a
stored message whose run stops before it is confirmed."""
import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("flwr")
from flwr.app import Message  # noqa: E402
from flwr.app import RecordDict  # noqa: E402
from flwr.app.metadata import Metadata  # noqa: E402
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects  # noqa: E402
from flwr.supercore.inflatable.inflatable_object import get_object_tree  # noqa: E402
from flwr.supercore.object_store import ObjectStoreFactory  # noqa: E402
from flwr.supercore.run import Run  # noqa: E402
from flwr.supercore.run import RunNotRunningException  # noqa: E402
from flwr.supernode import start_client_internal  # noqa: E402
from flwr.supernode.nodestate import NodeStateFactory  # noqa: E402

from fedjax_het.deploy import private  # noqa: E402
from fedjax_het.deploy import supernode  # noqa: E402

NODE, RUN = 7, 5
ORIGINAL = start_client_internal._pull_and_store_message  # pylint: disable=protected-access


def pull_once(pull, *, confirm_raises=False, receive_raises=False, deletes=False):
  """One turn of the SuperNode loop's pull on a node that knows run ``RUN``; returns
  what ``pull`` returns and whether the confirmation was asked for. ``deletes``: the
  stored message is gone from the node's state when the confirmation fails (as where
  Flower deletes it: a later Flower, or its expiry)."""
  objects = ObjectStoreFactory()
  state, store = NodeStateFactory(objects).state(), objects.store()
  state.set_node_id(NODE)
  state.store_run(Run.create_empty(RUN))  # known: no run or FAB to fetch
  message = Message(RecordDict(), metadata=Metadata(RUN, "", 1, NODE, "", "2", time.time(),
                                                    600.0, "train"))
  message.metadata.__dict__["_message_id"] = message.object_id  # as the SuperLink sets it
  contents = get_all_nested_objects(message)
  asked = []

  def receive():
    if receive_raises:
      raise RunNotRunningException
    return message, get_object_tree(message)

  def confirm(run_id, message_id):
    asked.append((run_id, message_id))
    assert supernode.still_stored(state, message_id)  # stored before its confirmation
    if deletes:
      state.delete_messages(message_ids=[message_id])
    if confirm_raises:
      raise RunNotRunningException

  out = pull(state=state, object_store=store, node_config={}, receive=receive,
             get_run=None, get_fab=None,
             pull_object=lambda run_id, object_id: contents[object_id].deflate(),
             confirm_message_received=confirm, trusted_entities=None)
  return out, bool(asked)


def test_a_message_stored_before_its_run_stopped_keeps_the_loop_in_step():
  # stored, then None, so that turn of the loop pushes no reply while the stored
  # message is answered later: the fix returns its run id, so the reply goes out
  assert pull_once(ORIGINAL, confirm_raises=True) == (None, True)
  assert pull_once(supernode.keep_in_step(ORIGINAL), confirm_raises=True) == (RUN, True)


def test_a_message_flower_deleted_gets_flowers_none():
  # deleted: nothing will answer it, and a run id returned for it would have the loop
  # wait for a reply that never comes
  assert pull_once(ORIGINAL, confirm_raises=True, deletes=True) == (None, True)
  assert pull_once(supernode.keep_in_step(ORIGINAL), confirm_raises=True,
                   deletes=True) == (None, True)
  assert not supernode.still_stored(object(), "m")  # a state of another layout: Flower's


@pytest.mark.parametrize("case", [{}, {"receive_raises": True}], ids=["running", "unpulled"])
def test_every_other_pull_returns_what_flowers_returns(case):
  fixed = supernode.keep_in_step(ORIGINAL)
  assert pull_once(fixed, **case) == pull_once(ORIGINAL, **case)
  assert pull_once(fixed, **case)[0] == (None if case else RUN)


def in_a_process(code):
  """Runs ``code`` after ``s`` (the module) and ``l`` (Flower's loop) are imported in a
  fresh process (whose Flower it may patch); fails with its error."""
  prelude = ("from fedjax_het.deploy import supernode as s; "
             "from flwr.supernode import start_client_internal as l; ")
  out = subprocess.run([sys.executable, "-c", prelude + code], capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]


def test_patch_wraps_flowers_pull_once():
  in_a_process("assert s.patch() and s.patch(); f = l._pull_and_store_message; "
               "assert f.keeps_in_step and f.__wrapped__.__name__ == "
               "'_pull_and_store_message' and not hasattr(f.__wrapped__, '__wrapped__'); "
               "import sys; assert not any(m == 'jax' for m in sys.modules)")
  # and the command line is flower-supernode's, after --poll-interval
  helps = [subprocess.run(cmd + ["--help"], capture_output=True, text=True, timeout=120)
           for cmd in ([sys.executable, "-m", "fedjax_het.deploy.supernode",
                        "--poll-interval", "0.5"],
                       [sys.executable, "-c", "from flwr.supernode.cli import "
                        "flower_supernode as f; import sys; "
                        "sys.argv[0] = 'flower-supernode'; f()"])]
  assert helps[0].returncode == helps[1].returncode == 0
  assert helps[0].stdout == helps[1].stdout and "--superlink" in helps[0].stdout


def test_poll_interval_bounds_the_loops_waits():
  # the sleeps reach time.sleep (recorded here, not slept) cut to the poll interval
  in_a_process("import time; got = []; time.sleep = got.append; s.bound_waits(0.05); "
               "l.time.sleep(3); l.time.sleep(0.01); assert got == [0.05, 0.01], got; "
               "assert l.time.time is time.time and l.time.monotonic is time.monotonic")
  with pytest.raises(ValueError, match="--poll-interval=0.0: must be positive"):
    supernode.bound_waits(0.0)


def test_the_clientapp_launcher_runs_flowers_command_without_the_supernodes_imports(
    tmp_path):
  # in a fresh process: Flower's own function, and none of the SuperNode's servers
  out = subprocess.run(
      [sys.executable, "-c", "import sys; from fedjax_het.deploy import supernode as s; "
       "f = s.load_flwr_clientapp(); print(f.__module__, f.__name__, "
       "sorted(m for m in ('flwr.supernode.cli.flower_supernode', 'sqlalchemy', "
       "'alembic') if m in sys.modules))"], capture_output=True, text=True, timeout=120)
  assert out.stdout.split() == ["flwr.supernode.cli.flwr_clientapp", "flwr_clientapp", "[]"]
  # the command on PATH: this interpreter, and the command line of Flower's flwr-clientapp
  directory = supernode.clientapp_launcher(str(tmp_path))
  launcher = os.path.join(directory, supernode.CLIENTAPP)
  assert directory == str(tmp_path) and os.access(launcher, os.X_OK)
  assert open(launcher).readline() == f"#!{sys.executable}\n"
  flowers = os.path.join(os.path.dirname(sys.executable), supernode.CLIENTAPP)
  helps = [subprocess.run([cmd, "--help"], capture_output=True, text=True, timeout=120)
           for cmd in (launcher, flowers)]
  assert helps[0].returncode == helps[1].returncode == 0
  assert helps[0].stdout == helps[1].stdout and "--token" in helps[0].stdout
  assert supernode.clientapp_launcher(str(tmp_path)) == directory  # rewritten in place
  assert os.listdir(directory) == [supernode.CLIENTAPP]


def test_the_launchers_folder_is_private_and_a_shared_one_is_refused(tmp_path,
                                                                     monkeypatch):
  monkeypatch.setattr(private.tempfile, "tempdir", str(tmp_path))
  monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
  directory = supernode.clientapp_launcher()  # a new folder of this process
  assert os.path.dirname(directory) == str(tmp_path)
  assert os.path.basename(directory).startswith(
      f"{supernode.LAUNCHER_PREFIX}{os.getuid()}_{os.getpid()}_")
  assert os.stat(directory).st_mode & 0o777 == 0o700
  shared = tmp_path / "shared"
  shared.mkdir()
  os.chmod(shared, 0o777)  # created first by another user, say
  with pytest.raises(private.InsecurePath, match="world-writable"):
    supernode.clientapp_launcher(str(shared))
  assert os.listdir(shared) == []  # nothing written there
  environ = {"PATH": "/usr/bin"}
  line = supernode.use_clientapp_launcher(str(shared), environ)
  assert "the launcher could not be written: refusing" in line  # one line; Flower's runs
  assert environ == {"PATH": "/usr/bin"}


def test_the_fork_server_is_off_unless_asked():
  assert not supernode.parser().parse_known_args(["--superlink", "a:1"])[0].fork_server
  assert supernode.parser().parse_known_args(["--fork-server"])[0].fork_server


def test_an_app_shipping_a_module_the_process_imported_is_refused(tmp_path):
  in_a_process(
      "import pathlib, sys; f = s.load_flwr_clientapp(); from flwr.clientapp import utils; "
      f"d = pathlib.Path({str(tmp_path)!r}); (d / 'fedjax_het').mkdir(); "
      "(d / 'fedjax_het' / '__init__.py').write_text(''); "
      "import fedjax_het.deploy.flower\n"
      "try:\n  utils.load_app('fedjax_het.deploy.flower:client_app', ValueError, d)\n"
      "  raise SystemExit('loaded')\n"
      "except ValueError as e:\n  assert 'ships its own' in str(e), e\n"
      "app = utils.load_app('fedjax_het.deploy.flower:client_app', ValueError, "
      f"pathlib.Path({str(tmp_path / 'empty')!r}))\n"
      "assert app is fedjax_het.deploy.flower.client_app")


def test_the_launcher_goes_first_on_path_or_flowers_command_runs(tmp_path):
  environ = {"PATH": "/usr/bin"}
  line = supernode.use_clientapp_launcher(str(tmp_path / "bin"), environ)
  assert line == supernode.QUICK_CLIENTAPP + str(tmp_path / "bin" / supernode.CLIENTAPP)
  assert environ["PATH"] == f"{tmp_path / 'bin'}{os.pathsep}/usr/bin"
  (tmp_path / "file").write_text("")  # not a directory: the launcher cannot be written
  environ = {"PATH": "/usr/bin"}
  line = supernode.use_clientapp_launcher(str(tmp_path / "file" / "bin"), environ)
  assert line.startswith("fedjax_het.deploy.supernode: ClientApps start as Flower's "
                         "flwr-clientapp (the launcher could not be written: ")
  assert environ == {"PATH": "/usr/bin"}


def test_a_flower_without_the_command_where_it_was_runs_its_own(tmp_path, monkeypatch):
  assert supernode.flowers_command_found()  # Flower 1.42 (pyproject pins it)
  monkeypatch.setattr(supernode, "flowers_command_found", lambda: False)
  environ = {"PATH": "/usr/bin"}
  line = supernode.use_clientapp_launcher(str(tmp_path / "bin"), environ)
  assert line.startswith("fedjax_het.deploy.supernode: ClientApps start as Flower's "
                         "flwr-clientapp (this Flower has no ")
  assert environ == {"PATH": "/usr/bin"} and not (tmp_path / "bin").exists()


def test_a_fork_server_starts_only_for_a_supernode_whose_clientapps_use_the_launcher():
  quick, flowers = supernode.QUICK_CLIENTAPP + "/x/flwr-clientapp", ["--superlink", "a:1"]
  assert supernode.wants_fork_server(True, quick, flowers)
  assert not supernode.wants_fork_server(False, quick, flowers)  # --no-fork-server
  assert not supernode.wants_fork_server(True, supernode.FLOWERS_CLIENTAPP + " (why)",
                                         flowers)
  assert not supernode.wants_fork_server(True, quick, ["--help"])
