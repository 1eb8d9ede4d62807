"""No verdict against a side that did not learn (issue 80): synthetic runs at and around
the floor, the chance level of the clients' own label sets or the ledger's floor."""
import json
import math
import os

import pytest

from fedjax_het.sweeps import claim_runs
from fedjax_het.sweeps import claims
from fedjax_het.sweeps import claims_page
from fedjax_het.sweeps import verdicts


def _runs(root, method, accs, held=(2, 2, 2, 2), seeds=(0, 1, 2), final=None):
  """Finished 3-round runs of ``method`` in setting ``cell`` of ``root/s``: mean test
  accuracy ``accs[seed]`` at every round (``final`` at round 3 when given), clients
  holding ``held`` classes each (``partition.json``)."""
  for seed in seeds:
    workdir = os.path.join(root, "s", method, "cell", f"seed{seed}")
    os.makedirs(workdir)
    with open(os.path.join(workdir, "config.json"), "w") as f:
      json.dump({"algorithm": method, "seed": seed}, f)
    acc = accs[seed]
    rows = [{"round": t, "mean_test_acc": final if final is not None and t == 3 else acc}
            for t in (1, 2, 3)]
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in rows)
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump({"per_client_test_acc": [acc] * len(held)}, f)
    with open(os.path.join(workdir, "partition.json"), "w") as f:
      json.dump({"clients": [{"train_class_counts": [5] * k + [0] * (10 - k)}
                             for k in held]}, f)


def _claim(results, floor=None, test="paired", rounds=(3,)):
  a, b = claims.Group("s", "good", "cell"), claims.Group("s", "base", "cell")
  claim = claims.Claim("c", "good above base", None, "cut", a, b, rounds, (), test=test,
                       floor=floor)
  return claim, claim_runs.load_sweeps(results, [claim])


def test_chance_level_is_the_mean_over_clients_of_one_over_classes_held(tmp_path):
  _runs(str(tmp_path), "m", [0.5], held=(2, 4, 10, 5), seeds=(0,))
  workdir = str(tmp_path / "s" / "m" / "cell" / "seed0")
  assert verdicts.chance_level(workdir) == pytest.approx((1 / 2 + 1 / 4 + 1 / 10 + 1 / 5) / 4)
  assert math.isnan(verdicts.chance_level(str(tmp_path)))  # no partition.json


@pytest.mark.parametrize("base_acc,expected", [
    (0.49, verdicts.UNINFORMATIVE),   # below 2 classes' chance (50%)
    (0.50, verdicts.UNINFORMATIVE),   # at it: not above it
    (0.51, "reproduced"),             # above it: a verdict
])
def test_a_side_at_or_below_its_clients_chance_gets_no_verdict(tmp_path, base_acc,
                                                               expected):
  results = str(tmp_path)
  _runs(results, "good", [0.80, 0.81, 0.82])
  _runs(results, "base", [base_acc] * 3)
  claim, runs = _claim(results)
  (r,) = verdicts.read(claim, runs)
  assert r.verdict == expected
  assert r.mean == pytest.approx(100 * (0.81 - base_acc))  # the difference is still read
  (a, fa), (b, fb) = r.sides
  assert (a, fa, fb) == (pytest.approx(81.0), pytest.approx(50.0), pytest.approx(50.0))
  assert b == pytest.approx(100 * base_acc)


def test_the_method_side_is_held_to_its_floor_too(tmp_path):
  # B learned, A ended under its clients' chance: an "opposite" would blame A's method
  results = str(tmp_path)
  _runs(results, "good", [0.20, 0.21, 0.22], held=(4, 4))   # chance 25%
  _runs(results, "base", [0.60, 0.61, 0.62], held=(4, 4))
  claim, runs = _claim(results)
  (r,) = verdicts.read(claim, runs)
  assert r.verdict == verdicts.UNINFORMATIVE and r.mean < 0


def test_the_side_is_judged_where_it_ends_at_the_round_read(tmp_path):
  # B above chance for rounds 1-2, at 30% by round 3: uninformative at 3, a verdict at 2
  results = str(tmp_path)
  _runs(results, "good", [0.80, 0.81, 0.82])
  _runs(results, "base", [0.60] * 3, final=0.30)
  claim, runs = _claim(results, rounds=(2, 3))
  r2, r3 = verdicts.read(claim, runs)
  assert r2.verdict == "reproduced" and r3.verdict == verdicts.UNINFORMATIVE


@pytest.mark.parametrize("floor,expected", [(0.59, "reproduced"),
                                            (0.60, verdicts.UNINFORMATIVE),
                                            (0.61, verdicts.UNINFORMATIVE),
                                            (0.10, "reproduced")])  # chance 50% rules
def test_a_floor_the_ledger_states_above_chance(tmp_path, floor, expected):
  results = str(tmp_path)
  _runs(results, "good", [0.80, 0.81, 0.82])
  _runs(results, "base", [0.60] * 3)
  claim, runs = _claim(results, floor=floor)
  (r,) = verdicts.read(claim, runs)
  assert r.verdict == expected
  assert r.sides[1][1] == pytest.approx(100 * max(floor, 0.5))


def test_clients_claims_are_floored(tmp_path):
  results = str(tmp_path)
  _runs(results, "good", [0.80, 0.81, 0.82])
  _runs(results, "base", [0.40] * 3)
  claim, runs = _claim(results, test="clients")
  (r,) = verdicts.read(claim, runs)
  assert r.verdict == verdicts.UNINFORMATIVE and r.mean == pytest.approx(50.0)


def test_a_floor_outside_zero_one_is_refused():
  g = claims.Group("s", "m", "cell")
  with pytest.raises(ValueError, match="floor must be a fraction"):
    claims.Claim("c", "p", None, "cut", g, g, (3,), (), floor=50.0)


def test_the_opening_counts_learned_comparisons_and_lists_the_others_apart(tmp_path):
  results = str(tmp_path)
  _runs(results, "good", [0.80, 0.81, 0.82])
  _runs(results, "base", [0.45] * 3)
  _runs(results, "fine", [0.60, 0.61, 0.62])
  a, b = claims.Group("s", "good", "cell"), claims.Group("s", "base", "cell")
  fine = claims.Group("s", "fine", "cell")
  ledger = [claims.Claim("vs base", "above", None, "cut", a, b, (3,), ()),
            claims.Claim("vs fine", "above", None, "cut", a, fine, (3,), ()),
            claims.Claim("fine vs base", "above", None, "cut", fine, b, (3,), ())]
  runs = claim_runs.load_sweeps(results, ledger)
  rows = [(c, verdicts.read(c, runs)) for c in ledger]
  side = [("X", "good above the rest", [("base", ["vs base"]), ("fine", ["vs fine"]),
                                        ("none", [])])]
  lines = claims_page.summary_lines(rows, side)
  assert lines[0] == ("3 of 3 claims have finished runs; at the longest budget read, "
                      "leaving out the 2 uninformative rows where a side did not learn "
                      "(below): 1 reproduced.")
  assert lines[1].startswith("2 uninformative, no verdict")
  assert "vs base (good 81.0% (floor 50.0%), base 45.0% (floor 50.0%))" in lines[1]
  assert "fine vs base (fine 61.0%" in lines[1] and "vs fine (" not in lines[1]
  assert lines[2] == ("X (good above the rest): against base, vs base: uninformative "
                      "(+36.00 ± 0.58); against fine, vs fine: reproduced (+20.00 ± 0.00); "
                      "against none, no runs.")
