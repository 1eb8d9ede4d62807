"""``flower-supernode`` kept in step with its replies after a run stops (Flower 1.42).

Flower 1.42's SuperNode loop (``flwr.supernode.start_client_internal``) pulls one
message, then pushes the replies that are ready. A message whose run stops between its
pull and its confirmation (the SuperLink restarted while the old run's next round was
pending; ``flwr stop``) raises ``RunNotRunningException`` after it is stored:
``_pull_and_store_message`` returns None, so that turn pushes nothing, yet the ClientApp
still answers the stored message. From then on the SuperNode sends every reply one
message late, and the last reply of each round waits for the next message: a round of
a later run held for its whole ``round-timeout`` (seen in tests/test_deploy_flower.py:
the evaluation of client 0 answered after 10 minutes). ``keep_in_step`` returns the run
id in that one case, so the loop pushes the stale reply (the SuperLink refuses it, as
Flower logs: ``Run ID ... is not in RUNNING status. Ignoring reply message``) and the
next message's reply goes out on its own turn. A message whose run stopped while its
objects were pulled (before the confirmation) gets no answer, and Flower's None stays.

``--poll-interval S`` (before Flower's flags; default Flower's 3 s) bounds the loop's
waits between two pulls that found no message: a message then waits at most S s for its
SuperNode, where Flower's fixed 3 s made a round of a one-machine federation wait 1.5 s
on average per message (``fedjax_het.deploy.loopback`` polls every 0.5 s).

Usage (``--poll-interval``, then the flags of ``flower-supernode``)::

  python -m fedjax_het.deploy.supernode --poll-interval 0.5 --superlink 127.0.0.1:9093 ...

Each message a SuperNode pulls runs in a new ClientApp process, which Flower's
SuperExec starts as the ``flwr-clientapp`` on ``PATH``. Flower's command imports the
package ``flwr.supernode.cli`` first, whose ``__init__`` imports the SuperNode itself
(FastAPI, SQLAlchemy, Alembic: 0.55 s of a 2 s start, one 2-core machine). ``main``
puts first on ``PATH`` a ``flwr-clientapp`` (``clientapp_launcher``) that runs the same
function of Flower, ``flwr_clientapp``, without that package ``__init__``
(``load_flwr_clientapp``); where the launcher cannot be written, or this Flower's layout
differs from 1.42's, Flower's command runs (``use_clientapp_launcher``; the SuperNode's
second log line says which). The launcher asks the SuperNode's fork server
(``fedjax_het.deploy.forkserver``, started by ``main`` with ``--fork-server``, off by default;
third log line) to fork the ClientApp from a process that imported it already, and
runs it itself where none answers.

``fedjax_het.deploy.loopback`` starts its SuperNodes so. Imports only Flower (and the
fork server the standard library).
"""
from __future__ import annotations

import argparse
import atexit
import functools
import importlib
import importlib.machinery
import importlib.util
import inspect
import os
import shutil
import sys
import tempfile
import time
import types
from typing import Callable

from fedjax_het.deploy import forkserver
from fedjax_het.deploy import private

# the parameter the fix wraps: a Flower whose pull has none is left as it is
CONFIRM = "confirm_message_received"
# the SuperNode's first line (its log says which loop it runs)
KEPT_IN_STEP = ("fedjax_het.deploy.supernode: Flower's SuperNode loop kept in step with "
                "its replies after a run stops")
# the command Flower's SuperExec starts per message, and the line saying whose it runs
CLIENTAPP = "flwr-clientapp"
QUICK_CLIENTAPP = ("fedjax_het.deploy.supernode: ClientApps start as Flower's "
                   "flwr_clientapp without the SuperNode's imports: ")
# ... or, followed by why in parentheses, as Flower's own command
FLOWERS_CLIENTAPP = f"fedjax_het.deploy.supernode: ClientApps start as Flower's {CLIENTAPP}"
# what the fork server imports before its first ClientApp: the Flower App's components
PRELOAD = ("fedjax_het.deploy.flower",)
LAUNCHER_PREFIX = "fedjax_het_clientapp_"  # + uid_pid_random: ``private.private_dir``


def still_stored(state, message_id: str) -> bool:
  """Whether Flower's node ``state`` still holds message ``message_id`` (read without
  marking it retrieved); False where the state is not Flower 1.42's in-memory one."""
  store, lock = getattr(state, "msg_store", None), getattr(state, "lock_msg_store", None)
  if not isinstance(store, dict) or lock is None:
    return False
  with lock:
    return message_id in store


