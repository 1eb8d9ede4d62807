"""benchmarks/campaign.py: the order of its runs, and the tiny campaign end to end."""
import json
import os
import subprocess
import sys

import pytest
from conftest import COMPILE_BOUND_ENV

from fedjax_het.sweeps import campaign
from fedjax_het.sweeps import plan as plan_lib

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXPERIMENTS = os.path.join(ROOT, "experiments")  # the algorithms sweep files name


def test_paper_campaign_runs_the_papers_methods_first_then_the_rest_then_seeds(tmp_path):
  sweep = campaign.sweep_config(campaign.SIZES["paper"], repo_dir=ROOT)
  assert list(sweep.settings) == ["CIFAR-10 N=10,C=100%", "CIFAR-10 N=50,C=20%",
                                  "CIFAR-10 N=100,C=10%"]
  runs = plan_lib.plan(sweep, str(tmp_path), configs_dir=EXPERIMENTS)
  ordered = sorted(runs, key=campaign.priority(sweep))
  first = [(r.algorithm, r.setting.split()[1], r.seed) for r in ordered[:9]]
  assert first == [(a, s, 0) for s in ("N=10,C=100%", "N=50,C=20%", "N=100,C=10%")
                   for a in ("standalone", "fedmoe", "fedmrl")]
  assert {r.algorithm for r in ordered[9:30]} == set(
      plan_lib.resolve_algorithm(a)[0] for a in sweep.algorithms) - set(campaign.FIRST)
  assert all(r.seed == 0 for r in ordered[:30]) and all(r.seed > 0 for r in ordered[30:])


def test_bf16_campaign_sets_every_run_and_the_comparison_apart(tmp_path):
  size = campaign.SIZES["paper"]
  assert campaign.results_name(size, "float32") == "paper_cifar10"
  assert campaign.results_name(size, "bfloat16") == "paper_cifar10_bf16"
  runs = plan_lib.plan(campaign.sweep_config(size, "bfloat16", repo_dir=ROOT),
                       str(tmp_path), configs_dir=EXPERIMENTS)
  assert {r.config.runtime.compute_dtype for r in runs} == {"bfloat16"}
  assert {r.config.momentum for r in runs} == {0.9}  # the sweep's own overrides stay
  fp32 = plan_lib.plan(campaign.sweep_config(size, repo_dir=ROOT), str(tmp_path),
                       configs_dir=EXPERIMENTS)
  assert {r.config.runtime.compute_dtype for r in fp32} == {"float32"}
  assert campaign.compare_command(size, "bfloat16", repo_dir=ROOT)[-1] == "--dtype=bfloat16"


def test_bad_arguments_fail_before_anything_runs(tmp_path):
  with pytest.raises(ValueError, match="valid"):
    campaign.run_campaign("huge", results_dir=str(tmp_path), budget_s=10, repo_dir=ROOT)
  with pytest.raises(ValueError, match="positive"):
    campaign.run_campaign("tiny", results_dir=str(tmp_path), budget_s=0, repo_dir=ROOT)
  with pytest.raises(ValueError, match="compute_dtype='float16'"):
    campaign.run_campaign("tiny", results_dir=str(tmp_path), budget_s=10,
                          compute_dtype="float16", repo_dir=ROOT)
  assert os.listdir(tmp_path) == []


@pytest.mark.slow
def test_tiny_campaign_end_to_end_and_resumed(tmp_path):
  command = [sys.executable, os.path.join(ROOT, "benchmarks", "campaign.py"), "--size=tiny",
             f"--results={tmp_path}", "--budget_min=20", "--compile_cache=default"]
  # its calibration and comparison compile far more than they run: level 0
  env = dict(os.environ, **COMPILE_BOUND_ENV)
  out = subprocess.run(command, capture_output=True, text=True, timeout=900, cwd=ROOT,
                       env=env)
  assert out.returncode == 0, out.stderr[-3000:]
  lines = out.stdout.splitlines()
  where = tmp_path / "campaign_tiny"
  table = (where / "compare.txt").read_text()
  for alg in ("fedavg", "fedmrl", "fedmoe"):
    assert f"| {alg}    | ours-auto" in table or f"| {alg} " in table
  assert "jit-per-client" in table
  assert any(line.startswith("calibration: compile") for line in lines)
  assert any(line.startswith("plan: 6 of 6 runs fit") for line in lines)
  assert any("seeds 0, 1 on a replica axis" in line for line in lines)
  for alg in ("standalone", "fedmrl", "fedmoe"):
    for seed in (0, 1):
      run = where / alg / "cifar-10_n4_c50pct_400_examples" / f"seed{seed}"
      summary = json.loads((run / "summary.json").read_text())
      assert summary["rounds_completed"] == 2 and summary["timing"]["replicas"] == 2
      assert {"metrics.jsonl", "config.json", "partition.json"} <= set(os.listdir(run))
  assert "6 of 6 runs done" in lines[-1]
  again = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT,
                         env=env)
  assert again.returncode == 0, again.stderr[-3000:]
  assert "compare.py done earlier" in again.stdout
  assert "6 finished earlier, 0 to run" in again.stdout
  records = [json.loads(line) for line in (where / "campaign.jsonl").read_text().splitlines()]
  assert [r["runs_done"] for r in records] == [6, 6]
  assert records[0]["compare"] == "done" and records[1]["compare"] == "done earlier"
