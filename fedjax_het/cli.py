"""What the command-line entry points share: config-key checks, quiet logs, one-line errors.

``experiments/main.py``, ``flower_server.py`` and ``flower_client.py`` call
``run(main)`` instead of ``absl.app.run(main)``: before absl parses the flags, every
``--config.<dotted key>=...`` override is checked against the config file's keys, so a
mistyped key fails with one line naming it and the valid keys of its parent (exit
status 2) instead of ml_collections' traceback; third-party INFO logging (orbax, absl,
jax) is off unless ``--verbosity``/``-v`` asks for it.
"""
from __future__ import annotations

import importlib.util
import logging as py_logging
import os
import sys
from typing import Callable, Sequence

QUIET_LOGGERS = ("jax", "orbax", "absl", "tensorstore", "flwr")


def fail(err: Exception | str) -> None:
  """Prints ``error: ...`` once on stderr and exits with status 2."""
  print(f"error: {err}", file=sys.stderr, flush=True)
  sys.exit(2)


def load_config_file(spec: str):
  """``get_config(arg)`` of a ``path[:arg]`` config file (as ``config_flags`` loads it)."""
  path, _, arg = spec.partition(":")
  if not os.path.exists(path):
    raise ValueError(f"--config={spec}: no such file {path!r}")
  module_spec = importlib.util.spec_from_file_location("fedjax_het_config_file", path)
  module = importlib.util.module_from_spec(module_spec)
  module_spec.loader.exec_module(module)
  return module.get_config(arg) if arg else module.get_config()


def check_key(config, dotted: str) -> None:
  """Raises ValueError unless ``dotted`` names a key of ``config`` (any depth)."""
  node, parts = config, dotted.split(".")
  for i, part in enumerate(parts):
    keys = list(node.keys()) if hasattr(node, "keys") else []
    if part not in keys:
      parent = ".".join(parts[:i])
      where = f"of {parent!r}" if parent else "at the top level"
      raise ValueError(f"unknown config key {dotted!r}; valid keys {where} are "
                       f"{sorted(keys)}")
    node = node[part]


def overrides(argv: Sequence[str], flag: str = "config") -> tuple[str | None, list[str]]:
  """(the ``--<flag>=`` file spec, the dotted keys of ``--<flag>.key=value`` overrides)."""
  spec, keys = None, []
  for i, arg in enumerate(argv):
    if arg.startswith(f"--{flag}="):
      spec = arg.split("=", 1)[1]
    elif arg == f"--{flag}" and i + 1 < len(argv):
      spec = argv[i + 1]
    elif arg.startswith(f"--{flag}."):
      keys.append(arg[len(flag) + 3:].split("=", 1)[0])
  return spec, keys


def check_argv(argv: Sequence[str], flag: str = "config") -> None:
  """Every ``--config.key`` override of ``argv`` names a key of the ``--config`` file."""
  spec, keys = overrides(argv, flag)
  if spec is None or not keys:
    return
  config = load_config_file(spec)
  for key in keys:
    check_key(config, key)


def quiet(argv: Sequence[str]) -> None:
  """Third-party INFO logging off unless ``argv`` sets ``--verbosity`` / ``-v``."""
  if any(a.startswith(("--verbosity", "-v")) for a in argv[1:]):
    return
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.WARNING)
  for name in QUIET_LOGGERS:
    py_logging.getLogger(name).setLevel(py_logging.WARNING)


def run(main: Callable, argv: Sequence[str] | None = None, flag: str = "config") -> None:
  """``absl.app.run(main)`` after checking the config overrides and quieting the logs."""
  from absl import app
  argv = list(sys.argv if argv is None else argv)
  try:
    check_argv(argv, flag)
  except ValueError as err:
    fail(err)
  quiet(argv)
  app.run(lambda args: (quiet(argv), main(args))[1], argv=argv)