def keep_in_step(pull_and_store: Callable[..., int | None]) -> Callable[..., int | None]:
  """``_pull_and_store_message`` returning the run id of a message stored before its run
  was found stopped, while the node's state still holds that message (where Flower
  returns None, a reply would then go out one turn late); otherwise, and where Flower
  deleted the message (nothing will answer it, so the loop must not wait for a reply),
  what Flower returns."""
  from flwr.supercore.run import RunNotRunningException  # pylint: disable=import-outside-toplevel

  @functools.wraps(pull_and_store)
  def pull(*args, **kwargs):
    confirm, stopped = kwargs[CONFIRM], []

    def confirm_or_note(run_id, message_id):
      try:
        return confirm(run_id, message_id)
      except RunNotRunningException:
        stopped.append((run_id, message_id))  # stored by now; Flower may delete it
        raise

    run_id = pull_and_store(*args, **{**kwargs, CONFIRM: confirm_or_note})
    state = kwargs.get("state", args[0] if args else None)
    if run_id is None and stopped and still_stored(state, stopped[0][1]):
      return stopped[0][0]
    return run_id

  return pull


def patch() -> bool:
  """Wraps Flower's ``_pull_and_store_message`` with ``keep_in_step`` (once); False
  where this Flower's function takes no ``confirm_message_received``."""
  from flwr.supernode import start_client_internal as loop  # pylint: disable=import-outside-toplevel
  original = loop._pull_and_store_message  # pylint: disable=protected-access
  if getattr(original, "keeps_in_step", False):
    return True
  if CONFIRM not in inspect.signature(original).parameters:
    return False
  loop._pull_and_store_message = keep_in_step(original)  # pylint: disable=protected-access
  loop._pull_and_store_message.keeps_in_step = True  # pylint: disable=protected-access
  return True


def bound_waits(poll_interval: float) -> None:
  """Makes every ``time.sleep`` of Flower's SuperNode loop at most ``poll_interval`` s."""
  if not poll_interval > 0:
    raise ValueError(f"--poll-interval={poll_interval}: must be positive")
  from flwr.supernode import start_client_internal as loop  # pylint: disable=import-outside-toplevel
  sleep = lambda seconds: time.sleep(min(seconds, poll_interval))
  loop.time = types.SimpleNamespace(**{**vars(time), "sleep": sleep})


def load_flwr_clientapp() -> Callable[[], None]:
  """Flower's ``flwr_clientapp`` (the ``flwr-clientapp`` command), its module imported
  without running the package ``flwr.supernode.cli``'s ``__init__`` (which imports the
  SuperNode's servers); the package's own import where it was imported already."""
  name = "flwr.supernode.cli"
  if name not in sys.modules:
    spec = importlib.util.find_spec("flwr.supernode")
    package = types.ModuleType(name, "Flower's SuperNode commands (modules on demand)")
    package.__path__ = [os.path.join(os.path.dirname(spec.origin), "cli")]
    sys.modules[name] = package
  from flwr.supernode.cli.flwr_clientapp import flwr_clientapp  # pylint: disable=import-outside-toplevel
  guard_imported_apps()
  return flwr_clientapp


def guard_imported_apps() -> None:
  """Makes Flower's ClientApp loader (``flwr.clientapp.utils.load_app``) refuse an app
  whose submitted bundle (FAB) ships a module of a package this process imported
  already (a fork server's child would otherwise run the imported one, not the one
  submitted): the message fails with ``LoadClientAppError`` saying so. Once."""
  from flwr.clientapp import utils  # pylint: disable=import-outside-toplevel
  original = utils.load_app
  if getattr(original, "guards_imported_apps", False):
    return

  def load_app(module_attribute_str, error_type, project_dir=None):
    top = str(module_attribute_str).partition(":")[0].split(".")[0]
    if top in sys.modules and project_dir and importlib.machinery.PathFinder.find_spec(
        top, [str(project_dir)]) is not None:
      raise error_type(
          f"the submitted app ships its own {top!r} (in {project_dir}), which differs "
          f"from the {top!r} this ClientApp's process imported "
          f"({getattr(sys.modules[top], '__file__', '?')}); refused. Start the SuperNode "
          "without --fork-server and install the app's package where it runs")
    return original(module_attribute_str, error_type, project_dir)

  load_app.guards_imported_apps = True
  utils.load_app = load_app


def flowers_command_found() -> bool:
  """Whether this Flower has ``flwr.supernode.cli.flwr_clientapp.flwr_clientapp`` (1.42's
  layout, which ``load_flwr_clientapp`` imports)."""
  try:
    module = importlib.import_module("flwr.supernode.cli.flwr_clientapp")
  except ImportError:
    return False
  return callable(getattr(module, "flwr_clientapp", None))


