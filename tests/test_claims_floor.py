"""No verdict against a side that did not learn: hand-made runs and partitions whose floor
(per client the better of guessing from its label shares and always answering its
commonest class, on its own test set; the mean over clients) is worked out here by hand,
and a hand-made ledger whose verdicts and counts are known."""
import json
import math
import os

import numpy as np
import pytest

from fedjax_het.sweeps import claim_runs
from fedjax_het.sweeps import claims
from fedjax_het.sweeps import claims_page
from fedjax_het.sweeps import verdicts

# Four clients (classes 0-2 of 10), (train counts, test counts):
#  0: train 6, 2      test 3, 1   shares (.75, .25) both: guess .75^2 + .25^2 = .625,
#                                 commonest (class 0) .75                -> .75
#  1: train 2, 2, 4   test 1, 3   p (.25, .25, .5), q (.25, .75, 0): guess .0625 + .1875
#                                 = .25; commonest (class 2) 0           -> .25
#  2: train 3, 3      test 1, 3   guess .5 .25 + .5 .75 = .5; commonest a tie of
#                                 classes 0 and 1: the mean of .25, .75 = .5 -> .5
#  3: train 5         no test     scores 0, as its accuracy does           -> 0
# means over clients: guess (.625 + .25 + .5) / 4 = .34375, commonest (.75 + 0 + .5)
# / 4 = .3125, floor (.75 + .25 + .5 + 0) / 4 = .375 (not the better of the means)
CLIENTS = [([6, 2], [3, 1]), ([2, 2, 4], [1, 3]), ([3, 3], [1, 3]), ([5], [])]
GUESS, COMMONEST, FLOOR = 0.34375, 0.3125, 0.375


def _counts(counts):
  return list(counts) + [0] * (10 - len(counts))


def _partition(workdir, clients=CLIENTS):
  with open(os.path.join(workdir, "partition.json"), "w") as f:
    json.dump({"clients": [{"client": i, "arch": "tiny",
                            "train_class_counts": _counts(tr),
                            "test_class_counts": _counts(te)}
                           for i, (tr, te) in enumerate(clients)]}, f)


def _run(root, sweep, method, setting, seed, accs, *, per_client=None, config=None,
         extra=None, clients=CLIENTS):
  """A finished run: mean test accuracy ``accs[t - 1]`` at round t, the partition."""
  workdir = os.path.join(root, sweep, method, setting, f"seed{seed}")
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({"algorithm": method, "seed": seed, **(config or {})}, f)
  rows = [{"round": t, "mean_test_acc": a, **((extra or {}).get(t, {}))}
          for t, a in enumerate(accs, start=1)]
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  with open(os.path.join(workdir, "summary.json"), "w") as f:
    json.dump({"per_client_test_acc": per_client or [accs[-1]] * len(clients)}, f)
  _partition(workdir, clients)
  return workdir


def _side(root, method, finals, rounds=3, setting="cell", sweep="s", **kw):
  for seed, final in enumerate(finals):
    _run(root, sweep, method, setting, seed, [0.8] * (rounds - 1) + [final], **kw)


def test_the_floor_is_the_better_rate_per_client_averaged_over_clients(tmp_path):
  workdir = _run(str(tmp_path), "s", "m", "cell", 0, [0.5])
  guess, commonest, floor = verdicts.floor_rates(workdir)
  assert (guess, commonest, floor) == (pytest.approx(GUESS), pytest.approx(COMMONEST),
                                       pytest.approx(FLOOR))
  assert verdicts.client_rates(_counts([6, 2]), _counts([3, 1])) == (
      pytest.approx(0.625), pytest.approx(0.75))
  assert verdicts.client_rates(_counts([5]), _counts([])) == (0.0, 0.0)
  assert all(math.isnan(v) for v in verdicts.floor_rates(str(tmp_path)))  # none


