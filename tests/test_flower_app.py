"""The Flower App in one process: upload checks, identities, settings, certificates, and
the ServerApp's rounds over a fake ``Grid`` that hands every message to the ClientApp.

The federations of real Flower processes are in test_deploy_flower.py.
"""
import json
import os
import re
import types

import jax
import numpy as np
import pytest

from fedjax_het.deploy import federation as fed_lib
from fedjax_het.deploy import robust

flower = pytest.importorskip("fedjax_het.deploy.flower")
from fake_grid import run_deployed  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedjax_het.deploy import certs  # noqa: E402
from fedjax_het.deploy import loopback  # noqa: E402
from fedjax_het.deploy import roster as roster_lib  # noqa: E402
from fedjax_het.training import loop  # noqa: E402
from fedjax_het.training import metrics as metrics_lib  # noqa: E402

UploadRejected = fed_lib.UploadRejected
LIKE = {"w": jax.ShapeDtypeStruct((2, 3), np.float32), "n": jax.ShapeDtypeStruct((3,),
                                                                                 np.int32)}
GOOD = [np.arange(3, dtype=np.int32), np.ones((2, 3), np.float32)]  # leaves: n, w


def check(arrays, claimed=1, headers=None, like=LIKE):
  """``check_upload`` of client 1 on numpy ``arrays`` (headers as received)."""
  calls = []

  def load():
    calls.append(1)
    return arrays
  try:
    return fed_lib.check_upload(1, claimed, headers or fed_lib.headers_of(arrays), load,
                                like)
  finally:
    check.loaded = bool(calls)


# ------------------------------------------------------------------ transport-free checks
def test_a_good_upload_decodes():
  tree = check(GOOD)
  np.testing.assert_array_equal(tree["w"], np.ones((2, 3)))
  np.testing.assert_array_equal(tree["n"], [0, 1, 2])


@pytest.mark.parametrize("arrays,claimed,headers,message,loaded", [
    # a reply speaking for another client: refused before anything is read
    (GOOD, 2, None, "claims to come from client 2", False),
    # larger than the upload: refused on the byte count alone
    (GOOD + [np.zeros(1000, np.float32)], 1, None, "bytes received", False),
    (GOOD[:1], 1, None, "1 arrays received; expected 2", False),
    (GOOD, 1, [fed_lib.ArrayHeader("int32", (3,), 12),
               fed_lib.ArrayHeader("float32", (3, 2), 24)],
     r"array 1: declared float32\[3, 2\], expected float32\[2, 3\]", False),
    (GOOD, 1, [fed_lib.ArrayHeader("int32", (3,), 12),
               fed_lib.ArrayHeader("float64", (2, 3), 48)], "declared float64", False),
    # the header says one thing, the decoded bytes another
    ([GOOD[0], np.ones((3, 2), np.float32)], 1,
     fed_lib.headers_of(GOOD), "does not decode", True),
    ([GOOD[0], np.full((2, 3), np.nan, np.float32)], 1, None, "non-finite", True),
    ([GOOD[0], np.full((2, 3), -np.inf, np.float32)], 1, None, "non-finite", True),
])
def test_a_malformed_upload_is_rejected(arrays, claimed, headers, message, loaded):
  with pytest.raises(UploadRejected, match=message):
    check(arrays, claimed, headers)
  assert check.loaded == loaded  # size and shape checks come before any decoding


def test_the_size_bound_is_the_upload_plus_framing():
  assert fed_lib.upload_bytes(LIKE) == 36
  bound = 36 + 2 * fed_lib.ARRAY_OVERHEAD_BYTES
  ok = [fed_lib.ArrayHeader("int32", (3,), 12 + 1000),
        fed_lib.ArrayHeader("float32", (2, 3), bound - 1012)]
  check(GOOD, headers=ok)
  with pytest.raises(UploadRejected, match=f"{bound + 1} bytes received"):
    check(GOOD, headers=[ok[0], fed_lib.ArrayHeader("float32", (2, 3), bound - 1011)])