def clientapp_main() -> None:
  """``flwr-clientapp``: forked from the SuperNode's fork server (``forkserver.launch``),
  else as Flower's (``load_flwr_clientapp``) in this process."""
  forkserver.launch_or_run(forkserver.DEFAULT_TARGET)


def clientapp_launcher(directory: str | None = None) -> str:
  """Writes ``<directory>/flwr-clientapp`` (``clientapp_main`` under this interpreter).

  Args:
    directory: where (created with mode 0700, and refused unless private to this user:
      ``private.ensure_private``); default a new private folder of this process
      (``private.private_dir``: ``$XDG_RUNTIME_DIR`` or the temporary directory, an
      unguessable name), removed at exit, the folders of SuperNodes that are gone
      removed first.

  Returns:
    the directory, to put first on ``PATH``.

  Raises:
    private.InsecurePath: ``directory`` exists and another user could write to it.
  """
  if directory is None:
    private.remove_stale(LAUNCHER_PREFIX)
    directory = private.private_dir(LAUNCHER_PREFIX)
    atexit.register(shutil.rmtree, directory, True)
  private.ensure_private(directory)
  path = os.path.join(directory, CLIENTAPP)
  fd, temporary = tempfile.mkstemp(dir=directory)
  with os.fdopen(fd, "w") as f:
    f.write(f"#!{sys.executable}\nfrom fedjax_het.deploy.supernode import clientapp_main\n"
            "clientapp_main()\n")
  os.chmod(temporary, 0o755)
  os.replace(temporary, path)
  return directory


def use_clientapp_launcher(directory: str | None = None, environ=None) -> str:
  """Puts ``clientapp_launcher(directory)`` first on ``environ['PATH']`` (default: this
  process's, which the SuperExec inherits); returns the line saying so. Where this
  Flower's layout is not 1.42's (``flowers_command_found``) or the launcher cannot be
  written, ``PATH`` stays and the line says that Flower's command runs, and why.
  """
  environ = os.environ if environ is None else environ
  if not flowers_command_found():
    return (f"{FLOWERS_CLIENTAPP} (this Flower has no "
            "flwr.supernode.cli.flwr_clientapp.flwr_clientapp)")
  try:
    launcher = clientapp_launcher(directory)
  except OSError as err:
    return f"{FLOWERS_CLIENTAPP} (the launcher could not be written: {err})"
  environ["PATH"] = launcher + os.pathsep + environ.get("PATH", "")
  return QUICK_CLIENTAPP + os.path.join(launcher, CLIENTAPP)


def wants_fork_server(asked: bool, launcher: str, flowers: list[str]) -> bool:
  """Whether ``main`` starts a fork server: asked (``--fork-server``), ClientApps
  start through the launcher (``launcher``: ``use_clientapp_launcher``'s line) and
  Flower's flags (``flowers``) start a SuperNode (not ``--help`` nor ``--version``)."""
  return (asked and launcher.startswith(QUICK_CLIENTAPP)
          and not {"-h", "--help", "-V", "--version"} & set(flowers))


def parser() -> argparse.ArgumentParser:
  """The flags of ours, before Flower's: ``--poll-interval``, ``--fork-server``."""
  out = argparse.ArgumentParser(add_help=False)
  out.add_argument("--poll-interval", type=float, default=None)
  out.add_argument("--fork-server", action=argparse.BooleanOptionalAction, default=False)
  return out


def main(argv: list[str] | None = None) -> None:
  """``flower-supernode`` with ``patch`` applied (and ``--poll-interval``), its
  ClientApps started by ``clientapp_launcher``'s command, forked from a fork server
  (``forkserver.start``) with ``--fork-server`` (off by default: a real SuperNode starts
  every ClientApp afresh; ``fedjax_het.deploy.loopback`` turns it on)."""
  ours, flowers = parser().parse_known_args(sys.argv[1:] if argv is None else argv)
  launcher = use_clientapp_launcher()
  server = None
  if wants_fork_server(ours.fork_server, launcher, flowers):
    server = forkserver.start(PRELOAD)  # imports meanwhile
  from flwr.supernode.cli import flower_supernode  # pylint: disable=import-outside-toplevel
  if ours.poll_interval is not None:
    bound_waits(ours.poll_interval)
  if patch():
    print(KEPT_IN_STEP, file=sys.stderr, flush=True)
  else:
    print("fedjax_het.deploy.supernode: this Flower's SuperNode loop differs from 1.42's; "
          "running it unchanged", file=sys.stderr, flush=True)
  print(launcher, file=sys.stderr, flush=True)
  if server is not None:
    print(forkserver.wait_until_listening(*server), file=sys.stderr, flush=True)
  sys.argv[:] = ["flower-supernode", *flowers]
  flower_supernode()


if __name__ == "__main__":
  main()
