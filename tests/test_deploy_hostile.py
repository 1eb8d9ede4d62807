"""A deployment against a hostile client and a hostile neighbour, in one process.

- Uploads: every malformed payload a client can send (``client._malformed``: a wrong
  payload type, zip bytes, a ``.npy`` header longer than its bytes, a header of 2^40
  elements, truncated bytes, a wrong dtype, NaN, a huge norm) is rejected by
  ``wire.read_upload`` with its reason and nothing else raised; the 2^40-element header
  is refused before any allocation. The real-process drill is in test_deploy_flower.py.
- Defences (``robust``): the norm bound, the coordinate-wise median and trimmed mean
  (hand-computed values), the bench.
- Folders and files (``private``, ``certs``): a pre-existing world-writable, foreign-owned
  or symlinked folder is refused with one line; keys are written 0600 whatever existed,
  never through a symlink; stale folders of ended processes are removed, no others.

Foreign owners are made with ``os.chown`` (the suite runs as root here); where it does
not run as root those cases are skipped.
"""
import io
import os
import subprocess
import sys
import tracemalloc

import jax
import numpy as np
import pytest

pytest.importorskip("flwr")
from flwr.app import Array  # noqa: E402
from flwr.app import ArrayRecord  # noqa: E402
from flwr.app import ConfigRecord  # noqa: E402
from flwr.app import Message  # noqa: E402
from flwr.app import MetricRecord  # noqa: E402
from flwr.app import RecordDict  # noqa: E402
from flwr.app.metadata import Metadata  # noqa: E402

from fedjax_het.deploy import certs  # noqa: E402
from fedjax_het.deploy import client  # noqa: E402
from fedjax_het.deploy import federation as fed_lib  # noqa: E402
from fedjax_het.deploy import private  # noqa: E402
from fedjax_het.deploy import robust  # noqa: E402
from fedjax_het.deploy import wire  # noqa: E402

LIKE = {"b": jax.ShapeDtypeStruct((4,), np.float32),
        "w": jax.ShapeDtypeStruct((3, 4), np.float32)}
UPLOAD = [np.arange(4, dtype=np.float32), np.ones((3, 4), np.float32)]  # leaves b, w
ROOT = os.geteuid() == 0
NOBODY = 65534


def reply(arrays, *, client_id=1, weight=10, record_items=None):
  """A train reply of client ``client_id`` carrying ``arrays`` (numpy or ``Array``)."""
  meta = Metadata(7, "r", 1, 2, "m", "1", 0.0, 60.0, "train")
  upload = record_items if record_items is not None else client._as_record(arrays)
  content = RecordDict({wire.RECORD: ConfigRecord({"client-id": client_id,
                                                   "num-examples": weight}),
                        wire.UPLOAD: upload, wire.AUX: MetricRecord({"loss": 1.0})})
  return Message(content, metadata=meta)


def test_a_good_reply_is_decoded_against_the_expected_upload():
  arrays, weight, aux = wire.read_upload(reply(UPLOAD), 1, LIKE, 10)
  np.testing.assert_array_equal(arrays[0], UPLOAD[0])
  np.testing.assert_array_equal(arrays[1], UPLOAD[1])
  assert (weight, aux) == (10, {"loss": 1.0})


@pytest.mark.parametrize("kind,why", [
    ("torch", "'torch.Tensor' payload; only numpy.ndarray is accepted"),
    ("zip", "not .npy bytes (they start b'PK"),
    ("overlong", ".npy header of 2000 bytes is larger than the 54 bytes"),
    ("huge", "its .npy header says <f4[1099511627776], expected <f4[4]"),
    ("truncated", "8 bytes of values after its .npy header; <f4[4] holds 16"),
    ("dtype", "its .npy header says <f8[4], expected <f4[4]"),
    ("nan", "array 0 holds non-finite values"),
    ("shape", r"declared float32[1, 4], expected float32[4]"),
    ("oversize", "bytes received; the upload holds at most"),
])
def test_every_malformed_upload_is_its_clients_rejection(kind, why):
  bad = reply(client._malformed(kind, list(UPLOAD), {"client-id": 1}))
  tracemalloc.start()
  try:
    with pytest.raises(fed_lib.UploadRejected) as err:
      wire.read_upload(bad, 1, LIKE, 10)
    peak = tracemalloc.get_traced_memory()[1]
  finally:
    tracemalloc.stop()
  assert why in str(err.value), str(err.value)
  assert peak < 8 << 20  # the 2^40-element header allocated nothing of its size


