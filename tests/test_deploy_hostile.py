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
def test_the_update_bound_clips_coordinates_then_the_norm_by_hand():
  """Updates (upload - payload) of 4 clients, bound B = 10, all values computed here."""
  sent = [np.array([100.0, 100.0, 100.0, 100.0], np.float32)]  # a large payload
  deltas = {0: [1.0, 0.0, 0.0, 0.0], 1: [0.0, 2.0, 0.0, 0.0], 2: [0.0, 0.0, 3.0, 0.0],
            3: [0.0, 0.0, 0.0, 1e6]}  # client 3 puts its budget in one coordinate
  ups = {c: [sent[0] + np.array(d, np.float32)] for c, d in deltas.items()}
  kept, why, norms = robust.bound_updates(ups, {c: sent for c in ups}, 10.0)
  assert norms == {0: 1.0, 1: 2.0, 2: 3.0, 3: 1e6}  # of the updates, not the parameters
  # peaks 1, 2, 3, 1e6: the lower median (2nd smallest of 4) is 2: coordinates to 20;
  # then norms 1, 2, 3, 20 (RMS 0.5, 1, 1.5, 10): reference 1 x sqrt(4) = 2, bound 20
  np.testing.assert_array_equal(kept[3][0], [100.0, 100.0, 100.0, 120.0])
  assert ("coordinates of 1 of 1 arrays clipped to 10 x the round's reference of their "
          "array (largest update 1e+06)") in why[3] and list(why) == [3]
  for c in (0, 1, 2):  # honest uploads: the very same arrays
    assert kept[c] is ups[c]
  # a norm over the bound without one large coordinate: scaled as a whole
  spread = {c: [np.eye(16)[0] * (c + 1)] for c in range(3)}  # norms 1, 2, 3
  spread[3] = [np.full(16, 15.0)]  # peak 15 < 10 x 2, norm 60 > 10 x 2
  kept, why, _ = robust.bound_updates(spread, {}, 10.0)
  np.testing.assert_allclose(kept[3][0], np.full(16, 5.0))  # scaled to norm 20
  assert "update norm 60 exceeds upload-norm-bound 10 x the round's reference 2" in why[3]
  kept, why, _ = robust.bound_updates(spread, {}, 10.0, "reject")
  assert sorted(kept) == [0, 1, 2] and list(why) == [3]
  # one outlier of two: the lower median is the honest one
  two = {0: [np.ones(4)], 3: [np.full(4, 1e30)]}
  kept, why, _ = robust.bound_updates(two, {}, 10.0)
  np.testing.assert_allclose(kept[3][0], np.full(4, 10.0))
  assert robust.bound_updates({0: two[3]}, {}, 10.0)[1] == {}  # no reference
  assert robust.bound_updates(spread, {}, 0.0)[1] == {}  # off


def test_3e38_in_float32_is_bounded_without_overflow():
  sent = [np.zeros(3, np.float32)]
  ups = {c: [np.full(3, 0.01 * (c + 1), np.float32)] for c in range(3)}
  ups[3] = [np.full(3, 3e38, np.float32)]
  kept, why, _ = robust.bound_updates(ups, {c: sent for c in ups}, 10.0)
  assert np.all(np.isfinite(kept[3][0])) and kept[3][0].dtype == np.float32
  assert np.max(np.abs(kept[3][0])) <= 10 * 0.02 + 1e-6 and list(why) == [3]


def test_the_influence_of_one_bounded_client_on_a_weighted_mean():
  """Client 3 sends 3e38 instead of its honest update h3: the weighted mean moves at most
  w3 / W x (B + 1) x M from the mean with h3 (M: the largest honest update norm)."""
  rng = np.random.default_rng(0)
  honest = {c: [rng.normal(size=50) * 0.1 * (c + 1)] for c in range(4)}
  weights = {0: 30.0, 1: 50.0, 2: 40.0, 3: 40.0}
  mean = lambda ups: sum(weights[c] * ups[c][0] for c in sorted(ups)) / 160.0
  attacked, why, _ = robust.bound_updates({**honest, 3: [np.full(50, 3e38)]}, {}, 10.0)
  moved = np.linalg.norm(mean(attacked) - mean(honest))
  largest = max(np.linalg.norm(u[0]) for u in honest.values())
  bound = 40.0 / 160.0 * 11.0 * largest
  assert robust.influence_bound(40.0, 160.0, 10.0, largest) == pytest.approx(bound)
  assert 0.1 * bound < moved <= bound, (moved, bound)
  assert list(why) == [3]
  unbounded = np.linalg.norm(mean({**honest, 3: [np.full(50, 3e38)]}) - mean(honest))
  assert unbounded > 1e37  # what the default bound prevents