@pytest.mark.parametrize("finals,expected", [
    # accuracy minus floor (37.5%) per seed, in points: its mean against one s.e.
    ((0.385, 0.375, 0.395), "reproduced"),     # +1, 0, +2: 1 > 1/sqrt(3)
    ((0.380, 0.375, 0.375), "uninformative"),  # +.5, 0, 0: mean 1/6 = its s.e.
    ((0.370, 0.360, 0.390), "uninformative"),  # below on average
    ((0.600, 0.600, 0.600), "reproduced"),
])
def test_a_side_within_a_standard_error_of_its_floor_has_no_verdict(tmp_path, finals,
                                                                    expected):
  root = str(tmp_path)
  _side(root, "good", (0.9, 0.9, 0.9))
  _side(root, "base", finals)
  claim = claims.Claim("c", "good above base", None, "cut",
                       claims.Group("s", "good", "cell"), claims.Group("s", "base", "cell"),
                       (3,), ())
  (r,) = verdicts.read(claim, claim_runs.load_sweeps(root, [claim]))
  assert r.verdict == expected
  a, b = r.sides
  assert (b.floor, b.guess, b.commonest) == (pytest.approx(100 * FLOOR),
                                             pytest.approx(100 * GUESS),
                                             pytest.approx(100 * COMMONEST))
  margins = 100 * (np.array(finals) - FLOOR)
  assert b.margin == pytest.approx(margins.mean())
  assert b.margin_se == pytest.approx(margins.std(ddof=1) / math.sqrt(3))
  assert not a.at_floor


def test_the_method_side_and_the_round_read_are_floored_too(tmp_path):
  root = str(tmp_path)
  _side(root, "low", (0.30, 0.31, 0.32))      # under the floor at round 3, 80% before
  _side(root, "base", (0.60, 0.61, 0.62))
  claim = claims.Claim("c", "low above base", None, "cut", claims.Group("s", "low", "cell"),
                       claims.Group("s", "base", "cell"), (2, 3), ())
  r2, r3 = verdicts.read(claim, claim_runs.load_sweeps(root, [claim]))
  assert r2.verdict == "not seen" and r3.verdict == verdicts.UNINFORMATIVE  # 80% both at 2
  assert r3.mean < 0  # the difference is still read


@pytest.mark.parametrize("ledger_floor,expected", [(0.50, "reproduced"),
                                                   (0.60, verdicts.UNINFORMATIVE),
                                                   (0.10, "reproduced")])  # 37.5% rules
def test_a_floor_the_ledger_states_where_it_is_higher(tmp_path, ledger_floor, expected):
  root = str(tmp_path)
  _side(root, "good", (0.9, 0.9, 0.9))
  _side(root, "base", (0.60, 0.60, 0.60))
  claim = claims.Claim("c", "above", None, "cut", claims.Group("s", "good", "cell"),
                       claims.Group("s", "base", "cell"), (3,), (), floor=ledger_floor)
  (r,) = verdicts.read(claim, claim_runs.load_sweeps(root, [claim]))
  assert r.verdict == expected
  assert r.sides[1].floor == pytest.approx(100 * max(ledger_floor, FLOOR))


