"""Private folders and files for a deployment's processes on a shared machine.

On a multi-user machine (a shared GPU server, a cluster's login node) a folder of a
predictable name in the shared temporary directory can be created first by another
user, and a file written through a symlink they planted lands where they chose. So:

- a folder the deployment makes for itself is made by ``tempfile.mkdtemp`` (a name
  nobody can guess, mode 0700, created atomically) in ``runtime_base()``:
  ``$XDG_RUNTIME_DIR`` when it is set and private, else the temporary directory;
- a folder it reuses (a workdir, ``tls/``, ``keys/``) goes through ``ensure_private``:
  created with mode 0700 where missing, and refused, with one line naming the path and
  why (``InsecurePath``), unless ``lstat`` says it is a directory (not a symlink) owned by
  this user and writable by nobody else;
- a secret (a key, a certificate) is written by ``write_private``: to a new file opened
  with ``O_CREAT | O_EXCL | O_NOFOLLOW`` and mode 0600 in a private folder, then renamed
  over the name, so whatever existed there (a file of another mode, a symlink) is
  replaced and never written through.

``remove_stale`` removes the folders that ``private_dir`` made for processes that are
gone (a SIGKILLed SuperNode leaves its fork server's folder).

Imports only the standard library.
"""
from __future__ import annotations

import os
import re
import shutil
import stat
import tempfile


class InsecurePath(PermissionError):
  """A folder or file another user could control; refused."""


def why_insecure(path: str, *, uid: int | None = None) -> str | None:
  """Why ``path`` is no private folder of user ``uid`` (default this process's), from
  ``lstat``: missing, a symlink, not a directory, another owner, group- or
  world-writable; None when it is one."""
  uid = os.getuid() if uid is None else uid
  try:
    st = os.lstat(path)
  except FileNotFoundError:
    return "it does not exist"
  if stat.S_ISLNK(st.st_mode):
    return "it is a symlink"
  if not stat.S_ISDIR(st.st_mode):
    return "it is not a directory"
  if st.st_uid != uid:
    return f"it is owned by uid {st.st_uid}, not {uid}"
  if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
    return f"it is group- or world-writable (mode {stat.S_IMODE(st.st_mode):04o})"
  return None


def check_private(path: str) -> str:
  """``path`` if it is a private folder of this user; else ``InsecurePath``."""
  why = why_insecure(path)
  if why:
    raise InsecurePath(f"refusing {path}: {why}; a deployment's folders must be owned by "
                       "this user and writable by nobody else")
  return path


def ensure_private(path: str) -> str:
  """Creates ``path`` (and missing parents) with mode 0700 where missing; returns it
  after ``check_private`` (a folder that existed keeps its mode, and must pass)."""
  if not os.path.lexists(path):
    os.makedirs(path, mode=0o700, exist_ok=True)
  return check_private(path)


def runtime_base() -> str:
  """``$XDG_RUNTIME_DIR`` when set and private, else the temporary directory (a shared
  sticky folder, where only ``mkdtemp``'s unguessable names are made)."""
  xdg = os.environ.get("XDG_RUNTIME_DIR", "")
  if xdg and os.path.isabs(xdg) and why_insecure(xdg) is None:
    return xdg
  return tempfile.gettempdir()


def private_dir(prefix: str, parent: str | None = None) -> str:
  """A new folder (mode 0700, a name nobody can guess) under ``parent`` (default
  ``runtime_base()``), named ``<prefix><uid>_<pid>_...`` so that ``remove_stale`` finds it
  once this process is gone."""
  return tempfile.mkdtemp(prefix=f"{prefix}{os.getuid()}_{os.getpid()}_",
                          dir=parent or runtime_base())


def alive(pid: int) -> bool:
  """Whether process ``pid`` exists (one of another user's counts as alive)."""
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


def remove_stale(prefix: str, parent: str | None = None) -> list[str]:
  """Removes this user's ``private_dir(prefix)`` folders whose process has ended (only
  directories that ``lstat`` says this user owns; never through a symlink); returns
  their paths."""
  parent = parent or runtime_base()
  pattern = re.compile(re.escape(f"{prefix}{os.getuid()}_") + r"(\d+)_")
  removed = []
  try:
    names = os.listdir(parent)
  except OSError:
    return removed
  for name in names:
    match = pattern.match(name)
    path = os.path.join(parent, name)
    if match and not alive(int(match.group(1))) and why_insecure(path) is None:
      shutil.rmtree(path, ignore_errors=True)
      removed.append(path)
  return removed


def write_private(path: str, data: bytes) -> str:
  """Writes ``data`` to ``path`` with mode 0600 whatever was there (see the module
  docstring); the folder must be private (``check_private``). Returns the path."""
  directory = os.path.dirname(os.path.abspath(path))
  check_private(directory)
  temporary = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}."
                           f"{os.urandom(6).hex()}")
  fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
  try:
    with os.fdopen(fd, "wb") as f:
      f.write(data)
    os.replace(temporary, path)  # replaces a symlink itself, never its target
  except BaseException:
    if os.path.lexists(temporary):
      os.unlink(temporary)
    raise
  return path