def test_class_tables_counts_are_cut_and_rows_bounded_by_hand():
  """FedProto-shaped uploads of 4 clients, 2 classes, D = 2; client 3 sends 1e20."""
  ups = {c: [np.array([2.0, 1.0], np.float32),
             np.array([[1.0, 0.0], [0.0, 1.0]], np.float32) * (c + 1)] for c in range(3)}
  ups[3] = [np.array([1e20, 1e20], np.float32), np.full((2, 2), 1e20, np.float32)]
  known = {c: np.array([2.0, 1.0]) for c in range(4)}
  kept, why = robust.bound_tables(ups, known, 10.0)
  np.testing.assert_array_equal(kept[3][0], [2.0, 1.0])  # cut to what it holds
  # peaks 1, 2, 3, 1e20 -> values clipped to 10 x 2 = 20; row norms then 20 sqrt 2;
  # the clients' median row norms 1, 2, 3, 28.3: reference 2 -> rows to norm 20
  np.testing.assert_allclose(kept[3][1], np.full((2, 2), 20 / np.sqrt(2)), rtol=1e-6)
  assert "class counts cut to its known examples (2 classes; class 0: 1e+20 claimed, 2 held)" \
      in why[3] and list(why) == [3]
  for c in range(3):
    assert kept[c] is ups[c]
  # the aggregate's count-weighted rows stay finite and within the honest rows' reach
  counts = np.stack([kept[c][0] for c in range(4)]).astype(np.float32)
  means = np.stack([kept[c][1] for c in range(4)]).astype(np.float32)
  table = np.sum(counts[..., None] * means, 0) / np.sum(counts, 0)[:, None]
  assert np.all(np.isfinite(table)) and np.max(np.abs(table)) <= 20
  # without the cut, counts x means overflow float32 (a 1e20 FedProto table)
  raw = np.stack([ups[c][0] for c in range(4)])[..., None] * np.stack(
      [ups[c][1] for c in range(4)])
  assert not np.all(np.isfinite(raw))
  # only a total known (a data-less server): counts cut to it
  kept, why = robust.bound_tables({0: ups[0], 3: ups[3]}, {0: 3.0, 3: 3.0}, 0.0)
  assert np.sum(kept[3][0]) <= 3.0 + 1e-6 and "class counts cut" in why[3]


def test_trimmed_mean_trims_at_least_one_or_is_refused_at_start():
  assert [robust.trim_count(n, 0.1) for n in (1, 2, 3, 4, 9, 10, 20)] == [0, 0, 1, 1, 1, 1,
                                                                          2]
  with pytest.raises(ValueError) as err:
    robust.check_trim("trimmed-mean", 0.1, 4)
  assert str(err.value).count("\n") == 0 and "trims nothing from a round of 4 uploads " \
      "(floor(0.1 x 4) = 0)" in str(err.value)
  robust.check_trim("trimmed-mean", 0.25, 4)
  robust.check_trim("median", 0.1, 4)
  # 4 uploads, one of them 3e38: the trimmed mean keeps the middle two
  rows = [np.array([1.0]), np.array([2.0]), np.array([3.0]), np.array([3e38])]
  np.testing.assert_allclose(robust.robust_mean(rows, "trimmed-mean", 0.25), [2.5])


def test_an_unbounded_mean_is_named():
  assert "UNBOUNDED MEAN" in robust.unbounded_warning("mean", 0.0)
  assert robust.unbounded_warning("mean", 10.0) is None
  assert robust.unbounded_warning("median", 0.0) is None


def test_a_replayed_or_unechoed_reply_is_rejected():
  good = reply(UPLOAD)
  good.content.config_records[wire.RECORD]["nonce"] = "abc"
  good.content.config_records[wire.RECORD]["round"] = 2
  wire.read_upload(good, 1, LIKE, 10, nonce="abc", round_=2)
  with pytest.raises(fed_lib.UploadRejected, match="does not echo its message's nonce"):
    wire.read_upload(good, 1, LIKE, 10, nonce="def", round_=2)
  with pytest.raises(fed_lib.UploadRejected, match="is for round 2, not round 3"):
    wire.read_upload(good, 1, LIKE, 10, nonce="abc", round_=3)
  assert wire.new_nonce() != wire.new_nonce() and len(wire.new_nonce()) == 32


def test_coordinate_wise_median_and_trimmed_mean_by_hand():
  rows = [np.array([1.0, 10.0], np.float32), np.array([2.0, 20.0], np.float32),
          np.array([100.0, 0.0], np.float32), np.array([3.0, 30.0], np.float32)]
  np.testing.assert_allclose(robust.robust_mean(rows, "median"), [2.5, 15.0])
  # 4 rows, f = 0.25: one cut at each end per coordinate: mean of (2, 3) and (10, 20)
  np.testing.assert_allclose(robust.robust_mean(rows, "trimmed-mean", 0.25), [2.5, 15.0])
  # 3 rows and f = 0: still one cut at each end (at least one with 3 or more)
  np.testing.assert_allclose(robust.robust_mean(rows[:3], "trimmed-mean", 0.0),
                             [2.0, 10.0])
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


# ------------------------------------------------------------------ ancestors
@pytest.mark.parametrize("case", ["world-writable", "group-writable", "foreign-owned",
                                  "sticky", "foreign-owned symlink"])