def test_weights_counts_and_metrics_are_checked():
  assert fed_lib.check_weight(5, 5) == 5 and fed_lib.check_weight(np.int64(7), None) == 7
  for bad, expected, message in [(0, None, "positive"), (-3, None, "positive"),
                                 (2.5, None, "positive"), (True, None, "positive"),
                                 (10 ** 9, 40, "differs from the client's 40")]:
    with pytest.raises(UploadRejected, match=message):
      fed_lib.check_weight(bad, expected)
  assert fed_lib.check_counts(3, 8, 8) == (3, 8)
  for correct, total, expected in [(9, 8, None), (-1, 8, None), (3, 9, 8), (3.0, 8, 8)]:
    with pytest.raises(UploadRejected):
      fed_lib.check_counts(correct, total, expected)
  assert fed_lib.check_metrics({"loss": 2, "acc": 0.5}) == {"loss": 2.0, "acc": 0.5}
  with pytest.raises(UploadRejected, match="'loss'=nan"):
    fed_lib.check_metrics({"loss": float("nan")})


@pytest.mark.parametrize("claimed,name,taken,message", [
    (1, "client-1", {}, None),
    (1, "", {}, None),  # no registered name (no authentication): trusted as it says
    (2, "client-1", {}, "registered as 'client-1'"),
    (4, "client-4", {}, r"not one of \[0, 4\)"),
    ("1", "", {}, "not one of"),
    (1, "client-1", {1: 77}, "already served by SuperNode 77"),
])
def test_admission(claimed, name, taken, message):
  why = flower.admission(claimed, name, 4, taken)
  assert why is None if message is None else re.search(message, why), why


# ------------------------------------------------------------------ settings
def test_run_and_node_config():
  s = flower.ServerSettings.from_run_config({"config": "c.py:smoke", "workdir": "/w",
                                             "round-timeout": 30, "fresh-start": True})
  assert (s.round_timeout, s.fresh_start, s.min_fit_clients) == (30.0, True, 0)
  with pytest.raises(ValueError, match="unknown run config key 'rounds'"):
    flower.ServerSettings.from_run_config({"rounds": 1})
  with pytest.raises(ValueError, match="needs config"):
    flower.ServerSettings.from_run_config({"workdir": "/w"})
  with pytest.raises(ValueError, match="fresh-start=.yes. must be a bool"):
    flower.ServerSettings.from_run_config({"config": "c", "workdir": "w",
                                           "fresh-start": "yes"})
  n = flower.NodeSettings.from_node_config({"client-id": 2, "workdir": "/n",
                                            "fault": "nan@1,kill@3"})
  assert n.client_id == 2 and flower.parse_faults(n.fault) == {1: "nan", 3: "kill"}
  with pytest.raises(ValueError, match="needs client-id"):
    flower.NodeSettings.from_node_config({"workdir": "/n"})
  with pytest.raises(ValueError, match="is not kind@round"):
    flower.parse_faults("explode@1")


def test_config_file_and_overrides_as_the_command_line_gives_them(tmp_path):
  spec = "experiments/fedmrl.py:smoke"
  argv = ["x", f"--config={spec}", "--config.num_clients=3", "--config.data.path=/a b",
          "--config.algo.use_mrl=False", "--config.learning_rate=0.5"]
  overrides = flower.overrides_of(argv)
  assert flower.parse_overrides(overrides) == {
      "num_clients": "3", "data.path": "/a b", "algo.use_mrl": "False",
      "learning_rate": "0.5"}
  c = flower.load_config(spec, overrides)
  assert (c.num_clients, c.data.path, c.algo.use_mrl, c.learning_rate) == (3, "/a b",
                                                                            False, 0.5)
  with pytest.raises(ValueError, match="unknown config key 'num_client'"):
    flower.load_config(spec, "num_client=3")
  with pytest.raises(ValueError, match="num_clients='x'"):
    flower.load_config(spec, "num_clients=x")


def test_throwaway_certificates_chain_and_node_keys(tmp_path):
  from cryptography import x509
  from cryptography.hazmat.primitives.asymmetric import ec
  from cryptography.hazmat.primitives.serialization import load_ssh_private_key
  from cryptography.hazmat.primitives.serialization import load_ssh_public_key
  tls = certs.make_tls(str(tmp_path / "tls"))
  ca = x509.load_pem_x509_certificate(open(tls.ca_cert, "rb").read())
  server = x509.load_pem_x509_certificate(open(tls.server_cert, "rb").read())
  server.verify_directly_issued_by(ca)
  san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
  assert san.get_values_for_type(x509.DNSName) == ["localhost"]
  assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
  assert (tmp_path / "tls" / "server.key").stat().st_mode & 0o777 == 0o600
  key = certs.make_node_key(str(tmp_path / "keys"), "client-0")
  private = load_ssh_private_key(open(key.private_key, "rb").read(), None)
  public = load_ssh_public_key(open(key.public_key, "rb").read())
  assert isinstance(private.curve, ec.SECP384R1)
  assert private.public_key().public_numbers() == public.public_numbers()


