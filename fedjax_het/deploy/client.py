"""The ClientApp side of a deployment: one message, one client, then the process ends.

Flower starts a ClientApp process for every message a SuperNode pulls (or forks it:
``forkserver``), so a client's private model lives in checkpoints in its SuperNode's
``workdir`` between messages; its data is cut from the pool once and kept there
(``federation.prepare_client``), and JAX's persistent compilation cache there makes
every message after the first load its round instead of compiling it. Handlers:

- ``query`` (once per SuperNode and run): compiles the client's round; replies its id.
- ``train`` (round r): trains from the server's payload (decoded as the server decodes
  uploads, ``wire.decode_array``); replies the upload, its example count, its metrics.
- ``evaluate``: ``(correct, total)`` of the personalized model on its test split.

Every handler first checks that the message is addressed to this node's client. Fault
drills (``NodeSettings.fault``) make a client misbehave for tests and rehearsals.
"""
from __future__ import annotations

import hashlib
import io
import json
import math
import os
import signal
import time
import zipfile

import jax
import numpy as np
from flwr.app import Array
from flwr.app import ArrayRecord
from flwr.app import ConfigRecord
from flwr.app import Context
from flwr.app import Message
from flwr.app import MetricRecord
from flwr.app import RecordDict

from fedjax_het.deploy import federation as fed_lib
from fedjax_het.deploy import private
from fedjax_het.deploy import wire
from fedjax_het.deploy.settings import EVAL_FAULTS
from fedjax_het.deploy.settings import NodeSettings
from fedjax_het.deploy.settings import parse_faults
from fedjax_het.deploy.settings import use_compilation_cache
from fedjax_het.training import runfiles


def _say(line: str) -> None:
  """A ClientApp's progress line (in its SuperNode's output), timed."""
  print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


def open_client(settings: NodeSettings, config_json: str) -> fed_lib.ClientNode:
  """This SuperNode's client: the config the server sent, the node's data and state."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  config = ml_collections.ConfigDict(json.loads(config_json))
  if settings.data_path:
    config.data.path = settings.data_path
  if not 0 <= settings.client_id < config.num_clients:
    raise ValueError(f"client-id={settings.client_id} is not in [0, config.num_clients="
                     f"{config.num_clients})")
  private.ensure_private(settings.workdir)  # its checkpoints and compiled programs
  workdir = client_workdir(settings, config)
  use_compilation_cache(os.path.join(settings.workdir, "jax_cache"))
  fed, data = fed_lib.prepare_client(config, settings.client_id, workdir)
  return fed_lib.ClientNode(fed, settings.client_id, data, workdir)


def client_workdir(settings: NodeSettings, config) -> str:
  """Where this client keeps the state of one experiment, ``<workdir>/runs/<hash of
  the config but its resumable keys>``: one SuperNode serves several experiments, and
  a resubmitted run (more rounds, say) finds its state."""
  flat = runfiles.comparable(config.to_dict())
  digest = hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode())
  return os.path.join(settings.workdir, "runs", digest.hexdigest()[:12])


def _addressed(message: Message, settings: NodeSettings) -> ConfigRecord:
  """The message's record, after checking it is meant for this client."""
  meta = message.content.config_records[wire.RECORD]
  if meta.get("client-id") != settings.client_id:
    raise ValueError(f"a message for client {meta.get('client-id')!r} reached client "
                     f"{settings.client_id}'s SuperNode; refused")
  return meta


def _payload(message: Message, like) -> list[np.ndarray]:
  """The server's payload, decoded as uploads are (``wire.decode_array``) against
  ``like`` (``ClientNode.payload_like``)."""
  arrays = wire.ordered_arrays(message.content.array_records[wire.PAYLOAD])
  leaves = jax.tree.leaves(like)
  if len(arrays) != len(leaves):
    raise ValueError(f"a payload of {len(arrays)} arrays; expected {len(leaves)}")
  return [wire.decode_array(a, ref, k) for k, (a, ref) in enumerate(zip(arrays, leaves))]


