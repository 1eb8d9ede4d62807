"""Paired, seed-matched differences between a sweep's groups (fedjax_het.sweeps.paired)."""
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from fedjax_het.sweeps import paired
from fedjax_het.sweeps import paired_report
from fedjax_het.sweeps import stats
from fedjax_het.sweeps.rundirs import load_runs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _rows(accs, sampled=None, best_sampled=None):
  """metrics.jsonl rows for rounds 1..len(accs)."""
  rows = []
  for t, a in enumerate(accs, start=1):
    row = {"round": t, "mean_test_acc": a, "train_loss": 1.0}
    if sampled is not None:
      row["sampled_test_acc"] = sampled[t - 1]
      row["best_sampled_test_acc"] = (best_sampled if best_sampled is not None
                                      else max(sampled[:t]))
    rows.append(row)
  return rows


def _write_run(root, method, slug, seed, rows, finished=True):
  workdir = os.path.join(root, method, slug, f"seed{seed}")
  os.makedirs(workdir)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump({"algorithm": method, "seed": seed}, f)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  if finished:
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump({"per_client_test_acc": [rows[-1]["mean_test_acc"]]}, f)


@pytest.fixture
def sweep_dir(tmp_path):
  """Two methods x two settings; 'b' adds 0.01 + 0.01*seed to 'a'; seed 2 of fedmrl/b
  unfinished; standalone lacks seed 1 in setting 'a'."""
  root = str(tmp_path / "sweep")
  os.makedirs(root)
  with open(os.path.join(root, "sweep.json"), "w") as f:
    json.dump({"settings": {"a": "a", "b": "b"}, "runs": []}, f)
  for seed in (0, 1, 2):
    base = [0.5, 0.6, 0.7 + 0.01 * seed]
    _write_run(root, "fedmrl", "a", seed, _rows(base, sampled=base))
    shifted = [v + 0.01 + 0.01 * seed for v in base]
    _write_run(root, "fedmrl", "b", seed, _rows(shifted, sampled=shifted),
               finished=seed != 2)
    if seed != 1:
      _write_run(root, "standalone", "a", seed, _rows([v - 0.02 for v in base]))
  return root


def test_run_metrics_final_last_k_best():
  rows = _rows([0.5, 0.8, 0.6, 0.7], sampled=[0.4, 0.5, 0.9, 0.6], best_sampled=0.95)
  m = paired.run_metrics(rows, last_k=2)
  assert m["final (a)"] == pytest.approx(70.0)
  assert m["last k (a)"] == pytest.approx(65.0)  # rounds 3 and 4
  assert m["best (a)"] == pytest.approx(80.0)
  assert m["final (b)"] == pytest.approx(60.0)
  assert m["last k (b)"] == pytest.approx(75.0)
  # the loop's running best (rounds between logged rows) counts for (b)
  assert m["best (b)"] == pytest.approx(95.0)
  assert paired.run_metrics(rows, last_k=10)["last k (a)"] == pytest.approx(65.0)
  # without sampled evaluation only protocol (a) columns exist
  assert set(paired.run_metrics(_rows([0.5]), 1)) == {"final (a)", "last k (a)", "best (a)"}
  with pytest.raises(ValueError, match="last_k"):
    paired.run_metrics(rows, last_k=0)


def test_last_k_skips_rounds_without_evaluation():
  rows = [{"round": 5, "mean_test_acc": 0.5}, {"round": 10, "mean_test_acc": 0.7}]
  assert paired.run_metrics(rows, last_k=5)["last k (a)"] == pytest.approx(70.0)
  assert paired.run_metrics(rows, last_k=6)["last k (a)"] == pytest.approx(60.0)


def test_mean_se():
  mean, se = stats.mean_se(np.array([1.0, 2.0, 3.0]))
  assert mean == pytest.approx(2.0)
  assert se == pytest.approx(1.0 / math.sqrt(3))
  assert math.isnan(stats.mean_se(np.array([4.0]))[1])


def test_mean_se_text_shows_a_small_spread_apart_from_none():
  """The ledger's M5 2/10 row against the references' choices read "+27.71 ± 0.00" with
  two seeds: their differences (82.211 - 54.505, 78.955 - 51.240 points) agree to 0.01
  point, a standard error of 0.005, not zero."""
  mean, se = stats.mean_se(np.array([82.21095 - 54.50484, 78.95532 - 51.23964]))
  assert se == pytest.approx(0.00479, abs=1e-5)
  assert stats.mean_se_text(mean, se) == "+27.71 ± 0.005"
  assert stats.mean_se_text(20.0, 0.0) == "+20.00 ± 0.00"  # seeds that agree exactly
  assert stats.mean_se_text(-1.234, 0.456) == "-1.23 ± 0.46"
  assert stats.mean_se_text(1.0, math.nan) == "+1.00"