# ------------------------------------------------------------------ ServerApp over a fake grid
@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
  """What a ServerApp process knows about itself (Flower sets it before ``main``)."""
  for k in ("_run_id", "_node_id", "_task_id"):
    monkeypatch.setattr(TaskIdentity, k, 7)


@pytest.fixture
def deployed(tiny_config, tmp_path):
  """Runs the ServerApp (``FlowerServer``) for FedAvg on tiny clients over a FakeGrid.

  ``deployed(faults={client: fault}, silent=[client], names={client: name}, **settings)``
  returns (server, grid, log lines).
  """
  c = tiny_config("fedavg", "tiny", {"num_clients": 4, "num_rounds": 2})
  c.runtime.num_devices = 1

  def run(faults=None, silent=(), names=None, config=c, workdir="server", **settings):
    return run_deployed(config, tmp_path, faults=faults, silent=silent, names=names,
                        workdir=workdir, **settings)
  return run


@pytest.fixture
def threefry():
  """JAX's default keys: with conftest's 'unsafe_rbg', draws under vmap (the simulator's init)
  differ from the same draws one key at a time (a ClientNode's)."""
  previous = jax.config.jax_default_prng_impl
  jax.config.update("jax_default_prng_impl", "threefry2x32")
  yield
  jax.config.update("jax_default_prng_impl", previous)


def test_a_resumed_server_app_equals_the_simulator(deployed, tiny_config, tmp_path,
                                                  threefry):
  c = tiny_config("fedavg", "tiny", {"num_clients": 4, "num_rounds": 1})
  c.runtime.num_devices = 1
  deployed(config=c)  # the run stops after round 1 (its checkpoint) ...
  c.num_rounds = 2
  server, grid, logs = deployed(config=c)  # ... and is resubmitted with 2 rounds
  assert [m.metadata.group_id for m in grid.sent if m.metadata.message_type == "train"
          ] == ["2"] * 4  # it resumed
  assert grid.sent[0].metadata.message_type == "query"
  loop.run(c, str(tmp_path / "sim"), log=lambda s: None)
  deployed_rows = server.rows.rows
  simulated = metrics_lib.read_jsonl(str(tmp_path / "sim" / "metrics.jsonl"))
  assert [r["round"] for r in deployed_rows] == [1, 2]
  for d, s in zip(deployed_rows, simulated):
    assert d["mean_test_acc"] == pytest.approx(s["mean_test_acc"], abs=1e-6)
    assert d["train_loss"] == pytest.approx(s["train_loss"], rel=1e-5)
    assert (d["uplink_params"], d["downlink_params"]) == (s["uplink_params"],
                                                          s["downlink_params"])
    assert (d["clients_trained"], d["clients_failed"], d["clients_evaluated"]) == (4, 0, 4)
  assert server.node.ckpt.steps()[-1] == 2
  # the default bound is on, and an honest run never meets it
  assert logs[0].startswith("server: aggregation mean; updates bounded by 10 x")
  assert not [line for line in logs if "clipped" in line or "failed:" in line]


def test_malformed_uploads_and_silent_clients_are_their_failures(deployed, monkeypatch):
  # the exchanges wait on a clock of our own: its sleeps advance it, no wall clock counts
  clock = [0.0]

  def sleep(seconds):
    clock[0] += seconds
  monkeypatch.setattr(roster_lib, "time", types.SimpleNamespace(monotonic=lambda: clock[0],
                                                                sleep=sleep))
  server, _, logs = deployed(faults={0: "oversize@1", 1: "nan@1", 2: "impersonate@2"},
                             silent=[3], min_fit_clients=1, round_timeout=600,
                             straggler_timeout=0.5)
  # the silent client held round 1 up the straggler timeout's 0.5 s, not the round
  # timeout's 600
  assert 0.5 <= clock[0] < 5, clock[0]
  rows = server.rows.rows
  assert [(r["clients_trained"], r["clients_failed"], r["clients_evaluated"])
          for r in rows] == [(1, 3, 3), (2, 1, 3)]
  text = "\n".join(logs)
  assert "round 1: client 0 failed: " in text and "bytes received" in text
  assert "round 1: client 1 failed: array 0 holds non-finite values" in text
  assert "round 1: client 3 failed: no reply within round-timeout" in text
  assert "client 3 did not answer; skipped until its SuperNode reconnects" in text
  assert "round 2: client 2 failed: the reply to client 2 claims to come from client 3" in (
      text)
  assert all(np.all(np.isfinite(a)) for a in fed_lib.encode(server.node.state.server))


