"""What the command-line entry points share: one-line errors, ``--help``, quiet logs.

Every command (``experiments/main.py`` and the ``cli()`` of each ``fedjax_het.sweeps``
module that an ``experiments/`` script calls) runs ``run(main)`` instead of
``absl.app.run(main)``. Then:

- ``--help`` (``-h``, ``-?``, ``--helpshort``) prints the command's docstring and each of
  its own flags with its default (or ``required``) on stdout and exits 0;
- every bad input is one ``error: ...`` line on stderr and exit status 2: a config file
  that does not exist or cannot be loaded (an unknown ``:variant`` included), a
  ``--config.<key>=...`` override naming no key of the file (the valid keys of its
  parent are listed), a value of the wrong type, an unknown or missing flag, and an
  exception raised in a user's own code that a config names (a plugin
  ``'package.module:SPEC'`` whose construction raises: the line says where;
  ``FEDJAX_HET_TRACEBACK=1`` shows the whole traceback instead);
- third-party INFO logging (orbax, absl, jax) is off unless ``--verbosity``/``-v`` asks
  for it.
"""
from __future__ import annotations

import logging as py_logging
import os
import re
import sys
import sysconfig
import textwrap
import traceback
from typing import Callable, Sequence

from fedjax_het import config_files

QUIET_LOGGERS = ("jax", "orbax", "absl", "tensorstore", "flwr")
HELP_ARGS = ("--help", "-help", "-h", "-?", "--helpshort", "-helpshort")
HELPFULL_ARGS = ("--helpfull", "-helpfull")
# set to 1: an exception raised in a user's own code keeps its whole traceback
TRACEBACK_ENV = "FEDJAX_HET_TRACEBACK"
PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
WIDTH = 88


def one_line(text: str) -> str:
  """``text`` with its lines joined by spaces (a message stays one line on a terminal)."""
  return " ".join(line.strip() for line in str(text).splitlines() if line.strip())


def fail(err: Exception | str) -> None:
  """Prints ``error: ...`` once (one line) on stderr and exits with status 2."""
  print(f"error: {one_line(err)}", file=sys.stderr, flush=True)
  sys.exit(2)


def show_path(path: str) -> str:
  """``path`` relative to the current directory when inside it, else absolute."""
  rel = os.path.relpath(path)
  return os.path.abspath(path) if rel.startswith("..") else rel


def describe(err: BaseException) -> str:
  """``message`` for the errors that describe bad input, else ``Type: message``."""
  if isinstance(err, (ValueError, FileNotFoundError)) and str(err):
    return str(err)
  return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__


# ----------------------------------------------------------------------------- config files


def load_checked(spec: str, flag: str = "config"):
  """``config_files.load_config_file(spec)``; any failure is a ValueError naming
  ``--<flag>=spec``.

  A missing file, an unknown ``:variant`` (the file's own ValueError, which lists the
  valid ones) or any exception of the file's code (then with its type and line).
  """
  path = spec.partition(":")[0]
  if not os.path.exists(path):
    raise ValueError(f"--{flag}={spec}: no such file {path!r}")
  try:
    return config_files.load_config_file(spec)
  except ValueError as err:
    raise ValueError(f"--{flag}={spec}: {one_line(err)}") from err
  except Exception as err:  # noqa: BLE001 - the config file's own code failed
    frames = traceback.extract_tb(err.__traceback__)
    own = [f for f in frames if os.path.abspath(f.filename) == os.path.abspath(path)]
    frame = (own or frames)[-1]
    where = f" ({show_path(frame.filename)}:{frame.lineno})"
    raise ValueError(f"--{flag}={spec}: {one_line(describe(err))}{where}") from err


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
  """The ``--<flag>`` file loads and every ``--<flag>.key`` override names one of its keys.

  Raises:
    ValueError: one line: what is wrong with the file, or the unknown key.
  """
  spec, keys = overrides(argv, flag)
  if spec is None:
    return
  config = load_checked(spec, flag)
  for key in keys:
    check_key(config, key)


# ----------------------------------------------------------------------------- --help


def wants_help(argv: Sequence[str]) -> str | None:
  """``'short'`` (``--help``), ``'full'`` (``--helpfull``) or None, before a ``--``."""
  for arg in argv[1:]:
    if arg == "--":
      return None
    if arg in HELP_ARGS:
      return "short"
    if arg in HELPFULL_ARGS:
      return "full"
  return None


def is_required(flag) -> bool:
  """Whether ``flags.mark_flag_as_required`` was called on ``flag``."""
  return any("must have a value other than None" in getattr(v, "message", "")
             for v in flag.validators)


def format_default(value) -> str:
  """A flag's default as typed on a command line (``unset`` for None)."""
  if value is None:
    return "unset"
  if isinstance(value, bool):
    return str(value).lower()
  if isinstance(value, (list, tuple)):
    return ",".join(str(v) for v in value) or "none"
  return repr(value) if isinstance(value, str) else str(value)


def describe_flag(flag, config_flag: str | None = None) -> str:
  """``--name: help (default: ...)`` wrapped to ``WIDTH`` columns, continuation indented."""
  from absl import flags  # noqa: PLC0415
  name = f"--[no]{flag.name}" if isinstance(flag, flags.BooleanFlag) else f"--{flag.name}"
  text, repeat = " ".join((flag.help or "").split()), "repeat this option to specify a list"
  if repeat in text:  # absl's note on a DEFINE_multi_* flag
    text = text[:text.index(repeat)].rstrip("; ").rstrip(".") + "; repeatable"
  text = text.rstrip(".")
  if flag.name == config_flag:
    text += f"; --{flag.name}.<key>=<value> overrides one of its keys"
  text += " (required)" if is_required(flag) else f" (default: {format_default(flag.default)})"
  return textwrap.fill(f"{name}: {text}", WIDTH, initial_indent="  ",
                       subsequent_indent="      ", break_on_hyphens=False)


