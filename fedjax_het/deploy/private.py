"""Private folders and files for a deployment's processes on a shared machine.

On a multi-user machine (a shared GPU server, a cluster's login node) a folder of a
predictable name in the shared temporary directory can be created first by another
user, and a file written through a symlink they planted lands where they chose. So:

- a folder the deployment makes for itself is made by ``tempfile.mkdtemp`` (a name
  nobody can guess, mode 0700, created atomically) in ``runtime_base()``:
  ``$XDG_RUNTIME_DIR`` when it is set and private, else the temporary directory;
- a folder it reuses (a workdir, ``tls/``, ``keys/``) goes through ``ensure_private``:
  every ancestor is checked first (owned by this user or root, and not writable by
  others unless sticky: a neighbour's ``/tmp/fl`` would let them swap ``tls/``), then
  each missing folder is created with mode 0700 (intermediate ones too), and it is
  refused, with one line naming the path and why (``InsecurePath``), unless ``lstat``
  says it is a directory (not a symlink) owned by this user and writable by nobody
  else;
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
  """``path`` if it is a private folder of this user; else ``InsecurePath`` (its
  ancestors are ``check_ancestors``'s)."""
  why = why_insecure(path)
  if why:
    raise InsecurePath(f"refusing {path}: {why}; a deployment's folders must be owned by "
                       "this user and writable by nobody else")
  return path


def why_unsafe_ancestor(path: str, *, uid: int | None = None) -> str | None:
  """Why the existing folder ``path``, an ancestor of a deployment's folder, lets
  another user swap what lies below it (from ``lstat``): not owned by user ``uid`` (or
  root), or group- or world-writable without the sticky bit (``/tmp`` is fine, a
  ``/tmp/fl`` of mode 0777 is not); a symlink must be owned by ``uid`` or root, and
  the folder it names passes the same checks. None when it is safe."""
  uid = os.getuid() if uid is None else uid
  st = os.lstat(path)
  if st.st_uid not in (uid, 0):
    return f"it is owned by uid {st.st_uid}, neither {uid} nor root"
  if stat.S_ISLNK(st.st_mode):
    return None  # its target is checked on its own path (``unsafe_ancestors``)
  if not stat.S_ISDIR(st.st_mode):
    return "it is not a directory"
  if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX:
    return (f"it is group- or world-writable without the sticky bit (mode "
            f"{stat.S_IMODE(st.st_mode):04o})")
  return None


def _prefixes(path: str) -> list[str]:
  """``/``, ``/a``, ``/a/b`` of the absolute, normalized ``path``."""
  out, current = ["/"], "/"
  for part in os.path.normpath(os.path.abspath(path)).split(os.sep):
    if part:
      current = os.path.join(current, part)
      out.append(current)
  return out


def check_ancestors(path: str) -> None:
  """``InsecurePath`` (one line) unless every existing ancestor of ``path`` (on its
  path as given and on its resolved path) passes ``why_unsafe_ancestor``."""
  parents = _prefixes(path)[:-1]
  resolved = _prefixes(os.path.realpath(os.path.dirname(os.path.abspath(path))))
  for ancestor in dict.fromkeys(parents + resolved):
    if not os.path.lexists(ancestor):
      continue
    why = why_unsafe_ancestor(ancestor)
    if why:
      raise InsecurePath(f"refusing {path}: its parent {ancestor}: {why}; another user "
                         "could replace what lies under it")


def ensure_private(path: str) -> str:
  """``path`` as a private folder: every ancestor checked (``check_ancestors``) before
  anything is made, each missing folder then created with mode 0700 (intermediate ones
  too), and ``path`` checked (``check_private``: a folder that existed keeps its mode,
  and must pass). Returns ``path``."""
  path = os.path.abspath(path)
  check_ancestors(path)
  for folder in _prefixes(path)[1:]:
    if not os.path.lexists(folder):
      try:
        os.mkdir(folder, 0o700)
      except FileExistsError:
        pass  # made meanwhile: checked below
      else:
        os.chmod(folder, 0o700)  # whatever the umask
  check_ancestors(path)  # what was made meanwhile by someone else
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
  parent = parent or runtime_base()
  check_ancestors(os.path.join(parent, prefix))  # the parent and every folder above it
  return tempfile.mkdtemp(prefix=f"{prefix}{os.getuid()}_{os.getpid()}_", dir=parent)


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
  docstring); the folder must be private, its ancestors too (``check_private``,
  ``check_ancestors``). Returns the path."""
  directory = os.path.dirname(os.path.abspath(path))
  check_ancestors(directory)
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


def read_private(path: str) -> bytes:
  """The bytes of a secret file (a CA's key): its folder and every ancestor checked
  first (``check_ancestors``, ``check_private``), and the file itself a regular file
  (not a symlink) owned by this user, opened ``O_NOFOLLOW``."""
  directory = os.path.dirname(os.path.abspath(path))
  check_ancestors(directory)
  check_private(directory)
  st = os.lstat(path)
  if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
    raise InsecurePath(f"refusing {path}: it is not a regular file owned by uid "
                       f"{os.getuid()}")
  fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
  with os.fdopen(fd, "rb") as f:
    return f.read()