def test_too_few_uploads_retry_the_round_then_fail(deployed):
  with pytest.raises(RuntimeError, match=r"round 1 was not aggregated in 2 attempts "
                     r"\(fewer than the quorum of 4 uploads"):
    deployed(faults={2: "shape@1"}, round_attempts=2, min_fit_clients=-1)  # all of them


def test_the_default_quorum_is_half_of_the_clients_sent_a_message():
  s = flower.ServerSettings(config="c", workdir="w")
  assert [s.quorum(n) for n in (1, 2, 3, 4, 5)] == [1, 1, 2, 2, 3]
  assert flower.ServerSettings(config="c", workdir="w", min_fit_clients=-1).quorum(5) == 5
  assert flower.ServerSettings(config="c", workdir="w", min_fit_clients=2).quorum(5) == 2


def test_a_node_posing_as_another_client_is_refused(deployed):
  server, grid, logs = deployed(names={3: "client-1"}, min_fit_clients=3)
  assert "registered as 'client-1'" in server.roster.refused[103]
  assert not [m for m in grid.sent if m.metadata.dst_node_id == 103
              and m.metadata.message_type == "train"]
  assert [r["clients_trained"] for r in server.rows.rows] == [3, 3]


def test_loopback_files_and_the_insecure_banner(tmp_path):
  logs = []
  lb = loopback.Loopback(str(tmp_path / "secure"), port=9999, log=logs.append)
  conf = open(lb.path("flwr_home", "config.toml")).read()
  assert 'address = "127.0.0.1:9999"' in conf and "root-certificates" in conf
  assert os.path.exists(lb.tls.server_key) and not logs
  lb = loopback.Loopback(str(tmp_path / "insecure"), port=9999, insecure=True,
                         log=logs.append)
  assert logs == [loopback.INSECURE_BANNER] and lb.tls is None
  assert "insecure = true" in open(lb.path("flwr_home", "config.toml")).read()
  assert loopback.node_config({"client-id": 2, "workdir": "/a b", "fault": "nan@1"}) == (
      'client-id=2 workdir="/a b" fault="nan@1"')