def test_np_load_would_have_allocated_the_huge_header():
  """What the server no longer calls: Flower's ``Array.numpy()`` (``np.load``) on the
  2^40-element header asks for 4 TiB (or fails on the missing bytes after asking)."""
  huge = client._malformed("huge", list(UPLOAD), {})[0]
  dtype, fortran, shape, _ = wire.parse_npy_header(huge.data)
  assert (dtype, fortran, shape) == (np.dtype("<f4"), False, (1 << 40,))
  with pytest.raises((MemoryError, ValueError)):
    np.load(io.BytesIO(huge.data), allow_pickle=False)


def npy_header(text: str, length: int | None = None) -> bytes:
  """``.npy`` version 1 bytes with header ``text`` (its length field ``length``)."""
  body = text.encode("latin1")
  return b"\x93NUMPY\x01\x00" + (len(body) if length is None else length).to_bytes(
      2, "little") + body


@pytest.mark.parametrize("data,why", [
    (b"\x93NUMPY\x09\x00" + b"\x00" * 20, ".npy version 9"),
    (npy_header("{'descr': 1}"), "is not numpy's dict"),
    (npy_header("{'descr': '<f4', 'fortran_order': 0, 'shape': (4,)}"),
     "is not numpy's dict"),
    (npy_header("{'descr': '<f4', 'fortran_order': False, 'shape': (-4,)}"),
     "is not numpy's dict"),
    (npy_header("__import__('os').system('echo pwned')"), "malformed node"),
    (npy_header("{}", length=65535), "header of 65535 bytes (at most 4096)"),
])
def test_npy_headers_are_parsed_as_literals_within_bounds(data, why):
  with pytest.raises((ValueError, SyntaxError)) as err:
    wire.parse_npy_header(data)
  assert why in str(err.value)


def test_any_exception_reading_a_reply_is_a_rejection_not_a_crash():
  odd = ArrayRecord({"0": Array(UPLOAD[0]), "x": Array(UPLOAD[1])})  # keys not 0..n-1
  with pytest.raises(fed_lib.UploadRejected, match="array keys"):
    wire.read_upload(reply(None, record_items=odd), 1, LIKE, 10)
  fortran = Array(np.asfortranarray(np.ones((3, 4), np.float32)))
  with pytest.raises(fed_lib.UploadRejected, match="Fortran order"):
    wire.read_upload(reply([UPLOAD[0], fortran]), 1, LIKE, 10)
  with pytest.raises(fed_lib.UploadRejected, match="claims to come from client 2"):
    wire.read_upload(reply(UPLOAD, client_id=2), 1, LIKE, 10)
  with pytest.raises(fed_lib.UploadRejected, match="no reply within round-timeout"):
    wire.read_upload(None, 1, LIKE, 10)
  # an exception no check foresaw (here: a like that is no shape) is a rejection too
  with pytest.raises(fed_lib.UploadRejected, match="unreadable reply|does not decode"):
    wire.read_upload(reply(UPLOAD), 1, {"b": object(), "w": object()}, 10)


# ------------------------------------------------------------------ robust aggregation
def test_norm_bound_rejects_or_clips_against_the_lower_median():
  ups = {0: [np.array([3.0, 4.0], np.float32)], 1: [np.array([0.0, 6.0], np.float32)],
         2: [np.array([0.0, 5e30], np.float32)]}
  kept, why = robust.norm_bound(ups, 10.0, "reject")
  assert sorted(kept) == [0, 1] and list(why) == [2]  # reference: 6 (lower median)
  assert "upload norm 5e+30 exceeds upload-norm-bound 10 x the round's reference 6" in why[2]
  kept, why = robust.norm_bound(ups, 10.0, "clip")
  np.testing.assert_allclose(kept[2][0], [0.0, 60.0], rtol=1e-6)  # scaled to 10 x 6
  two = {0: ups[0], 2: ups[2]}  # one outlier of two: the lower median is the honest one
  assert list(robust.norm_bound(two, 10.0, "reject")[1]) == [2]
  assert robust.norm_bound({0: ups[2]}, 10.0, "reject") == ({0: ups[2]}, {})  # no reference
  assert robust.norm_bound(ups, 0.0, "reject")[1] == {}  # off
  assert robust.upload_norm([np.array([3.0, 4.0]), np.array([1, 2], np.int32)]) == 5.0


