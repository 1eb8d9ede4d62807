"""Checkpoints of a run: the state pytree plus JSON metadata, through orbax.

``CheckpointManager`` with ``StandardSave``/``StandardRestore`` for the state and
``JsonSave`` for the metadata (round, cumulative counters, the config fingerprint).
Orbax writes a step into a temporary directory and renames it when complete, so a
killed write leaves no half step behind; a step that fails to restore anyway
(corrupted files) is skipped with a warning, moved aside to ``<directory>.corrupted/``
(so the resumed run can write that step again), and the one before it is used.
"""
from __future__ import annotations

import logging
import os
import shutil
from typing import Any

import orbax.checkpoint as ocp

PyTree = Any


class ConfigMismatchError(ValueError):
  """The checkpoint directory belongs to a run with a different configuration."""


def fingerprint_diff(saved: dict, current: dict) -> list[str]:
  """Keys (dotted) whose values differ between two flat fingerprints."""
  keys = sorted(set(saved) | set(current))
  return [k for k in keys if saved.get(k) != current.get(k)]


class Checkpointer:
  """Saves and restores ``(state, meta)`` under ``directory``.

  Args:
    directory: where steps are written (``<workdir>/checkpoints``).
    max_to_keep: steps kept on disk.
    fingerprint: flat dict of the config values that define the run; a checkpoint
      written under another fingerprint is refused (``ConfigMismatchError``).
  """

  def __init__(self, directory: str, *, max_to_keep: int, fingerprint: dict):
    self.fingerprint = fingerprint
    self.manager = ocp.CheckpointManager(
        directory, item_names=("state", "meta"),
        options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                             enable_async_checkpointing=False))

  def steps(self) -> list[int]:
    """Completed steps on disk, oldest first."""
    return sorted(self.manager.all_steps())

  def save(self, step: int, state: PyTree, meta: dict) -> None:
    """Writes step ``step`` (blocking until it is on disk)."""
    meta = dict(meta, fingerprint=self.fingerprint)
    self.manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)))
    self.manager.wait_until_finished()

  def restore_latest(self, abstract_state: PyTree) -> tuple[PyTree, dict] | None:
    """The newest readable step as ``(state, meta)``, or None when there is none.

    Args:
      abstract_state: ``jax.ShapeDtypeStruct`` tree (with shardings) to restore into.
    """
    for step in reversed(self.steps()):
      try:
        meta = self.manager.restore(step, args=ocp.args.Composite(
            meta=ocp.args.JsonRestore()))["meta"]
      except Exception as err:  # noqa: BLE001 - any unreadable step is skipped
        logging.warning("checkpoint step %d is unreadable (%s); trying the previous one",
                        step, err)
        self.quarantine(step)
        continue
      diff = fingerprint_diff(meta.get("fingerprint", {}), self.fingerprint)
      if diff:
        raise ConfigMismatchError(
            f"checkpoint step {step} in {self.manager.directory} was written by a run with "
            f"a different config; differing keys: {diff}. Use another --workdir or set "
            "--fresh_start to discard it.")
      try:
        state = self.manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state)))["state"]
      except Exception as err:  # noqa: BLE001
        logging.warning("checkpoint step %d is corrupted (%s); trying the previous one",
                        step, err)
        self.quarantine(step)
        continue
      return state, meta
    return None

  def quarantine(self, step: int) -> None:
    """Moves an unreadable step to ``<directory>.corrupted/<step>`` (kept for inspection)."""
    directory = os.fspath(self.manager.directory)
    aside = os.path.join(f"{directory}.corrupted", str(step))
    shutil.rmtree(aside, ignore_errors=True)
    os.makedirs(os.path.dirname(aside), exist_ok=True)
    shutil.move(os.path.join(directory, str(step)), aside)
    self.manager.reload()

  def close(self) -> None:
    self.manager.close()