def test_compare_by_setting_pairs_finished_seeds(sweep_dir):
  groups = paired.group_values(load_runs(sweep_dir), last_k=2)
  assert set(groups[("fedmrl", "b")]) == {0, 1}  # seed 2 did not finish
  (c,) = paired.compare(groups, "a")
  assert (c.method, c.setting, c.base_method, c.base_setting) == ("fedmrl", "b", "fedmrl", "a")
  assert c.seeds == (0, 1)
  np.testing.assert_allclose(c.diffs["final (a)"], [1.0, 2.0], atol=1e-9)
  np.testing.assert_allclose(c.diffs["last k (b)"], [1.0, 2.0], atol=1e-9)
  np.testing.assert_allclose(c.base["final (a)"], [70.0, 71.0], atol=1e-9)


def test_compare_by_method_within_each_setting(sweep_dir):
  groups = paired.group_values(load_runs(sweep_dir), last_k=2)
  (c,) = paired.compare(groups, "standalone")
  assert (c.method, c.setting, c.base_method) == ("fedmrl", "a", "standalone")
  assert c.seeds == (0, 2)  # standalone has no seed 1
  np.testing.assert_allclose(c.diffs["best (a)"], [2.0, 2.0], atol=1e-9)
  # standalone never evaluated protocol (b): no (b) column for the pair
  assert set(c.diffs) == {"final (a)", "last k (a)", "best (a)"}


def test_compare_rejects_unknown_or_ambiguous_baseline():
  groups = {("x", "y"): {0: {}}, ("y", "z"): {0: {}}}
  with pytest.raises(ValueError, match="no method or setting.*methods: x, y"):
    paired.compare(groups, "w")
  with pytest.raises(ValueError, match="both a method and a setting"):
    paired.compare(groups, "y")


def test_markdown_table_and_per_seed(sweep_dir):
  text = paired_report.report(sweep_dir, "a", last_k=2, per_seed=True)
  first_table = text.split("Where each difference is going")[0]
  table = [line for line in first_table.splitlines() if line.startswith("| fedmrl")]
  assert table == ["| fedmrl | b | 2 | +1.50 ± 0.50 | +1.50 ± 0.50 | "
                   "+1.50 ± 0.50 | +1.50 ± 0.50 | +1.50 ± 0.50 | +1.50 ± 0.50 |"]
  assert text.startswith("Each row: the method in the setting minus the same method in "
                         "setting 'a'")
  by_method = paired_report.report(sweep_dir, "standalone", last_k=2)
  assert "minus standalone in the same setting" in by_method
  assert "last 2 (a)" in text
  assert "- final (a): +1.00 / +2.00 (baseline 70.00 / 71.00)" in text
  assert paired_report.markdown([], last_k=5).startswith("No pair")


def test_cli_prints_report_and_fails_cleanly(sweep_dir, tmp_path):
  script = os.path.join(ROOT, "experiments", "paired.py")
  ok = subprocess.run([sys.executable, script, f"--sweep_dir={sweep_dir}",
                       "--baseline=standalone"], capture_output=True, text=True,
                      check=True)
  assert "| fedmrl | a | 2 |" in ok.stdout
  bad = subprocess.run([sys.executable, script, f"--sweep_dir={sweep_dir}",
                        "--baseline=nope"], capture_output=True, text=True)
  assert bad.returncode == 2
  assert bad.stderr.strip().startswith("error: --baseline='nope' is no method")
  empty = subprocess.run([sys.executable, script, f"--sweep_dir={tmp_path / 'none'}",
                          "--baseline=a"], capture_output=True, text=True)
  assert empty.returncode == 2 and "no run directories" in empty.stderr
  zero = subprocess.run([sys.executable, script, f"--sweep_dir={sweep_dir}",
                         "--baseline=a", "--last_k=0"], capture_output=True, text=True)
  assert zero.returncode == 2
  assert zero.stderr.strip() == "error: --last_k must be >= 1, got 0"


def _slope_sweep(root, slopes, *, rounds=30, noise=0.0):
  """Standalone flat at 0.5; 'fedmoe' = standalone + slope(seed) * round / 100 (so
  ``slopes[seed] / 10`` points per round = slopes[seed] points per 10 rounds)."""
  os.makedirs(root)
  rng = np.random.default_rng(0)
  for seed, slope in enumerate(slopes):
    base = [0.5 + noise * rng.standard_normal() for _ in range(rounds)]
    _write_run(root, "standalone", "s", seed, _rows(base))
    _write_run(root, "fedmoe", "s", seed,
               _rows([b + slope * t / 1000 for t, b in enumerate(base, start=1)]))
  return root


