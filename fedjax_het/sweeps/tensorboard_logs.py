"""TensorBoard event logs of runs: their ``metrics.jsonl`` scalars by round, written with
tensorboardX (no TensorFlow), and read back from the event files.
"""
from __future__ import annotations

import os
import shutil
import struct

from fedjax_het.sweeps.rundirs import RunData

SCALARS = ("mean_test_acc", "train_loss", "uplink_params", "downlink_params", "wall_s")


def write_tensorboard(run: RunData, tb_dir: str) -> str:
  """``tb_dir/<run name>/``: ``SCALARS`` (and their sum ``comm_params``) per round.

  Written with tensorboardX's ``SummaryWriter`` (no TensorFlow); an earlier log of the
  run is replaced, so reruns do not duplicate points.
  """
  from tensorboardX import SummaryWriter  # noqa: PLC0415

  logdir = os.path.join(tb_dir, run.name)
  shutil.rmtree(logdir, ignore_errors=True)
  writer = SummaryWriter(logdir=logdir)
  try:
    for row in run.rows:
      for key in SCALARS:
        writer.add_scalar(key, row[key], global_step=row["round"])
      writer.add_scalar("comm_params", row["uplink_params"] + row["downlink_params"],
                        global_step=row["round"])
  finally:
    writer.close()
  return logdir


def read_scalars(logdir: str) -> dict:
  """``{tag: [(step, value)]}`` from the event files in ``logdir`` (TFRecord framing:
  uint64 length, uint32 crc, payload, uint32 crc; payload an ``Event`` proto)."""
  from tensorboardX.proto import event_pb2  # noqa: PLC0415

  out: dict = {}
  for name in sorted(os.listdir(logdir)):
    if "tfevents" not in name:
      continue
    with open(os.path.join(logdir, name), "rb") as f:
      data = f.read()
    pos = 0
    while pos + 12 <= len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      pos += 12 + length + 4
      for v in event.summary.value:
        out.setdefault(v.tag, []).append((event.step, v.simple_value))
  return out
