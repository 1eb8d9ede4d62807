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

``fedjax_het.deploy.loopback`` starts its SuperNodes so. Imports only Flower.
"""
from __future__ import annotations

import argparse
import functools
import inspect
import sys
import time
import types
from typing import Callable

# the parameter the fix wraps: a Flower whose pull has none is left as it is
CONFIRM = "confirm_message_received"
# the SuperNode's first line (its log says which loop it runs)
KEPT_IN_STEP = ("fedjax_het.deploy.supernode: Flower's SuperNode loop kept in step with "
                "its replies after a run stops")


def keep_in_step(pull_and_store: Callable[..., int | None]) -> Callable[..., int | None]:
  """``_pull_and_store_message`` returning the run id of a message stored before its run
  was found stopped (where Flower 1.42 returns None); otherwise unchanged."""
  from flwr.supercore.run import RunNotRunningException  # pylint: disable=import-outside-toplevel

  @functools.wraps(pull_and_store)
  def pull(*args, **kwargs):
    confirm, stopped = kwargs[CONFIRM], []

    def confirm_or_note(run_id, message_id):
      try:
        return confirm(run_id, message_id)
      except RunNotRunningException:
        stopped.append(run_id)  # the message and its objects are stored by now
        raise

    run_id = pull_and_store(*args, **{**kwargs, CONFIRM: confirm_or_note})
    return stopped[0] if run_id is None and stopped else run_id

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


def main(argv: list[str] | None = None) -> None:
  """``flower-supernode`` with ``patch`` applied (and ``--poll-interval``)."""
  from flwr.supernode.cli import flower_supernode  # pylint: disable=import-outside-toplevel
  parser = argparse.ArgumentParser(add_help=False)
  parser.add_argument("--poll-interval", type=float, default=None)
  ours, flowers = parser.parse_known_args(sys.argv[1:] if argv is None else argv)
  if ours.poll_interval is not None:
    bound_waits(ours.poll_interval)
  if patch():
    print(KEPT_IN_STEP, file=sys.stderr, flush=True)
  else:
    print("fedjax_het.deploy.supernode: this Flower's SuperNode loop differs from 1.42's; "
          "running it unchanged", file=sys.stderr, flush=True)
  sys.argv[:] = ["flower-supernode", *flowers]
  flower_supernode()


if __name__ == "__main__":
  main()
