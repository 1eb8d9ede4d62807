"""Checkpoints of a run: the state pytree plus JSON metadata, through orbax.

``CheckpointManager`` with ``StandardSave``/``StandardRestore`` for the state and
``JsonSave`` for the metadata (round, cumulative counters, the config fingerprint).
Orbax writes a step into a temporary directory and renames it when complete, so a
killed write leaves no half step behind. A step that would not fit on the disk is not
begun, and one that runs out of space midway is removed: either raises ``DiskFull``
(the newest complete step stays; a rerun resumes from it). A step that fails to restore
anyway (corrupted files) is skipped with a warning, moved aside to
``<directory>.corrupted/`` (so the resumed run can write that step again), and the one
before it is used.

The metadata records the state's layout (``packing.layout_of``: client groups packed
or as trees); a restore reads the step in the layout its record names, converting it
where the reader was given a way (``restore_latest``'s ``readers``), and refuses a
layout it does not know in one line. A step written before the layout was recorded is
read in the layout its stored tree shows (``packing.stored_layout``).

Multi-process runs: every process calls ``save`` and ``restore_latest`` (orbax
coordinates the processes and each writes its own shards into the shared directory).
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
from typing import Any

import orbax.checkpoint as ocp
from etils import epath

from fedjax_het import distributed
from fedjax_het import packing

PyTree = Any


class ConfigMismatchError(ValueError):
  """The checkpoint directory belongs to a run with a different configuration."""


class UnknownLayoutError(ValueError):
  """A checkpoint step records a state layout this version cannot read."""


class DiskFull(OSError):
  """A checkpoint step could not be written for lack of disk space (nothing a rerun of
  the same runs could mend before space is freed: a sweep stops on it)."""

  def __init__(self, message: str):
    super().__init__(message)
    self.errno = errno.ENOSPC


def is_disk_full(err: BaseException) -> bool:
  """Whether ``err`` (or an error it was raised from) is "no space left on device":
  an ``OSError`` with ``ENOSPC``, or tensorstore's ``RESOURCE_EXHAUSTED`` message, which
  orbax passes on as a ValueError naming the OS error."""
  while err is not None:
    if isinstance(err, OSError) and err.errno == errno.ENOSPC:
      return True
    if "No space left on device" in str(err):
      return True
    err = err.__cause__ or err.__context__
  return False


def fingerprint_diff(saved: dict, current: dict, defaults: dict | None = None) -> list[str]:
  """Keys (dotted) whose values differ between two flat fingerprints.

  A key the saved fingerprint lacks (it did not exist when it was written) counts as
  equal when the current value is its default in ``defaults``.
  """
  defaults = defaults or {}
  keys = sorted(set(saved) | set(current))
  return [k for k in keys if saved.get(k, defaults.get(k)) != current.get(k)]


class Checkpointer:
  """Saves and restores ``(state, meta)`` under ``directory``.

  Args:
    directory: where steps are written (``<workdir>/checkpoints``).
    max_to_keep: steps kept on disk.
    fingerprint: flat dict of the config values that define the run; a checkpoint
      written under another fingerprint is refused (``ConfigMismatchError``).
    defaults: flat defaults of the config keys (``validation.flat_defaults``), for keys
      newer than a checkpoint.
  """

  def __init__(self, directory: str, *, max_to_keep: int, fingerprint: dict,
               defaults: dict | None = None):
    self.fingerprint, self.defaults = fingerprint, defaults
    # absolute: orbax refuses a relative path on restore, which would read as a
    # corrupted step and quarantine every good checkpoint
    self.manager = ocp.CheckpointManager(
        os.path.abspath(directory), item_names=("state", "meta"),
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                             enable_async_checkpointing=False))

  def steps(self) -> list[int]:
    """Completed steps on disk, oldest first."""
    return sorted(self.manager.all_steps())

  def save(self, step: int, state: PyTree, meta: dict) -> None:
    """Writes step ``step`` (blocking until it is on disk).

    Raises:
      DiskFull: before writing, when the disk has less free space than the newest step
        takes (the new one is as large, and orbax removes an old one only after); or
        when the disk filled up during the write, whose half-written step is then
        removed. The message names the newest complete step, which is kept.
    """
    meta = dict(meta, fingerprint=self.fingerprint, layout=packing.layout_of(state))
    directory = os.fspath(self.manager.directory)
    steps = self.steps()
    if steps:
      needed = _size(os.path.join(directory, str(steps[-1])))
      free = shutil.disk_usage(directory).free
      if not distributed.all_true(free >= needed):  # every process stops, or none
        raise DiskFull(self._not_written(
            step, f"it needs about {needed / 2**20:.1f} MiB (the size of round "
            f"{steps[-1]}'s) and {free / 2**20:.1f} MiB are free there"))
    try:
      self.manager.save(step, args=ocp.args.Composite(
          state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
      self.manager.wait_until_finished()
    except Exception as err:  # noqa: BLE001 - re-raised unless the disk is full
      if not is_disk_full(err):
        raise
      if distributed.is_primary():
        for name in os.listdir(directory):
          if name.startswith(f"{step}.orbax-checkpoint-tmp"):
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)
      try:
        self.manager.reload()  # orbax's list of steps, without the one removed
      except Exception as reload_err:  # noqa: BLE001 - the full disk is what to report
        logging.warning("checkpoint steps not reloaded after a full disk: %s", reload_err)
      free = shutil.disk_usage(directory).free
      raise DiskFull(self._not_written(
          step, f"no space left on device ({free / 2**20:.0f} MiB free there now)")) from err

  def _not_written(self, step: int, why: str) -> str:
    """DiskFull's message: the step, why, and the newest complete step (kept)."""
    steps = self.steps()
    kept = (f"the newest complete checkpoint, round {steps[-1]}, is kept: free space and "
            "rerun the same command to resume from it" if steps else
            "no earlier checkpoint: free space and rerun the same command to start over")
    return (f"checkpoint of round {step} not written to "
            f"{os.fspath(self.manager.directory)}: {why}; {kept}")

  def restore_latest(self, abstract_state: PyTree, readers: dict | None = None
                     ) -> tuple[PyTree, dict] | None:
    """The newest readable step as ``(state, meta)``, or None when there is none.

    In a multi-process run every process reads its own shards; a step counts as
    readable only when it is on every process, so all of them resume from the same step.

    Args:
      abstract_state: ``jax.ShapeDtypeStruct`` tree (with shardings) to restore into.
      readers: ``{layout: (abstract, convert, note)}`` for steps recorded in another
        layout than ``abstract_state``'s: restored into ``abstract``, turned into the
        current layout by ``convert``, ``note`` logged (``program.readers``: steps
        written before client states were packed).

    Raises:
      UnknownLayoutError: the newest step's recorded layout is neither
        ``abstract_state``'s nor one of ``readers``.
    """
    current = packing.layout_of(abstract_state)
    readers = dict(readers or {}, **{current: (abstract_state, None, None)})
    for step in reversed(self.steps()):
      meta = self._restore_or_skip(step, "unreadable", "meta", ocp.args.JsonRestore())
      if meta is None:
        continue
      diff = fingerprint_diff(meta.get("fingerprint", {}), self.fingerprint, self.defaults)
      if diff:
        raise ConfigMismatchError(
            f"checkpoint step {step} in {self.manager.directory} was written by a run with "
            f"a different config; differing keys: {diff}. Use another --workdir or set "
            "--fresh_start to discard it.")
      layout = meta.get("layout") or self._stored_layout(step)
      if layout not in readers:
        raise UnknownLayoutError(
            f"checkpoint step {step} in {self.manager.directory} holds a state of layout "
            f"{layout!r}, which this version cannot read (it reads {sorted(readers)}); "
            "resume it with the version that wrote it, or set --fresh_start")
      abstract, convert, note = readers[layout]
      state = self._restore_or_skip(step, "corrupted", "state",
                                    ocp.args.StandardRestore(abstract))
      if state is not None:
        if convert is not None:
          logging.warning("checkpoint step %d: %s", step, note)
          state = convert(state)
        return state, meta
    return None

  def _stored_layout(self, step: int) -> str:
    """The layout of a step written before ``save`` recorded it, from its stored tree."""
    path = os.path.join(os.fspath(self.manager.directory), str(step), "state")
    try:
      tree = ocp.StandardCheckpointHandler().metadata(epath.Path(path)).tree
    except Exception:  # noqa: BLE001 - unreadable metadata: the restore will say so
      return packing.PACKED_LAYOUT
    return packing.stored_layout(tree.get("clients") if isinstance(tree, dict) else None)

  def _restore_or_skip(self, step: int, what: str, name: str, args) -> PyTree | None:
    """Item ``name`` of ``step``, or None (the step quarantined) if a process can't read it.
    """
    item, ok = None, False
    try:
      item = self.manager.restore(step, args=ocp.args.Composite(**{name: args}))[name]
      ok = True
    except Exception as err:  # noqa: BLE001 - any unreadable step is skipped
      logging.warning("checkpoint step %d is %s (%s); trying the previous one", step, what,
                      err)
    if distributed.all_true(ok):
      return item
    self.quarantine(step)
    return None

  def quarantine(self, step: int) -> None:
    """Moves an unreadable step to ``<directory>.corrupted/<step>`` (kept for inspection).

    Process 0 moves it; every process then reloads the step list.
    """
    if distributed.is_primary():
      directory = os.fspath(self.manager.directory)
      aside = os.path.join(f"{directory}.corrupted", str(step))
      shutil.rmtree(aside, ignore_errors=True)
      os.makedirs(os.path.dirname(aside), exist_ok=True)
      shutil.move(os.path.join(directory, str(step)), aside)
    distributed.sync(f"fedjax_het:quarantined_{step}")
    self.manager.reload()

  def close(self) -> None:
    self.manager.close()


