"""A run's files: checkpoints, ``metrics.jsonl``, ``summary.json`` and the partition.

``RunFiles`` keeps one run's outputs and running totals (``loop.run`` one, ``loop.run_seeds``
one per seed); ``fingerprint`` says which config values a checkpoint must match to be
resumed (all but ``RESUMABLE_KEYS``); ``check_finite`` refuses to record a non-finite round.
"""
from __future__ import annotations

import os
import shutil
from typing import Callable

import jax
import numpy as np

from fedjax_het import data as data_lib
from fedjax_het import validation
from fedjax_het.algorithms import State
from fedjax_het.config_files import flatten
from fedjax_het.data import partition_file
from fedjax_het.training import checkpoint as ckpt_lib
from fedjax_het.training import environment
from fedjax_het.training import metrics as metrics_lib
from fedjax_het.training import program as program_lib
from fedjax_het.training.experiment import Experiment

# Keys that may change when a run is resumed (they do not change what is computed).
RESUMABLE_KEYS = ("num_rounds", "eval_every", "log_every", "checkpoint_every",
                  "keep_checkpoints", "runtime.client_parallelism", "runtime.num_devices")

STANDARD_METRICS = ("train_loss", "group_train_loss", "uplink_params", "downlink_params",
                    "group_finite", "sampled_test_acc", "evaluated", "mean_test_acc")


def comparable(config: dict) -> dict:
  """A config's values as dotted keys, less the keys a resume may change
  (``RESUMABLE_KEYS``): what defines a run."""
  return {k: v for k, v in flatten(config).items() if k not in RESUMABLE_KEYS}


def fingerprint(exp: Experiment) -> dict:
  """Flat dict of the config values that define what a run computes."""
  return {**comparable(exp.config.to_dict()), "runtime.devices": exp.runtime.num_shards}


def check_finite(metrics: dict, first_round: int, archs, where_prefix: str = "") -> None:
  """Raises FloatingPointError at the first non-finite loss or parameter of a chunk.

  Args:
    metrics: the stacked metrics of rounds ``first_round + 1 ..``: ``group_train_loss``
      [rounds, groups] and ``group_finite`` [rounds, groups + 1] (last column: server).
    first_round: rounds completed before the chunk.
    archs: architecture of each group, for the message.
    where_prefix: names the run in the message (``'seed 1: '`` in ``run_seeds``).
  """
  losses = np.asarray(metrics["group_train_loss"])
  finite = np.asarray(metrics["group_finite"])
  bad_loss = ~np.isfinite(losses)
  bad_params = ~finite[:, :-1]
  for r in range(len(losses)):
    groups = np.flatnonzero(bad_loss[r] | bad_params[r])
    if len(groups) or not finite[r, -1]:
      where = (f"client group {groups[0]} ({archs[groups[0]]})" if len(groups)
               else "the server state")
      what = "train loss" if len(groups) and bad_loss[r, groups[0]] else "parameter"
      raise FloatingPointError(
          f"{where_prefix}non-finite {what} at round {first_round + r + 1} in {where}; "
          f"rounds {first_round + 1}-{first_round + len(losses)} were not saved; the last "
          f"good checkpoint (round {first_round} or earlier) is kept")


def extra_metrics(metrics: dict, row: int = -1) -> dict:
  """An algorithm's own metrics (e.g. Moss's ``fidelity``) at row ``row`` of a chunk."""
  return {k: np.asarray(v[row]).tolist() for k, v in sorted(metrics.items())
          if k not in STANDARD_METRICS}


def write_partition(workdir: str, exp: Experiment) -> None:
  """``partition.json``: every client's architecture and train/test class counts; and
  ``partition_indices.npz``: their exact train/test indices into the pool
  (``partition_file``; ``partition.kind='file'`` runs from it)."""
  metrics_lib.write_json(os.path.join(workdir, "partition.json"), {
      "clients": [{"client": k, "arch": exp.client_archs[k],
                   "train_class_counts": exp.class_counts[k, 0].tolist(),
                   "test_class_counts": exp.class_counts[k, 1].tolist()}
                  for k in range(len(exp.client_archs))]})
  if exp.tables is not None:
    partition_file.save(os.path.join(workdir, partition_file.INDICES_FILE), exp.tables)


def clear_outputs(workdir: str) -> None:
  """Removes the checkpoints and metrics of a previous run in ``workdir`` (fresh start)."""
  for name in ("checkpoints", "metrics.jsonl", "summary.json"):
    path = os.path.join(workdir, name)
    shutil.rmtree(path) if os.path.isdir(path) else (
        os.path.exists(path) and os.remove(path))


