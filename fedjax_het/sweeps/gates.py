"""FedMoE's gate weights in a finished run, per client over its test samples: restored
from the run's final checkpoint (``gate_samples_by_client``) and kept beside the run in
``gates.json`` (``write_gates``, ``read_gates``), which the claims ledger reads without
the checkpoint.
"""
from __future__ import annotations

import os

import numpy as np

from fedjax_het.sweeps.rundirs import RunData
from fedjax_het.sweeps.rundirs import read_json
from fedjax_het.training import metrics as metrics_lib

GATES_FILE = "gates.json"


def gate_weights_by_client(workdir: str) -> list[np.ndarray]:
  """alpha_G of every test sample of every client, from the run's final checkpoint."""
  return [w for w, _ in gate_samples_by_client(workdir)]


def gate_samples_by_client(workdir: str) -> list[tuple[np.ndarray, np.ndarray]]:
  """Per client, ``(alpha_G, label)`` of every test sample, from the final checkpoint.

  Rebuilds the experiment from ``config.json`` (the data must be where the run read it,
  with as many devices), restores the newest checkpoint and runs
  ``fedmoe.test_gate_weights``.
  """
  import ml_collections  # noqa: PLC0415 - needed only for FedMoE workdirs

  from fedjax_het.algorithms import fedmoe  # noqa: PLC0415
  from fedjax_het.training import checkpoint as ckpt_lib  # noqa: PLC0415
  from fedjax_het.training import experiment  # noqa: PLC0415
  from fedjax_het.training import program  # noqa: PLC0415
  from fedjax_het.training import runfiles  # noqa: PLC0415

  ckpt_dir = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(ckpt_dir):
    raise FileNotFoundError(f"{workdir} has no checkpoints/")
  config = ml_collections.ConfigDict(read_json(os.path.join(workdir, "config.json")))
  exp = experiment.prepare(config)
  abstract = program.compile_fns(exp).abstract
  ckpt = ckpt_lib.Checkpointer(ckpt_dir, max_to_keep=config.keep_checkpoints,
                               fingerprint=runfiles.fingerprint(exp))
  try:
    restored = ckpt.restore_latest(abstract)
  finally:
    ckpt.close()
  if restored is None:
    raise FileNotFoundError(f"{ckpt_dir} holds no readable checkpoint")
  groups = fedmoe.test_gate_weights(exp.runtime, restored[0], exp.data,
                                    gating_hidden=exp.config.algo.gating_hidden,
                                    global_arch=exp.config.algo.global_arch)
  out = [None] * exp.runtime.layout.num_clients
  for ids, (w, labels, mask) in zip(exp.runtime.layout.client_ids, groups):
    w, labels, mask = np.asarray(w), np.asarray(labels), np.asarray(mask)
    for pos, client in enumerate(ids):  # weight index 0: the global expert G
      out[client] = (w[pos, mask[pos], 0], labels[pos, mask[pos]])
  return out


def write_gates(run: RunData) -> str:
  """``<workdir>/gates.json``: every client's ``(alpha_G, label)`` on its test samples,
  from the run's final checkpoint (``gate_samples_by_client``)."""
  samples = gate_samples_by_client(run.workdir)
  path = os.path.join(run.workdir, GATES_FILE)
  metrics_lib.write_json(path, {
      "round": int(run.rows[-1]["round"]),
      "clients": [{"alpha_global": [round(float(v), 5) for v in a],
                   "label": [int(v) for v in y]} for a, y in samples]})
  return path


def read_gates(run: RunData) -> list[tuple[np.ndarray, np.ndarray]] | None:
  """``[(alpha_G, labels)]`` per client from ``gates.json``, or None when absent."""
  path = os.path.join(run.workdir, GATES_FILE)
  if not os.path.exists(path):
    return None
  return [(np.asarray(c["alpha_global"]), np.asarray(c["label"]))
          for c in read_json(path)["clients"]]