def test_per_client_target_and_correlation_rows_are_floored(tmp_path):
  root = str(tmp_path)
  # per client: A beats B on 3 of 4 clients, but B ends under its floor
  _side(root, "good", (0.9, 0.9, 0.9), per_client=[0.9] * 4)
  _side(root, "base", (0.30, 0.30, 0.30), per_client=[0.3, 0.3, 0.3, 0.95])
  a, b = claims.Group("s", "good", "cell"), claims.Group("s", "base", "cell")
  per_client = claims.Claim("P6", "above", None, "cut", a, b, (3,), (), test="clients")
  # to target: both reach 70% at round 1 (80%), B ends under its floor
  target = claims.Claim("P4", "fewer", None, "cut", a, b, (3,), (), test="target",
                        target=0.7, measure="rounds")
  # correlation: Moss's one side ends at 30% (under the floor) or at 80%
  fid = {1: {"fidelity": [0.2, 0.9]}, 3: {"fidelity": [0.2, 0.9]}}
  for seed in (0, 1):
    for setting, final in (("low", 0.30), ("fine", 0.80)):
      _run(root, "s", "moss", setting, seed, [0.8, 0.8, final], extra=fid,
           config={"models": "tiny,tiny2", "num_clients": 4},
           per_client=[0.2, 0.9, 0.3, 0.8] if seed else [0.3, 0.8, 0.2, 0.9])
  low, fine = (claims.Group("s", "moss", s) for s in ("low", "fine"))
  corr = [claims.Claim(f"S5 {g.setting}", "tracks", None, "cut", g, g, (3,), (),
                       test="fidelity") for g in (low, fine)]
  runs = claim_runs.load_sweeps(root, [per_client, target, *corr])
  for claim in (per_client, target, corr[0]):
    (r,) = verdicts.read(claim, runs)
    assert r.verdict == verdicts.UNINFORMATIVE, claim.id
  (r,) = verdicts.read(corr[1], runs)
  assert r.verdict != verdicts.UNINFORMATIVE and len(r.sides) == 1  # one side
  assert r.sides[0].floor == pytest.approx(100 * FLOOR)


def test_a_floor_outside_zero_one_is_refused():
  g = claims.Group("s", "m", "cell")
  with pytest.raises(ValueError, match="floor must be a fraction"):
    claims.Claim("c", "p", None, "cut", g, g, (3,), (), floor=50.0)


def _ledger(root):
  """A ledger whose every verdict is known: at T (round 2) and 3 T (round 3) in one
  comparison, A above B by 5 points (seeds 0-2: +4, +5, +6) -> reproduced at both; a
  comparison against a baseline at its floor at T and above it at 3 T; a claim
  without a difference; a claim whose runs are not finished; one read two ways (a
  comparator with two readings, the first at its floor)."""
  for seed, d in enumerate((0.04, 0.05, 0.06)):
    _run(root, "s", "a", "cell", seed, [0.8, 0.8 + d, 0.8 + d])
    _run(root, "s", "b", "cell", seed, [0.8, 0.8, 0.8])
    _run(root, "s", "late", "cell", seed, [0.8, 0.37, 0.6])  # at its floor at round 2
    _run(root, "s", "flat", "cell", seed, [0.8, 0.8 + d - 0.05, 0.8 + d - 0.05])
  g = {m: claims.Group("s", m, "cell") for m in ("a", "b", "late", "flat")}
  return [
      claims.Claim("X vs B, T=2", "A above B", None, "cut", g["a"], g["b"], (2,), (),
                   headline="X vs B"),
      claims.Claim("X vs B, 3T=3", "A above B", None, "cut", g["a"], g["b"], (3,), (),
                   headline="X vs B"),
      claims.Claim("X vs late, T=2", "A above late", None, "cut", g["a"], g["late"], (2,),
                   (), headline="X vs late"),
      claims.Claim("X vs late, 3T=3", "A above late", None, "cut", g["a"], g["late"],
                   (3,), (), headline="X vs late"),
      claims.Claim("flat", "no difference", None, "cut", g["flat"], g["b"], (3,), (),
                   direction=0),
      claims.Claim("not run", "A above", None, "cut", claims.Group("t", "a", "cell"),
                   g["b"], (3,), ()),
  ]