def test_coordinate_wise_median_and_trimmed_mean_by_hand():
  rows = [np.array([1.0, 10.0], np.float32), np.array([2.0, 20.0], np.float32),
          np.array([100.0, 0.0], np.float32), np.array([3.0, 30.0], np.float32)]
  np.testing.assert_allclose(robust.robust_mean(rows, "median"), [2.5, 15.0])
  # 4 rows, f = 0.25: one cut at each end per coordinate: mean of (2, 3) and (10, 20)
  np.testing.assert_allclose(robust.robust_mean(rows, "trimmed-mean", 0.25), [2.5, 15.0])
  np.testing.assert_allclose(robust.robust_mean(rows[:3], "trimmed-mean", 0.0),
                             [103 / 3, 10.0])
  out = robust.robust_uploads({5: [rows[0]], 6: [rows[1]], 7: [rows[2]]}, "median")
  for c in (5, 6, 7):  # every row the median: the server's weighted mean is the median
    np.testing.assert_allclose(out[c][0], [2.0, 10.0])
  assert robust.robust_uploads({5: [rows[0]]}, "mean")[5][0] is rows[0]


def test_robust_rules_apply_only_to_averaging_algorithms():
  robust.check_rule("median", "fedavg")
  robust.check_rule("mean", "fd")
  with pytest.raises(ValueError, match="'fd' takes only 'mean'"):
    robust.check_rule("trimmed-mean", "fd")
  with pytest.raises(ValueError, match="valid"):
    robust.check_rule("mode", "fedavg")


def test_a_client_rejected_rounds_running_is_benched():
  bench = robust.Bench(after=2, rounds=3)
  assert bench.record(1, rejected=[4], accepted=[1]) == {}
  assert bench.record(2, rejected=[4], accepted=[1]) == {4: 5}  # benched rounds 3-5
  assert bench.benched(3) == bench.benched(5) == [4] and bench.benched(6) == []
  assert bench.record(6, rejected=[4], accepted=[]) == {}  # its streak starts again
  bench.record(7, rejected=[], accepted=[4])
  assert bench.record(8, rejected=[4], accepted=[]) == {}  # an accepted round reset it
  assert robust.Bench(after=0, rounds=3).record(1, [4], []) == {}  # never


# ------------------------------------------------------------------ folders and files
def test_a_new_private_folder_and_a_reused_one(tmp_path):
  path = private.ensure_private(str(tmp_path / "a" / "b"))
  assert os.stat(path).st_mode & 0o777 == 0o700
  assert private.ensure_private(path) == path  # reused: ours, private


@pytest.mark.parametrize("case", ["world-writable", "group-writable", "symlink",
                                  "foreign-owned", "a file"])
def test_a_folder_another_user_could_control_is_refused_with_one_line(tmp_path, case):
  path = str(tmp_path / "shared")
  if case == "symlink":
    os.mkdir(tmp_path / "elsewhere", 0o700)
    os.symlink(tmp_path / "elsewhere", path)
  elif case == "a file":
    open(path, "w").close()
  else:
    os.mkdir(path, 0o700)
    if case == "foreign-owned":
      if not ROOT:
        pytest.skip("chown to another user needs root")
      os.chown(path, NOBODY, NOBODY)
    else:
      os.chmod(path, 0o777 if case == "world-writable" else 0o770)
  with pytest.raises(private.InsecurePath) as err:
    private.ensure_private(path)
  message = str(err.value)
  assert "\n" not in message and message.startswith(f"refusing {path}: ")
  assert {"world-writable": "group- or world-writable (mode 0777)",
          "group-writable": "group- or world-writable (mode 0770)",
          "symlink": "it is a symlink", "a file": "it is not a directory",
          "foreign-owned": f"owned by uid {NOBODY}"}[case] in message


def test_keys_are_written_0600_whatever_existed_and_never_through_a_symlink(tmp_path):
  keys = tmp_path / "keys"
  os.mkdir(keys, 0o700)
  (keys / "client-0").write_text("old")
  os.chmod(keys / "client-0", 0o644)  # an existing key left readable
  target = tmp_path / "victim"
  target.write_text("do not touch")
  os.symlink(target, keys / "client-0.pub")  # a planted symlink at the public key's name
  key = certs.make_node_key(str(keys), "client-0")
  for path in (key.private_key, key.public_key):
    st = os.lstat(path)
    assert st.st_mode & 0o777 == 0o600 and not os.path.islink(path)
  assert target.read_text() == "do not touch"
  assert open(key.private_key).read().startswith("-----BEGIN OPENSSH PRIVATE KEY")
  assert sorted(os.listdir(keys)) == ["client-0", "client-0.pub"]  # no temporary left
  os.chmod(keys, 0o777)
  with pytest.raises(private.InsecurePath, match="world-writable"):
    certs.make_node_key(str(keys), "client-1")