def test_per_round_differences_and_known_slope(tmp_path):
  root = _slope_sweep(str(tmp_path / "sw"), [1.0, 2.0, 3.0])
  (c,) = paired.compare_rounds(load_runs(root), "standalone")
  assert (c.method, c.base_method, c.seeds) == ("fedmoe", "standalone", (0, 1, 2))
  np.testing.assert_array_equal(c.rounds, np.arange(1, 31))
  # at round t seed s differs by slope_s * t / 10 points
  np.testing.assert_allclose(c.at(20), [2.0, 4.0, 6.0], atol=1e-9)
  mean, se = c.mean_se()
  np.testing.assert_allclose(mean, 2.0 * np.arange(1, 31) / 10, atol=1e-9)
  np.testing.assert_allclose(se, np.arange(1, 31) / 10 / math.sqrt(3), atol=1e-9)
  t = c.trend()
  assert (t.first, t.last) == (21, 30)  # the last third of 30 rounds
  assert t.slope == pytest.approx(2.0)  # points per 10 rounds, mean of 1, 2, 3
  assert t.se == pytest.approx(1 / math.sqrt(3))
  assert t.direction == "rising"
  # its level: seed s's mean over rounds 21..30 is slope_s * 25.5 / 10 points
  assert t.level == pytest.approx(2.0 * 2.55)
  assert t.level_se == pytest.approx(2.55 / math.sqrt(3))
  # read at round 15 (as a run stopped there): the window is rounds 11..15
  t15 = c.trend(upto=15)
  assert (t15.first, t15.last, t15.direction) == (11, 15, "rising")
  assert t15.slope == pytest.approx(2.0)


def test_trend_directions_and_errors():
  rounds = np.arange(1, 13)
  flat = stats.trend(rounds, np.array([rounds * 0.1, -rounds * 0.1]))
  assert flat.slope == pytest.approx(0.0) and flat.direction == "flat"
  falling = stats.trend(rounds, np.array([-rounds * 0.1, -rounds * 0.2, -rounds * 0.3]))
  assert falling.slope == pytest.approx(-2.0) and falling.direction == "falling"
  one_seed = stats.trend(rounds, np.array([rounds * 0.5]))
  assert one_seed.slope == pytest.approx(5.0)
  assert math.isnan(one_seed.se) and one_seed.direction == "flat"
  assert one_seed.level == pytest.approx(0.5 * 10.5) and math.isnan(one_seed.level_se)
  assert "+5.00 per 10 rounds over rounds 9-12: flat" == str(one_seed)
  with pytest.raises(ValueError, match="a slope needs two"):
    stats.trend(np.array([1, 2, 3]), np.zeros((2, 3)))
  with pytest.raises(ValueError, match="no evaluation at or before round 2"):
    paired.RoundComparison("a", "", "b", "", "mean_test_acc", (0,), np.array([5, 10]),
                           np.zeros((1, 2))).at(2)


def test_per_round_uses_rounds_every_run_evaluated(tmp_path):
  root = str(tmp_path / "sw")
  os.makedirs(root)
  _write_run(root, "standalone", "s", 0, [{"round": t, "mean_test_acc": 0.5}
                                          for t in (2, 4, 6, 8)])
  _write_run(root, "fedmrl", "s", 0, [{"round": t, "mean_test_acc": 0.6}
                                      for t in (1, 2, 3, 4, 6, 8)])
  _write_run(root, "fedmrl", "s", 1, [{"round": 8, "mean_test_acc": 0.6}],
             finished=False)  # unfinished: ignored
  (c,) = paired.compare_rounds(load_runs(root), "standalone")
  np.testing.assert_array_equal(c.rounds, [2, 4, 6, 8])
  np.testing.assert_allclose(c.diffs, [[10.0] * 4], atol=1e-6)
  np.testing.assert_allclose(c.at(5), [10.0], atol=1e-6)  # round 4's value


def test_report_says_where_each_difference_is_going(tmp_path):
  root = _slope_sweep(str(tmp_path / "sw"), [1.0, 2.0, 3.0])
  text = paired_report.report(root, "standalone", per_round=True)
  # last third (rounds 21-30): seed s's mean is 2.55 slope_s points
  assert ("| fedmoe | s | (a) | 3 | 30 | +6.00 ± 1.73 | +5.10 ± 1.47 | +2.00 ± 0.58 | "
          "rising |" in text)
  assert "| 20 | +4.00 ± 1.15 |" in text  # the per-round listing
  assert "| 20 |" not in paired_report.report(root, "standalone")
