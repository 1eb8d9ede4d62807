"""What crosses the wire of the Flower App: message records and defensive decoding.

Every array of a Flower message is an ``flwr.app.Array``: a declared dtype and shape, a
serialization type (``stype``) and bytes, for numpy ``np.save``'s ``.npy`` format.
Flower's own ``Array.numpy()`` calls ``np.load``, which allocates what the array's own
header says: a header of 2^40 elements asks for 4 TiB before a byte is read, bytes that
start like a zip file raise ``BadZipFile``, a ``torch.Tensor`` stype ``TypeError``. The
server therefore never calls it on a client's reply: ``decode_array`` accepts only
``numpy.ndarray`` payloads, parses the ``.npy`` header itself (magic, version, header
length, ``descr``, ``fortran_order``, ``shape``) and compares it, and the byte length,
with what the algorithm expects (``abstract_upload``) before anything is allocated; the
values are then read with ``np.frombuffer`` (exactly the expected bytes) and copied.
``read_upload`` turns every exception raised while decoding or checking one client's
reply into ``UploadRejected`` (that client's failure for the round, logged with the
reason), so no reply can end a run.

Imports Flower's record types and numpy (no JAX at import time).
"""
from __future__ import annotations

import ast
import math
import os
from typing import Any, Sequence

import numpy as np
from flwr.app import Array
from flwr.app import ArrayRecord
from flwr.app import ConfigRecord
from flwr.app import Message
from flwr.common.constant import ErrorCode

from fedjax_het.deploy import federation as fed_lib

RECORD = "fedjax"  # the ConfigRecord of every message: round, client id, config, key
PAYLOAD, UPLOAD, AUX = "payload", "upload", "aux"
NUMPY_STYPE = "numpy.ndarray"  # flwr's SType.NUMPY: the only payload type accepted
NPY_MAGIC = b"\x93NUMPY"
MAX_NPY_HEADER = 4096  # bytes of a .npy header we parse (numpy's own are < 200 here)


def record(**values) -> ConfigRecord:
  return ConfigRecord(values)


def arrays_record(arrays: Sequence[np.ndarray]) -> ArrayRecord:
  return ArrayRecord([np.ascontiguousarray(a) for a in arrays])


def ordered_arrays(rec: ArrayRecord) -> list:
  """The arrays of an ``ArrayRecord`` built from a list (keys '0', '1', ...), in order."""
  keys = list(rec.keys())
  if keys != [str(i) for i in range(len(keys))]:
    raise fed_lib.UploadRejected(f"array keys {keys[:5]}... are not 0..{len(keys) - 1}")
  return [rec[k] for k in keys]


def parse_npy_header(data: bytes) -> tuple[np.dtype, bool, tuple, int]:
  """(dtype, fortran_order, shape, offset of the values) of ``.npy`` bytes, read from the
  header alone (nothing the header describes is allocated).

  Raises:
    ValueError: not a version 1-3 ``.npy`` header, or one that is not the dict numpy
      writes (``descr`` a plain dtype string, ``shape`` a tuple of ints >= 0).
  """
  if not isinstance(data, (bytes, bytearray, memoryview)):
    raise ValueError(f"the array's data is a {type(data).__name__}, not bytes")
  data = bytes(data[:MAX_NPY_HEADER + 12])
  if data[:6] != NPY_MAGIC:
    raise ValueError(f"not .npy bytes (they start {data[:8]!r})")
  major = data[6]
  if major == 1:
    length, start = int.from_bytes(data[8:10], "little"), 10
  elif major in (2, 3):
    length, start = int.from_bytes(data[8:12], "little"), 12
  else:
    raise ValueError(f".npy version {major} is not 1, 2 or 3")
  if length > MAX_NPY_HEADER:
    raise ValueError(f".npy header of {length} bytes (at most {MAX_NPY_HEADER})")
  if len(data) < start + length:
    raise ValueError(f".npy header of {length} bytes is larger than the "
                     f"{len(data) - start} bytes that follow its length")
  text = data[start:start + length].decode("latin1" if major < 3 else "utf8")
  header = ast.literal_eval(text.strip())  # literals only: no names, no calls
  if not isinstance(header, dict) or set(header) != {"descr", "fortran_order", "shape"}:
    raise ValueError(f".npy header {text.strip()[:80]!r} is not numpy's dict")
  descr, fortran, shape = header["descr"], header["fortran_order"], header["shape"]
  if not isinstance(descr, str) or not isinstance(fortran, bool) or not (
      isinstance(shape, tuple) and all(type(d) is int and d >= 0 for d in shape)):
    raise ValueError(f".npy header {text.strip()[:80]!r} is not numpy's dict")
  return np.dtype(descr), fortran, shape, start + length


def decode_array(array: Any, expected, index: int = 0) -> np.ndarray:
  """One received ``flwr.app.Array`` as the numpy array ``expected`` (a
  ``ShapeDtypeStruct``) describes, checked before anything is allocated.

  Raises:
    UploadRejected: not an ``Array`` of stype ``numpy.ndarray``, or its ``.npy`` header
      (dtype, order, shape) or byte length is not the expected one.
  """
  want_dtype, want_shape = np.dtype(expected.dtype), tuple(expected.shape)
  if not isinstance(array, Array):
    raise fed_lib.UploadRejected(f"array {index} is a {type(array).__name__}, not a "
                                 "flwr Array")
  if array.stype != NUMPY_STYPE:
    raise fed_lib.UploadRejected(f"array {index} is a {array.stype!r} payload; only "
                                 f"{NUMPY_STYPE} is accepted")
  try:
    dtype, fortran, shape, offset = parse_npy_header(array.data)
  except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError) as err:
    raise fed_lib.UploadRejected(f"array {index}: {err}") from err
  if dtype != want_dtype or shape != want_shape or fortran:
    raise fed_lib.UploadRejected(
        f"array {index}: its .npy header says {dtype.str}{list(shape)}"
        f"{' (Fortran order)' if fortran else ''}, expected {want_dtype.str}"
        f"{list(want_shape)}")
  nbytes = want_dtype.itemsize * math.prod(want_shape)
  if len(array.data) - offset != nbytes:
    raise fed_lib.UploadRejected(f"array {index}: {len(array.data) - offset} bytes of "
                                 f"values after its .npy header; {want_dtype.str}"
                                 f"{list(want_shape)} holds {nbytes}")
  return np.frombuffer(array.data, want_dtype, math.prod(want_shape), offset
                       ).reshape(want_shape).copy()