class RunFiles:
  """One run's outputs and running totals: its checkpoints, ``metrics.jsonl``, summary.

  ``run`` keeps one, ``run_seeds`` one per seed; the files are those of a separate run
  of that seed, so either resumes the other's.

  Args:
    exp: the run's experiment.
    workdir: its (absolute) output directory, already created.
    init, abstract: ``compile_fns``' jitted init and abstract state (for the restore).
    primary: whether this process writes files (process 0 of a multi-process run).
    log: progress lines.
    label: how messages name the run (``'seed 1: '`` in ``run_seeds``).
  """

  def __init__(self, exp: Experiment, workdir: str, init, abstract, *, primary: bool,
               log: Callable[[str], None], label: str = ""):
    config = exp.config
    self.exp, self.workdir, self.primary, self.label = exp, workdir, primary, label
    self.ckpt = ckpt_lib.Checkpointer(
        os.path.join(workdir, "checkpoints"), max_to_keep=config.keep_checkpoints,
        fingerprint=fingerprint(exp), defaults=validation.flat_defaults(config.algorithm))
    restored = self.ckpt.restore_latest(abstract, readers=program_lib.readers(abstract))
    if restored is None:
      self.state = init(jax.random.PRNGKey(config.seed))
      meta = {"uplink_params": 0.0, "downlink_params": 0.0, "wall_s": 0.0}
    else:
      self.state, meta = restored
      log(f"{label}resumed from round {int(self.state.round)} in {workdir}")
    self.start = int(self.state.round)
    self.up, self.down, self.wall0 = (meta["uplink_params"], meta["downlink_params"],
                                      meta["wall_s"])
    # the best sampled-client accuracy of every round so far (rounds between a logged
    # row and the checkpoint included: the checkpoint's meta carries it)
    self.best_sampled = meta.get("best_sampled_test_acc")
    self.sampled, self.loss, self.acc, self.mean_acc = None, float("nan"), None, None
    metrics_path = os.path.join(workdir, "metrics.jsonl")
    if primary:
      metrics_lib.write_json(os.path.join(workdir, "config.json"), config.to_dict())
      write_partition(workdir, exp)
      self.log_rows = metrics_lib.MetricsLog(metrics_path, self.start)

  def open_rows(self) -> None:
    """The non-primary processes read ``metrics.jsonl`` once process 0 rewrote it."""
    if not self.primary:
      self.log_rows = metrics_lib.MetricsLog(os.path.join(self.workdir, "metrics.jsonl"),
                                             self.start, write=False)

  def record(self, m: dict, first_round: int, accuracies, wall_s: float,
             took_s: float) -> None:
    """The rows of one dispatch: totals, and a ``metrics.jsonl`` row per evaluated round.

    Args:
      m: this run's rows of the dispatch, every leaf ``[n, ...]`` on the host.
      first_round: rounds completed before the dispatch.
      accuracies: per-group accuracies of the dispatch's last evaluation, or None.
      wall_s, took_s: the run's wall time before the dispatch, and the dispatch's; a row
        gets its share (the rounds of one dispatch are timed together).
    """
    check_finite(m, first_round, self.exp.runtime.layout.archs, self.label)
    n = len(m["train_loss"])
    ups = self.up + np.cumsum(m["uplink_params"], dtype=np.float64)
    downs = self.down + np.cumsum(m["downlink_params"], dtype=np.float64)
    for j in range(n):
      if "sampled_test_acc" in m:
        self.sampled = float(m["sampled_test_acc"][j])
        self.best_sampled = (self.sampled if self.best_sampled is None
                             else max(self.best_sampled, self.sampled))
      if not m["evaluated"][j]:
        continue
      self.mean_acc = float(m["mean_test_acc"][j])
      row = {"round": first_round + j + 1, "mean_test_acc": self.mean_acc,
             "train_loss": float(m["train_loss"][j]), "uplink_params": float(ups[j]),
             "downlink_params": float(downs[j])}
      if self.sampled is not None:
        row.update(sampled_test_acc=self.sampled, best_sampled_test_acc=self.best_sampled)
      self.log_rows.append({**row, **extra_metrics(m, j),
                            "wall_s": self.wall0 + wall_s + took_s * (j + 1) / n})
    self.up, self.down = float(ups[-1]), float(downs[-1])
    self.loss = float(m["train_loss"][-1])
    if accuracies is not None:
      self.acc = data_lib.unpad_clients([np.asarray(a) for a in accuracies],
                                        self.exp.runtime.layout)

  def save(self, round_: int, state: State, wall_s: float) -> None:
    """Checkpoints this run's ``state`` after ``round_`` rounds."""
    self.ckpt.save(round_, state, {
        "round": round_, "uplink_params": self.up, "downlink_params": self.down,
        "wall_s": self.wall0 + wall_s, "best_sampled_test_acc": self.best_sampled})

  def summary(self, rounds: int, timing: dict) -> dict:
    """``summary.json`` (written by the primary process) from the logged rows."""
    self.ckpt.close()
    rows = self.log_rows.rows
    summary = {
        "final_mean_test_acc": rows[-1]["mean_test_acc"],
        "best_mean_test_acc": max(row["mean_test_acc"] for row in rows),
        "per_client_test_acc": self.acc.tolist(),
        "rounds_completed": rounds,
        "data": self.exp.data_source,
        "uplink_params": rows[-1]["uplink_params"],
        "downlink_params": rows[-1]["downlink_params"],
        # wall-clock figures (they differ between identical runs; comparisons drop them)
        "timing": {"wall_s": rows[-1]["wall_s"], **timing},
        "config": self.exp.config.to_dict(),
        # what it ran on (``environment.describe``): versions, backend, host CPU
        "environment": environment.describe(),
    }
    if "sampled_test_acc" in rows[-1]:
      summary.update(final_sampled_test_acc=rows[-1]["sampled_test_acc"],
                     best_sampled_test_acc=rows[-1]["best_sampled_test_acc"])
    if self.primary:
      metrics_lib.write_json(os.path.join(self.workdir, "summary.json"), summary)
    return summary