def command_flags(flag_values=None) -> list:
  """The flags a command defines: its main module's and fedjax_het's (not absl's own, nor
  those of libraries such as orbax), in definition order."""
  from absl import flags  # noqa: PLC0415
  flag_values = flag_values or flags.FLAGS
  mine, seen = [], set()
  for module, defined in flag_values.flags_by_module_dict().items():
    if module in ("__main__", sys.argv[0]) or module.startswith("fedjax_het"):
      for flag in defined:
        if flag.name not in seen:
          seen.add(flag.name)
          mine.append(flag)
  return mine


def help_text(doc: str | None, config_flag: str | None = None, flag_values=None) -> str:
  """The command's docstring, then each of its flags with its default."""
  lines = [(doc or f"usage: {sys.argv[0]} [flags]").rstrip(), "", "flags:"]
  lines += [describe_flag(f, config_flag) for f in command_flags(flag_values)]
  lines += ["", "--helpfull lists absl's own flags too (logging: --verbosity, ...)."]
  return "\n".join(lines)


def print_help(kind: str, config_flag: str | None = None) -> None:
  """Prints the help ``kind`` asks for on stdout and exits 0."""
  from absl import app  # noqa: PLC0415
  from absl import flags  # noqa: PLC0415
  if kind == "full":
    app.define_help_flags()
    print(flags.FLAGS.get_help(), flush=True)
  else:
    print(help_text(sys.modules["__main__"].__doc__, config_flag), flush=True)
  sys.exit(0)


# ----------------------------------------------------------------------------- errors in user code


def _installed(path: str) -> bool:
  """Whether ``path`` is the Python installation's (the standard library, site-packages)."""
  roots = {sys.prefix, sys.base_prefix, sys.exec_prefix}
  roots |= {p for p in (sysconfig.get_paths().get(k) for k in ("stdlib", "purelib",
                                                               "platlib")) if p}
  path = os.path.abspath(path)
  return any(path.startswith(os.path.abspath(r) + os.sep) for r in roots)


def user_frame(err: BaseException) -> str | None:
  """``file:line (function)`` where ``err`` left code of the user's (a plugin a config
  names), or None: the deepest frame of its traceback that fedjax_het called and that is
  neither fedjax_het's, the command's own file, nor the Python installation's."""
  below_package, found = False, None
  script = os.path.abspath(sys.argv[0]) if sys.argv and sys.argv[0] else None
  for frame in traceback.extract_tb(err.__traceback__):
    path = os.path.abspath(frame.filename)
    if path.startswith(PACKAGE_DIR + os.sep):
      below_package = True
    elif (below_package and not frame.filename.startswith("<") and path != script
          and not _installed(path)):
      found = f"{show_path(path)}:{frame.lineno} (in {frame.name})"
  return found


def call_main(main: Callable, args) -> object:
  """``main(args)``; an exception from the user's own code is one ``error:`` line."""
  try:
    return main(args)
  except Exception as err:  # noqa: BLE001 - re-raised unless the user's code raised it
    where = user_frame(err)
    if where is None or os.environ.get(TRACEBACK_ENV):
      raise
    first = describe(err).strip().splitlines()[0] if str(err).strip() else describe(err)
    fail(f"{first} (raised in {where}; {TRACEBACK_ENV}=1 shows the traceback)")
  return None


# ----------------------------------------------------------------------------- running


def quiet(argv: Sequence[str]) -> None:
  """Third-party INFO logging off unless ``argv`` sets ``--verbosity`` / ``-v``."""
  if any(a.startswith(("--verbosity", "-v")) for a in argv[1:]):
    return
  from absl import logging as absl_logging
  absl_logging.set_verbosity(absl_logging.WARNING)
  for name in QUIET_LOGGERS:
    py_logging.getLogger(name).setLevel(py_logging.WARNING)


def parse_flags(argv: Sequence[str]) -> list[str]:
  """``absl.flags.FLAGS(argv)``; a flag error (unknown flag, a value of the wrong type,
  a required flag missing) is one ``error:`` line with status 2."""
  from absl import flags  # noqa: PLC0415
  try:
    return flags.FLAGS(list(argv))
  except flags.Error as err:
    missing = re.search(r"Flag --(\w+) must have a value other than None", str(err))
    fail(f"--{missing.group(1)} is required; --help lists the flags" if missing
         else f"{one_line(err)}; --help lists the flags")
  return []


def run(main: Callable, argv: Sequence[str] | None = None,
        flag: str | None = "config") -> None:
  """``absl.app.run(main)`` with the help, the one-line errors and the quiet logs above.

  Args:
    main: the command's ``main(argv)``.
    argv: the command line (``sys.argv``).
    flag: the name of the command's config-file flag (``--config``, ``--sweep``), whose
      file and overrides are checked before absl parses them; None: none.
  """
  from absl import app  # noqa: PLC0415
  argv = list(sys.argv if argv is None else argv)
  kind = wants_help(argv)
  if kind:
    print_help(kind, flag)
  if flag:
    try:
      check_argv(argv, flag)
    except ValueError as err:
      fail(err)
  quiet(argv)
  app.run(lambda args: (quiet(argv), call_main(main, args))[1], argv=argv,
           flags_parser=parse_flags)