def declared_headers(arrays: Sequence[Any]) -> list[fed_lib.ArrayHeader]:
  """What the arrays' Flower metadata declares (``check_upload``'s first checks)."""
  out = []
  for k, a in enumerate(arrays):
    if not isinstance(a, Array):
      raise fed_lib.UploadRejected(f"array {k} is a {type(a).__name__}, not a flwr Array")
    out.append(fed_lib.ArrayHeader(str(a.dtype), tuple(a.shape), len(a.data)))
  return out


def unanswered(reply: Message | None) -> bool:
  """No reply, or the SuperLink's reply that none will come (the message expired, the
  node stopped sending heartbeats)."""
  return reply is None or (reply.has_error() and reply.error.code in (
      ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE,
      ErrorCode.NODE_UNAVAILABLE))


def _silence(reply: Message | None) -> str:
  why = "" if reply is None else f" ({reply.error.reason.split(' - ')[0].split(' —')[0]})"
  return "no reply within round-timeout" + why


def _checked(reply: Message | None) -> None:
  if unanswered(reply):
    raise fed_lib.UploadRejected(_silence(reply))
  if reply.has_error():
    raise fed_lib.UploadRejected(f"error reply ({reply.error.code}: {reply.error.reason})")


def rejection(err: BaseException) -> fed_lib.UploadRejected:
  """Any exception raised while reading one client's reply, as its rejection (the
  reason names an unexpected exception's type)."""
  if isinstance(err, fed_lib.UploadRejected):
    return err
  return fed_lib.UploadRejected(f"unreadable reply ({type(err).__name__}: {err})")


def new_nonce() -> str:
  """A fresh per-message nonce (128 random bits, hex): sent with every train and
  evaluate message, echoed by the reply and checked, so a reply recorded in another
  round (or for another client) is refused as a replay."""
  return os.urandom(16).hex()


def check_fresh(meta, nonce: str | None, round_: int | None) -> None:
  """``UploadRejected`` unless the reply record ``meta`` echoes the message's ``nonce``
  and ``round_`` (either None: not checked)."""
  if round_ is not None and meta.get("round") != round_:
    raise fed_lib.UploadRejected(f"the reply is for round {meta.get('round')!r}, not "
                                 f"round {round_}: a replayed or stale reply")
  if nonce is not None and meta.get("nonce") != nonce:
    raise fed_lib.UploadRejected("the reply does not echo its message's nonce: a replayed "
                                 "or forged reply")


def read_upload(reply: Message | None, client_id: int, like, expected_weight: int | None,
                *, nonce: str | None = None, round_: int | None = None
                ) -> tuple[list[np.ndarray], int, dict]:
  """(arrays, weight, metrics) of a train reply, or ``UploadRejected`` saying why.

  Whatever a reply holds, this raises nothing else: every other exception (a record of
  the wrong kind, a malformed ``.npy``, an exhausted allocation) becomes the client's
  ``UploadRejected``. With ``nonce`` and ``round_`` the reply must echo both
  (``check_fresh``).
  """
  try:
    _checked(reply)
    meta = reply.content.config_records.get(RECORD)
    rec = reply.content.array_records.get(UPLOAD)
    if meta is None or rec is None:
      raise fed_lib.UploadRejected(f"reply without its {RECORD!r} and {UPLOAD!r} records")
    if meta.get("client-id") == client_id:
      check_fresh(meta, nonce, round_)
    arrays = ordered_arrays(rec)
    import jax  # pylint: disable=import-outside-toplevel  (the server has it loaded)
    leaves = jax.tree.leaves(like)
    tree = fed_lib.check_upload(
        client_id, meta.get("client-id"), declared_headers(arrays),
        lambda: [decode_array(a, ref, k) for k, (a, ref) in enumerate(zip(arrays, leaves))],
        like)
    weight = fed_lib.check_weight(meta.get("num-examples"), expected_weight)
    aux = fed_lib.check_metrics(dict(reply.content.metric_records.get(AUX, {})))
    return fed_lib.encode(tree), weight, aux
  except Exception as err:  # pylint: disable=broad-exception-caught
    raise rejection(err) from err


def read_evaluation(reply: Message | None, client_id: int, expected_total: int | None,
                    *, nonce: str | None = None) -> tuple[int, int]:
  """(correct, total) of an evaluate reply, or ``UploadRejected`` saying why (and
  nothing else, as ``read_upload``). A client's counts are its own claim: the server
  checks their form and total, not whether they are true."""
  try:
    _checked(reply)
    meta = reply.content.config_records.get(RECORD)
    if meta is None or meta.get("client-id") != client_id:
      raise fed_lib.UploadRejected(
          f"the reply to client {client_id} claims to come from client "
          f"{None if meta is None else meta.get('client-id')!r}")
    check_fresh(meta, nonce, None)
    return fed_lib.check_counts(meta.get("correct"), meta.get("total"), expected_total)
  except Exception as err:  # pylint: disable=broad-exception-caught
    raise rejection(err) from err