def test_a_ledger_counts_each_claim_once_at_its_longest_budget(tmp_path):
  root = str(tmp_path)
  ledger = _ledger(root)
  runs = claim_runs.load_sweeps(root, ledger)
  rows = [(c, verdicts.read(c, runs)) for c in ledger]
  got = {c.id: rs[-1].verdict for c, rs in rows if rs}
  assert got == {"X vs B, T=2": "reproduced", "X vs B, 3T=3": "reproduced",
                 "X vs late, T=2": verdicts.UNINFORMATIVE,  # 37% on a 37.5% floor
                 "X vs late, 3T=3": "reproduced", "flat": "reproduced"}
  longest, shorter = claims_page.counted(rows)
  assert [c.id for c, _ in longest] == ["X vs B, 3T=3", "X vs late, 3T=3", "flat",
                                       "not run"]
  assert [c.id for c, _ in shorter] == ["X vs B, T=2", "X vs late, T=2"]
  table = claims_page.counts_lines(rows)
  assert "| reproduced | 3 | 1 |" in table
  assert "| uninformative | 0 | 1 |" in table
  assert f"| {claims_page.PENDING} | 1 | 0 |" in table
  assert table[-1] == "| **all** | **4** | **2** |"  # 4 claims, each counted once
  counted = sum(int(line.split("|")[2]) for line in table[2:-1])
  assert counted == len({c.headline or c.id for c in ledger})
  # the opening: a table row per headline comparison, at T and at 3 T
  budgets = {c.id: (f"the cell, {max(c.rounds)} rounds", (max(c.rounds), 500, 5),
                    (500, 4000, 10)) for c in ledger}
  opening = claims_page.opening_lines(rows, [("A > B", ["X vs B", "X vs late"])], budgets)
  assert opening[2] == ("| A > B | X vs B | reproduced (+5.00 ± 0.58) | reproduced "
                        "(+5.00 ± 0.58) | rounds 0.4% / 0.6%, examples 12.5%, epochs 50% |")
  assert opening[3].startswith("|  | X vs late | uninformative (+48.00 ± 0.58) | reproduced")
  sentences = claims_page.summary_lines(rows, budgets, note="One more sentence.")
  assert len(sentences) <= 5 and all(len(s.split()) <= 40 for s in sentences)
  assert sentences[0].startswith("4 claims, each counted once at its longest budget (3 with "
                                 "finished runs); their 2 rows at a shorter budget")
  assert sentences[1].startswith("0 of the 4 are uninformative")
  assert claims_page.budget_lines(budgets)[2:] == [
      "| the cell, 2 rounds | 2 | 2 of 500 (0.4%) | 500 of 4,000 (12.5%) | 5 of 10 (50%) |",
      "| the cell, 3 rounds | 4 | 3 of 500 (0.6%) | 500 of 4,000 (12.5%) | 5 of 10 (50%) |"]
  flips = claims_page.flip_lines(rows)
  assert flips[2] == ("| X vs late | round 2: uninformative (+48.00 ± 0.58); round 3: "
                      "reproduced (+25.00 ± 0.58) |")
  floored = claims_page.uninformative_lines(rows)
  assert floored[2].startswith("| X vs late, T=2 | 2 | a | 85.0% | 37.5% | 34.4% | 31.2% |")
  assert floored[3] == ("|  |  | late | 37.0% | 37.5% | 34.4% | 31.2% | -0.50 ± 0.00 "
                        "(**at the floor**) |")


def test_a_claim_is_read_against_each_reading_and_says_when_none_is_informative(tmp_path):
  root = str(tmp_path)
  ledger = _ledger(root)
  runs = claim_runs.load_sweeps(root, ledger)
  rows = [(c, verdicts.read(c, runs)) for c in ledger]
  readings = [("X", ("X vs late, T=2", "X vs B, T=2")),
              ("Y", ("X vs late, T=2", None))]
  table, none = claims_page.reading_lines(rows, readings, ("late (the papers')", "B"))
  assert table[2] == ("| X | uninformative (+48.00 ± 0.58) | reproduced (+5.00 ± 0.58) | "
                      "reproduced (B) |")
  assert table[3] == ("| Y | uninformative (+48.00 ± 0.58) | not run | none: every "
                      "reading run is uninformative |")
  assert none == ["Y"]
  (line,) = [s for s in claims_page.summary_lines(rows, readings=readings,
                                                  names=("late (the papers')", "B"))
             if s.startswith("Rows against")]
  assert "late, 2 of 2; B, 0 of 1" in line