def test_loopback_processes_import_from_the_launchers_directory(tmp_path, monkeypatch):
  """A config naming the user's own code imports it in processes that run in workdir."""
  monkeypatch.setenv("PYTHONPATH", "/elsewhere")
  monkeypatch.chdir(tmp_path)
  lb = loopback.Loopback(str(tmp_path / "fed"), port=9999, insecure=True,
                         log=lambda s: None)
  assert lb.env["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), "/elsewhere"]
  lb = loopback.Loopback(str(tmp_path / "fed"), port=9999, insecure=True,
                         log=lambda s: None, import_dir="/mine")
  assert lb.env["PYTHONPATH"].split(os.pathsep)[0] == "/mine"


def test_a_failed_run_names_its_exception(tmp_path):
  lb = loopback.Loopback(str(tmp_path), port=9999, insecure=True, log=lambda s: None)
  assert lb.failure(7) is None
  with open(lb.path("logs", "run-7.log"), "w") as f:
    f.write("Traceback (most recent call last):\n  File \"x.py\", line 1\n"
            "ValueError: config.algorithm='examples.fedprox:SPEC': module cannot be "
            "imported\n\x1b[91mERROR \x1b[0m:     Exit Code: 201\n")
  assert lb.failure(7) == ("ValueError: config.algorithm='examples.fedprox:SPEC': module "
                           "cannot be imported")


def test_orphaned_runs_are_stopped_unless_they_finished_meanwhile(tmp_path):
  """``Loopback.stop_orphaned_runs`` on canned ``flwr`` replies (Flower 1.42's texts): a
  stop refused because the run finished between its check and the stop ("couldn't be
  stopped", seen in a clean clone's CI) is no error when the run's status says finished."""
  lb = loopback.Loopback(str(tmp_path), port=9999, insecure=True, log=lambda s: None)
  runs = {1: "running", 2: "pending", 3: "running", 4: "finished:completed"}
  stops = {1: (0, "Run 1 successfully stopped."), 2: (1, "Run is already finished"),
           3: (1, "Run 3 couldn't be stopped.")}
  finished_meanwhile = {3: "finished:failed"}  # by the SuperLink, before the stop
  stopped = []

  def flwr(*args, check=True):
    del check
    if args[0] == "stop":
      run_id = int(args[1])
      stopped.append(run_id)
      runs[run_id] = finished_meanwhile.get(run_id, runs[run_id])
      code, text = stops[run_id]
      return types.SimpleNamespace(returncode=code, stdout=text, stderr="")
    listed = [{"run-id": str(k), "status": v} for k, v in runs.items()
              if "--run-id" not in args or str(k) == args[args.index("--run-id") + 1]]
    return types.SimpleNamespace(returncode=0, stdout=json.dumps({"runs": listed}),
                                 stderr="")

  lb.flwr = flwr
  assert lb.stop_orphaned_runs() == [1]
  assert stopped == [1, 2, 3]  # not run 4, finished before
  runs.update({1: "finished:stopped", 2: "finished:completed", 3: "running"})
  finished_meanwhile.clear()  # refused, and still running: an error
  with pytest.raises(RuntimeError, match="flwr stop 3 failed"):
    lb.stop_orphaned_runs()


def test_robust_aggregation_norm_clipping_and_the_bench(deployed):
  """Median aggregation over a clipped 1e30-times upload, and a client benched for a
  round after its bytes were rejected (bench-after 1)."""
  server, grid, logs = deployed(faults={0: "scaled@1,scaled@2", 3: "zip@1"},
                                aggregation="median", upload_norm_bound=5.0,
                                upload_norm_action="clip", bench_after=1, bench_rounds=1,
                                min_fit_clients=2)
  text = "\n".join(logs)
  assert "round 1: client 0's upload clipped: " in text
  assert "x the round's reference" in text
  assert "round 1: client 3 failed: does not decode: array 0: not .npy bytes" in text
  assert ("round 1: client 3 benched until round 2 (not drawn in rounds 2-2): its uploads "
          "were rejected 1 rounds running") in text
  assert "round 2: training 3 of 4 drawn clients (benched: [3])" in text
  assert not [m for m in grid.sent if m.metadata.dst_node_id == 103
              and m.metadata.message_type == "train" and m.metadata.group_id == "2"]
  assert [(r["clients_trained"], r["clients_failed"]) for r in server.rows.rows] == [
      (3, 1), (3, 0)]
  leaves = fed_lib.encode(server.node.state.server)
  assert all(np.all(np.isfinite(a)) and np.max(np.abs(a)) < 1e3 for a in leaves)


def test_a_non_finite_server_state_is_neither_adopted_nor_checkpointed(deployed):
  server, _, _ = deployed()
  node = server.node
  before = fed_lib.encode(node.state.server)
  like = node.upload_like[0]
  # uploads straight to the aggregate (no check_upload): whatever made the new state
  # non-finite (an upload, an algorithm's division), it is refused
  bad = fed_lib.encode(jax.tree.map(lambda s: np.full(s.shape, np.inf, s.dtype), like))
  with pytest.raises(fed_lib.NonFiniteState, match="holds non-finite values in"):
    node.aggregate({0: (bad, 40), 1: (bad, 40)})
  assert all(np.array_equal(a, b) for a, b in zip(fed_lib.encode(node.state.server),
                                                   before))  # kept
  # finite but beyond robust.STATE_BOUND (a 3e38 model, finite in float32): refused alike
  big = fed_lib.encode(jax.tree.map(lambda s: np.full(s.shape, 3e38, s.dtype), like))
  with pytest.raises(fed_lib.NonFiniteState, match=r"holds values beyond 1e\+10 in"):
    node.aggregate({0: (big, 40), 1: (big, 40)})
  steps = node.ckpt.steps()
  node.state = node.state.replace(server=jax.tree.map(lambda a: a * np.nan,
                                                       node.state.server))
  with pytest.raises(fed_lib.NonFiniteState, match="not checkpointed"):
    node.save({})
  assert node.ckpt.steps() == steps


def test_a_resumed_run_sets_a_poisoned_checkpoint_aside(deployed, tmp_path):
  """A checkpoint written before these checks (3e38 everywhere, as an unbounded mean left
  it) is set aside, not resumed and not deleted; with none left the run refuses."""
  server, _, _ = deployed()
  node = server.node
  fed, workdir = node.fed, node.workdir
  node.ckpt = fed_lib.ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                                            max_to_keep=3,
                                            fingerprint=fed_lib.fingerprint(fed))
  poisoned = node.state.replace(round=node.state.round + 1, server=jax.tree.map(
      lambda a: np.full(a.shape, 3e38, a.dtype) if np.issubdtype(a.dtype, np.floating)
      else a, node.state.server))
  node.ckpt.save(3, poisoned, {"round": 3})  # straight to disk: no check
  node.ckpt.close()
  resumed = fed_lib.ServerNode(fed, workdir)
  try:
    assert resumed.round == 2
    assert len(resumed.repairs) == 1 and resumed.repairs[0].startswith(
        "checkpoint of round 3 holds values beyond 1e+10 in")
    assert os.path.isdir(os.path.join(workdir, "checkpoints.corrupted", "3"))
  finally:
    resumed.close()
  ckpt = fed_lib.ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints"),
                                       max_to_keep=3, fingerprint=fed_lib.fingerprint(fed))
  for step in ckpt.steps():  # only poisoned checkpoints left
    ckpt.manager.delete(step)
  ckpt.save(3, poisoned, {"round": 3})
  ckpt.close()
  with pytest.raises(fed_lib.NonFiniteState, match=r"refusing to resume: every checkpoint "
                     r"\(\[3\]\)"):
    fed_lib.ServerNode(fed, workdir)