def _drill(kind: str, meta: dict) -> None:
  """Announces a fault drill (``NodeSettings.fault``); ``kill`` and ``hang`` act now."""
  _say(f"client {meta['client-id']}: fault drill {kind!r} in round {meta['round']}")
  if kind == "kill":
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the SuperNode and everything it started
  while kind == "hang":
    time.sleep(3600)


# drills whose upload does not depend on its values: the client does not train for them
UNTRAINED = frozenset({"torch", "zip", "overlong", "huge", "truncated", "dtype", "nan"})


def _npy(a: np.ndarray) -> bytes:
  buffer = io.BytesIO()
  np.save(buffer, a, allow_pickle=False)
  return buffer.getvalue()


def _lying(a: np.ndarray, stype: str, data: bytes) -> Array:
  """An ``Array`` declaring ``a``'s dtype and shape (what the server expects) with
  ``stype`` and ``data`` of a drill's choosing."""
  return Array(dtype=str(a.dtype), shape=tuple(int(d) for d in a.shape), stype=stype,
               data=data)


def _malformed(kind: str, upload: list[np.ndarray], out: dict) -> list:
  """The upload (arrays, or ``Array``s for the drills on bytes) and reply record
  ``out`` that a malformed-upload drill sends instead of ``upload``."""
  first = np.asarray(upload[0])
  if kind == "nan":
    return [np.full_like(a, np.nan) if np.issubdtype(a.dtype, np.inexact) else a
            for a in upload]
  if kind == "scaled":
    return [a * np.asarray(1e30, a.dtype) if np.issubdtype(a.dtype, np.inexact) else a
            for a in upload]
  if kind in ("flood", "overflow"):  # finite, well-formed, and as large as it gets
    value = 3e38 if kind == "flood" else 1e20
    return [np.full_like(a, value) if np.issubdtype(a.dtype, np.inexact) else a
            for a in upload]
  if kind == "oversize":
    return upload + [np.zeros(1 << 20, np.float32)]
  if kind == "shape":
    return [upload[0][None]] + upload[1:]
  if kind == "impersonate":
    out["client-id"] += 1  # speaks for the next client
    return upload
  if kind == "dtype":  # float64 bytes under a float32 declaration
    data = _npy(first.astype(np.float64))[:len(_npy(first))]
    return [_lying(first, wire.NUMPY_STYPE, data)] + upload[1:]
  if kind == "torch":
    return [_lying(first, "torch.Tensor", _npy(first))] + upload[1:]
  if kind == "zip":
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
      z.writestr("x.npy", _npy(first))
    return [_lying(first, wire.NUMPY_STYPE, buffer.getvalue())] + upload[1:]
  if kind == "overlong":  # a header length field larger than the bytes that follow
    data = bytearray(_npy(first)[:64])
    data[8:10] = (2000).to_bytes(2, "little")
    return [_lying(first, wire.NUMPY_STYPE, bytes(data))] + upload[1:]
  if kind == "huge":  # 2^40 float32 elements (4 TiB) declared in the .npy header
    header = _npy(np.zeros(0, first.dtype)).replace(b"(0,)", b"(1099511627776,)")
    header = header[:8] + (len(header) - 10).to_bytes(2, "little") + header[10:]
    return [_lying(first, wire.NUMPY_STYPE, header + b"\0" * 64)] + upload[1:]
  if kind == "truncated":
    data = _npy(first)
    return [_lying(first, wire.NUMPY_STYPE, data[:len(data) - first.nbytes // 2])
            ] + upload[1:]
  raise ValueError(f"no malformed upload {kind!r}")


def _as_record(arrays: list) -> ArrayRecord:
  """An ``ArrayRecord`` of numpy arrays and ready ``Array``s, keys '0', '1', ..."""
  return ArrayRecord({str(k): a if isinstance(a, Array) else
                      Array(np.ascontiguousarray(a)) for k, a in enumerate(arrays)})


REPLY = "last_reply.npz"  # a client's previous train reply (the ``replay`` drill's)


def _keep_reply(settings: NodeSettings, out: dict, upload: list) -> None:
  """Keeps this train reply in the node's workdir for the ``replay`` drill (only the
  replies of plain numpy arrays)."""
  if all(isinstance(a, np.ndarray) for a in upload):
    path = os.path.join(settings.workdir, REPLY)
    np.savez(path + ".tmp.npz", *upload, meta=json.dumps(out))
    os.replace(path + ".tmp.npz", path)


def _replayed(settings: NodeSettings) -> tuple[dict, list] | None:
  """The previous train reply (record values, arrays), or None."""
  path = os.path.join(settings.workdir, REPLY)
  if not os.path.exists(path):
    return None
  with np.load(path, allow_pickle=False) as z:
    arrays = [z[f"arr_{k}"] for k in range(len(z.files) - 1)]
    return json.loads(str(z["meta"])), arrays


def train(message: Message, context: Context) -> Message:
  settings = NodeSettings.from_node_config(context.node_config)
  meta = _addressed(message, settings)
  round_ = int(meta["round"])
  drill = parse_faults(settings.fault).get(round_)
  if drill in EVAL_FAULTS:
    drill = None
  if drill:
    _drill(drill, {"client-id": settings.client_id, "round": round_})
  if drill == "replay" and _replayed(settings) is not None:
    out, upload = _replayed(settings)  # the old reply, its round and nonce included
    return Message(RecordDict({wire.RECORD: wire.record(**out),
                               wire.UPLOAD: _as_record(upload),
                               wire.AUX: MetricRecord({"loss": 0.0})}), reply_to=message)
  t0 = time.perf_counter()
  node = open_client(settings, meta["config"])
  try:
    if drill in UNTRAINED:  # garbage of the upload's shapes: training would be wasted
      like = fed_lib.abstract_upload(node.fed, node.group)
      upload = fed_lib.encode(jax.tree.map(lambda s: np.zeros(s.shape, s.dtype), like))
      weight, aux = node.data.num_train, {"loss": 0.0}
    else:
      upload, weight, aux = node.fit(round_, _payload(message, node.payload_like),
                                     fed_lib.key_from_bytes(meta["key"]))
      _say(f"client {settings.client_id}: round {round_} trained on {weight} examples | "
           f"loss {aux.get('loss', math.nan):.4f} | {time.perf_counter() - t0:.1f}s")
  finally:
    node.close()
  out = {"client-id": settings.client_id, "round": round_, "num-examples": weight,
         "nonce": meta.get("nonce", "")}
  if drill and drill != "replay":
    upload = _malformed(drill, upload, out)
  if "replay" in parse_faults(settings.fault).values():
    _keep_reply(settings, out, upload)
  return Message(RecordDict({wire.RECORD: wire.record(**out),
                             wire.UPLOAD: _as_record(upload),
                             wire.AUX: MetricRecord(aux)}), reply_to=message)


def evaluate(message: Message, context: Context) -> Message:
  settings = NodeSettings.from_node_config(context.node_config)
  meta = _addressed(message, settings)
  t0 = time.perf_counter()
  node = open_client(settings, meta["config"])
  try:
    correct, total = node.evaluate(_payload(message, node.payload_like))
  finally:
    node.close()
  if parse_faults(settings.fault).get(int(meta["round"])) == "inflate":
    _drill("inflate", {"client-id": settings.client_id, "round": meta["round"]})
    correct = total  # every test example claimed correct
  _say(f"client {settings.client_id}: round {meta['round']} evaluated: {correct}/{total} "
       f"correct | {time.perf_counter() - t0:.1f}s")
  return Message(RecordDict({wire.RECORD: wire.record(**{
      "client-id": settings.client_id, "correct": correct, "total": total,
      "nonce": meta.get("nonce", "")})}),
                 reply_to=message)


def query(message: Message, context: Context) -> Message:
  settings = NodeSettings.from_node_config(context.node_config)
  t0 = time.perf_counter()
  node = open_client(settings, message.content.config_records[wire.RECORD]["config"])
  try:
    node.warmup()
  finally:
    node.close()
  _say(f"client {settings.client_id} ({node.fed.client_archs[settings.client_id]}): state "
       f"from round {node.state_round}, ready in {time.perf_counter() - t0:.1f}s")
  return Message(RecordDict({wire.RECORD: wire.record(**{
      "client-id": settings.client_id, "state-round": node.state_round})}),
                 reply_to=message)
