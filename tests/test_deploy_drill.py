"""The adversarial drill at default settings, in one process (``FakeGrid``).

4 tiny clients, 3 rounds, one hostile client per case (``NodeSettings.fault``): every
floating-point value 3e38 (FedAvg, FedMRL: ``flood``), a FedProto table of 1e20 counts
and means (``overflow``), its previous reply replayed (``replay``), every test example
claimed correct (``inflate``). In every case the run completes every round, no honest
client is named in a failure, clip or bench line, the log names the attacker, and the
final server state stays within the stated bound of the same run without the attacker
(the same client honest), computed here in numpy from the clean run.
"""
import numpy as np
import pytest

from fedjax_het.deploy import federation as fed_lib

flower = pytest.importorskip("fedjax_het.deploy.flower")
from fake_grid import run_deployed  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedjax_het.deploy import robust  # noqa: E402

ATTACKER, ROUNDS, CLIENTS = 1, 3, 4
B = robust.DEFAULT_BOUND
CASES = {  # case: (algorithm, fault, what the log says of the attacker)
    "fedavg-3e38": ("fedavg", "flood", f"client {ATTACKER}'s upload clipped: "),
    "fedmrl-3e38": ("fedmrl", "flood", f"client {ATTACKER}'s upload clipped: "),
    "fedproto-1e20": ("fedproto", "overflow",
                      f"client {ATTACKER}'s upload clipped: class counts cut"),
    "replay": ("fedavg", "replay", f"client {ATTACKER} failed: the reply is for round"),
    "inflate": ("fedavg", "inflate", f"client {ATTACKER} reports all its"),
}


pytestmark = [
    pytest.mark.usefixtures("compile_bound"),  # both runs of a case at level 0
    pytest.mark.xdist_group("drill"),  # one worker: the clean runs are shared
]


@pytest.fixture(autouse=True)
def task_identity(monkeypatch):
  for k in ("_run_id", "_node_id", "_task_id"):
    monkeypatch.setattr(TaskIdentity, k, 7)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_npz):
  """{name: (server, logs)} of each algorithm's clean run and each case's attacked one,
  run once for the module (runs are the cost)."""
  from conftest import make_tiny_config
  root = tmp_path_factory.mktemp("drill")
  done = {}

  def run(name, algorithm, fault=""):
    if name not in done:
      c = make_tiny_config(tiny_npz, algorithm, "tiny",
                           {"num_clients": CLIENTS, "num_rounds": ROUNDS})
      c.runtime.num_devices = 1
      c.eval_every = ROUNDS  # one evaluation, after the last round: messages are the cost
      faults = {ATTACKER: ",".join(f"{fault}@{r}" for r in range(1, ROUNDS + 1))} \
          if fault else {}
      server, _, logs = run_deployed(c, root, faults=faults, workdir=name)
      done[name] = (server, logs)
    return done[name]
  return run


def final_state(server):
  return [np.asarray(a, np.float64) for a in fed_lib.encode(server.node.state.server)]


def distance(a, b):
  return float(np.sqrt(sum(np.sum(np.square(x - y)) for x, y in zip(a, b))))


@pytest.mark.parametrize("case", list(CASES))
def test_one_hostile_client_at_default_settings(runs, case):
  algorithm, fault, named = CASES[case]
  clean, clean_logs = runs(f"clean-{algorithm}", algorithm)
  server, logs = runs(case, algorithm, fault)
  text = "\n".join(logs)
  # the run completes every round, every honest client's upload in every round
  assert server.node.round == ROUNDS and server.rows.rows[-1]["round"] == ROUNDS, text
  for r in range(1, ROUNDS + 1):
    kept = CLIENTS - (fault == "replay" and r > 1)  # a replay: its client's failure
    assert f"round {r}: aggregated {kept} uploads ({CLIENTS - kept} failed)" in text, text
  # the log names the attacker, and never an honest client
  assert named in text, text
  print(f"{case}: {next(line for line in logs if named in line)[:200]}")
  for h in set(range(CLIENTS)) - {ATTACKER}:
    for blame in (f"client {h} failed", f"client {h}'s upload clipped",
                  f"client {h} benched", f"client {h} reports all"):
      assert blame not in text, (blame, text)
  assert not [line for line in clean_logs if "clipped" in line or "failed:" in line]
  # the final model within the stated bound of the run without the attacker
  att, ref = final_state(server), final_state(clean)
  assert all(np.all(np.isfinite(a)) for a in att)
  moved = distance(att, ref)
  if fault == "inflate":
    assert moved == 0.0  # a claim about accuracy moves no model
    return
  fed = clean.node.fed
  weights = {c: fed_lib.expected_counts(fed, c)[0] for c in range(CLIENTS)}
  share = weights[ATTACKER] / sum(weights.values())
  if algorithm == "fedproto":
    # every aggregated row a count-weighted mean of bounded rows: per class j and round,
    # the attacker's share n_aj / N_j of (B + 1) x the largest honest row norm (here
    # the clean final table's), summed over the rounds
    counts = np.stack([fed_lib.expected_class_counts(fed, c) for c in range(CLIENTS)])
    shares = counts[ATTACKER] / counts.sum(0)
    table, clean_table = att[0], ref[0]  # leaves: 'table' [C, D], 'valid' [C]
    largest = float(np.max(np.sqrt(np.sum(np.square(clean_table), -1))))
    per_row = np.sqrt(np.sum(np.square(table - clean_table), -1))
    bound = ROUNDS * shares * (B + 1) * largest
    print(f"{case}: row distances {np.round(per_row, 4)}, bounds {np.round(bound, 4)}")
    assert np.all(per_row <= bound + 1e-6), (per_row, bound)
    return
  norms = clean.round_norms
  bound = sum(share * (B + 1) * max(norms[r].values()) for r in range(1, ROUNDS + 1))
  print(f"{case}: final model {moved:.4g} from the clean run's; stated bound {bound:.4g}"
        f" (share {share:.3f}, largest update norms "
        f"{[round(max(norms[r].values()), 4) for r in range(1, ROUNDS + 1)]})")
  assert 0 < moved <= bound, (moved, bound)