def test_an_explicit_unbounded_mean_is_named_and_survives_a_3e38_client(deployed):
  """A 3e38 client with the bound turned off: the first line says so, the poisoned
  aggregate is not adopted, leaving each upload out finds client 0, the others go on,
  and no honest client is blamed."""
  server, _, logs = deployed(faults={0: "flood@1"}, upload_norm_bound=0.0)
  assert logs[0].startswith("server: WARNING: UNBOUNDED MEAN (aggregation=mean, "
                            "upload-norm-bound=0)")
  text = "\n".join(logs)
  assert "round 1: not adopted: the aggregated server state holds values beyond" in text
  assert ("round 1: client 0 failed: the aggregate with its upload fails the server's "
          "checks, without it passes; aggregated the others") in text
  assert "round 1: aggregated 3 uploads (1 failed)" in text
  assert "round 2: aggregated 4 uploads (0 failed)" in text
  assert not [line for line in logs if re.search(r"client [123] (failed|benched)", line)]
  assert max(float(np.max(np.abs(a))) for a in fed_lib.encode(server.node.state.server)
             ) < 1e3


def test_a_trimmed_mean_that_trims_nothing_is_refused_at_start(deployed):
  with pytest.raises(ValueError, match=r"trim-fraction 0.1 trims nothing from a round of "
                     r"4 uploads"):
    deployed(aggregation="trimmed-mean")


def test_a_plug_in_that_averages_gets_robust_aggregation(deployed, tiny_config,
                                                         monkeypatch):
  """examples/fedprox.py's Spec says it averages: its deployment takes the median rule and
  aggregates the round's uploads by it (``robust.robust_uploads``), where FD is refused."""
  calls = []
  robust_uploads = robust.robust_uploads

  def recorded(uploads, aggregation, *args, **kwargs):
    calls.append((sorted(uploads), aggregation))
    return robust_uploads(uploads, aggregation, *args, **kwargs)
  monkeypatch.setattr(robust, "robust_uploads", recorded)
  c = tiny_config("fedavg", "tiny", {"num_clients": 3, "num_rounds": 1})
  c.algorithm = "examples.fedprox:SPEC"
  c.runtime.num_devices = 1
  server, _, logs = deployed(config=c, aggregation="median", min_fit_clients=3)
  assert "round 1: aggregated 3 uploads (0 failed)" in "\n".join(logs)
  assert calls == [([0, 1, 2], "median")]
  assert all(np.all(np.isfinite(a)) for a in fed_lib.encode(server.node.state.server))


def test_a_robust_rule_is_refused_where_the_server_does_not_average(deployed, tiny_config):
  c = tiny_config("fd", "tiny", {"num_clients": 4, "num_rounds": 1})
  c.runtime.num_devices = 1
  with pytest.raises(ValueError, match="'fd' takes only 'mean'"):
    deployed(config=c, aggregation="median")