def test_each_supernode_gets_a_certificate_of_its_own(tmp_path):
  from cryptography import x509
  tls = certs.make_tls(str(tmp_path / "tls"))
  own = certs.make_supernode_tls(tls, str(tmp_path / "tls" / "nodes"), "client-0")
  ca = x509.load_pem_x509_certificate(open(tls.ca_cert, "rb").read())
  cert = x509.load_pem_x509_certificate(open(own.server_cert, "rb").read())
  cert.verify_directly_issued_by(ca)
  assert open(own.server_key).read() != open(tls.server_key).read()
  assert all(os.stat(p).st_mode & 0o777 == 0o600 for p in (own.server_cert, own.server_key,
                                                          tls.ca_cert, tls.server_key))


def test_stale_folders_of_ended_processes_are_removed_and_no_others(tmp_path):
  ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                         capture_output=True, text=True, check=True)
  dead = int(ended.stdout)
  prefix, uid = "fedjax_het_test_", os.getuid()
  stale = tmp_path / f"{prefix}{uid}_{dead}_abc"
  live = tmp_path / f"{prefix}{uid}_{os.getpid()}_abc"
  for d in (stale, live):
    os.mkdir(d, 0o700)
  (stale / "socket").write_text("")
  linked = tmp_path / f"{prefix}{uid}_{dead}_link"
  os.symlink(live, linked)  # a symlink of a stale name: not followed, not removed
  other = tmp_path / f"{prefix}{uid + 1}_{dead}_abc"  # another user's name
  os.mkdir(other, 0o700)
  assert private.remove_stale(prefix, str(tmp_path)) == [str(stale)]
  assert sorted(os.listdir(tmp_path)) == sorted(p.name for p in (live, linked, other))
  made = private.private_dir(prefix, str(tmp_path))
  assert os.path.basename(made).startswith(f"{prefix}{uid}_{os.getpid()}_")
  assert os.stat(made).st_mode & 0o777 == 0o700


def test_runtime_base_is_xdg_runtime_dir_only_when_private(tmp_path, monkeypatch):
  xdg = tmp_path / "run"
  os.mkdir(xdg, 0o700)
  monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
  assert private.runtime_base() == str(xdg)
  os.chmod(xdg, 0o777)
  assert private.runtime_base() != str(xdg)


def test_a_client_or_server_workdir_another_user_could_write_is_refused(tmp_path,
                                                                       tiny_config):
  import json

  from fedjax_het.deploy import settings as settings_lib
  shared = tmp_path / "shared"
  shared.mkdir()
  os.chmod(shared, 0o777)
  c = tiny_config("fedavg", "tiny", {"num_clients": 2})
  node = settings_lib.NodeSettings(client_id=0, workdir=str(shared))
  with pytest.raises(private.InsecurePath, match="world-writable"):
    client.open_client(node, json.dumps(c.to_dict()))
  assert os.listdir(shared) == []  # refused before anything was written


def test_relative_path_overrides_are_made_absolute(tmp_path):
  from fedjax_het.deploy import settings as settings_lib
  argv = ["x", "--config.data.path=data/c.npz", "--config.partition.path=/abs/p.npz",
          "--config.num_clients=3"]
  assert settings_lib.parse_overrides(settings_lib.overrides_of(argv, cwd=str(tmp_path))) == {
      "data.path": str(tmp_path / "data" / "c.npz"), "partition.path": "/abs/p.npz",
      "num_clients": "3"}


def test_the_loopbacks_processes_get_absolute_data_paths(tmp_path, monkeypatch):
  """Its processes run in its workdir: a relative FEDJAX_HET_DATA (the README's
  ``../shared/data``) would name another folder there."""
  from fedjax_het.deploy import loopback
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("FEDJAX_HET_DATA_CACHE", "cache")
  lb = loopback.Loopback(str(tmp_path / "fed"), port=9999, insecure=True,
                         log=lambda s: None, env={"FEDJAX_HET_DATA": "../shared/data"})
  assert lb.env["FEDJAX_HET_DATA"] == os.path.abspath(tmp_path / ".." / "shared" / "data")
  assert lb.env["FEDJAX_HET_DATA_CACHE"] == str(tmp_path / "cache")
  assert all(os.stat(lb.path(d)).st_mode & 0o777 == 0o700
             for d in ("", "logs", "keys", "flwr_home"))