def test_every_ancestor_of_a_deployment_folder_is_checked(tmp_path, case):
  """A neighbour's ``/tmp/fl`` (mode 0777, or theirs) refuses everything under it; a
  sticky one (as ``/tmp``) does not."""
  parent = tmp_path / "fl"
  os.mkdir(parent, 0o700)
  target = parent / "tls" / "nodes"
  if case == "foreign-owned symlink":
    if not ROOT:
      pytest.skip("chown to another user needs root")
    os.mkdir(tmp_path / "real", 0o700)
    os.symlink(tmp_path / "real", tmp_path / "link")
    os.lchown(tmp_path / "link", NOBODY, NOBODY)
    target = tmp_path / "link" / "tls"
  elif case == "foreign-owned":
    if not ROOT:
      pytest.skip("chown to another user needs root")
    os.chown(parent, NOBODY, NOBODY)
  else:
    os.chmod(parent, {"world-writable": 0o777, "group-writable": 0o770,
                      "sticky": 0o1777}[case])
  if case == "sticky":
    assert private.ensure_private(str(target)) == str(target)
    return
  with pytest.raises(private.InsecurePath) as err:
    private.ensure_private(str(target))
  message = str(err.value)
  assert "\n" not in message and message.startswith(f"refusing {target}: its parent ")
  assert {"world-writable": "without the sticky bit (mode 0777)",
          "group-writable": "without the sticky bit (mode 0770)",
          "foreign-owned": f"owned by uid {NOBODY}",
          "foreign-owned symlink": f"owned by uid {NOBODY}"}[case] in message
  assert not os.path.exists(parent / "tls")  # refused before anything was made


def test_intermediate_folders_are_made_0700_whatever_the_umask(tmp_path):
  old = os.umask(0o022)
  try:
    private.ensure_private(str(tmp_path / "a" / "b" / "c"))
  finally:
    os.umask(old)
  for path in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "c"):
    assert os.stat(path).st_mode & 0o777 == 0o700, path


def test_the_ca_folder_is_checked_before_its_key_is_read(tmp_path):
  tls = certs.make_tls(str(tmp_path / "tls"))
  certs.make_supernode_tls(tls, str(tmp_path / "nodes"), "client-0")  # friendly
  os.chmod(tmp_path / "tls", 0o777)  # a neighbour could have swapped ca.key
  with pytest.raises(private.InsecurePath, match="group- or world-writable"):
    certs.make_supernode_tls(tls, str(tmp_path / "nodes"), "client-1")
  os.chmod(tmp_path / "tls", 0o700)
  os.rename(tmp_path / "tls" / "ca.key", tmp_path / "ca.key")
  os.symlink(tmp_path / "ca.key", tmp_path / "tls" / "ca.key")  # a key elsewhere
  with pytest.raises(private.InsecurePath, match="not a regular file"):
    certs.make_supernode_tls(tls, str(tmp_path / "nodes"), "client-1")
  assert not os.path.exists(tmp_path / "nodes" / "client-1.crt")


def test_flower_certs_refuses_a_folder_under_a_neighbours_parent(tmp_path):
  """The attack: a neighbour made the documented parent first, mode 0777."""
  parent = tmp_path / "fl"
  os.mkdir(parent)
  os.chmod(parent, 0o777)
  script = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "experiments", "flower_certs.py")
  done = subprocess.run([sys.executable, script, f"--dir={parent / 'tls'}"],
                        capture_output=True, text=True, timeout=120)
  assert done.returncode != 0 and os.listdir(parent) == []
  lines = [x for x in done.stderr.splitlines() if x.strip()]
  assert len(lines) == 1 and f"its parent {parent}: it is group- or world-writable" in (
      lines[0]), done.stderr


def test_flower_142_has_no_message_size_flag_and_sends_replies_in_5_mib_objects():
  """Why the size bound cannot come before the transfer on flwr 1.42 (docs/deploy.md,
  "Size before transfer"): neither ``flower-superlink`` nor ``flower-supernode`` takes
  a maximum message size (gRPC's is fixed at 2^31 - 1 bytes), and a reply travels as
  separate objects (an array in chunks of 5 MiB), each its own gRPC message, so no such
  limit would bound a reply's total. A 16 MiB upload: 8 objects, none over 5 MiB + 20."""
  import importlib

  from flwr.supercore import grpc as flwr_grpc
  from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
  flower_superlink = importlib.import_module("flwr.superlink.cli.flower_superlink")
  flower_supernode = importlib.import_module("flwr.supernode.cli.flower_supernode")
  flags = [o for p in (flower_superlink._parse_args_run_superlink(),
                       flower_supernode._parse_args_run_supernode())
           for a in p._actions for o in a.option_strings]
  assert flags and not [f for f in flags if "message" in f or "size" in f], flags
  assert flwr_grpc.GRPC_MAX_MESSAGE_LENGTH == 2 ** 31 - 1
  values = np.random.default_rng(0).random(4 << 20, np.float32)  # 16 MiB, no repeats
  objects = get_all_nested_objects(reply([values]))
  sizes = sorted(len(o.deflate()) for o in objects.values())
  assert sum(sizes) > 16 << 20 and sizes[-1] <= (5 << 20) + 20, sizes