KEEP = ("all", "last", "none")


def check_keep(keep: str, name: str = "keep") -> None:
  """Raises ValueError unless ``keep`` (the argument ``name``) is one of ``KEEP``."""
  if keep not in KEEP:
    raise ValueError(f"{name}={keep!r}; valid: {list(KEEP)}")


def _size(path: str) -> int:
  return sum(os.path.getsize(os.path.join(d, f)) for d, _, files in os.walk(path)
             for f in files)


def prune(directory: str, keep: str) -> int:
  """Removes a finished run's checkpoints: 'last' keeps only its newest step, 'none'
  removes ``directory`` (and ``<directory>.corrupted``), 'all' keeps everything.

  For a finished run only: a longer rerun resumes from the step 'last' keeps and starts
  over after 'none'. A sweep's run at N=100 keeps about 1.7 GB a step.

  Returns:
    the bytes removed.
  """
  check_keep(keep)
  if keep == "all" or not os.path.isdir(directory):
    return 0
  if keep == "none":
    paths = [p for p in (directory, f"{directory}.corrupted") if os.path.isdir(p)]
  else:
    names = os.listdir(directory)
    last = max((int(n) for n in names if n.isdigit()), default=None)
    # an older step, and a temporary directory an interrupted write left behind
    paths = [os.path.join(directory, n) for n in names
             if (n.isdigit() and int(n) != last) or ".orbax-checkpoint-tmp" in n]
  freed = sum(_size(p) for p in paths)
  for p in paths:
    shutil.rmtree(p)
  return freed
