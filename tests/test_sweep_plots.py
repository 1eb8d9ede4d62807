"""The sweep runner, its tables, the figures and the results page, from tiny real runs."""
import os
import re
import shutil
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest
from matplotlib import image as mpimg

from fedjax_het import config as config_lib
from fedjax_het.data import pool as pool_lib
from fedjax_het.training import checkpoint as ckpt_lib
from fedjax_het.training import experiment
from fedjax_het.training import loop
from fedjax_het.training import metrics as metrics_lib
from fedjax_het.training import program
from fedjax_het.training import runfiles

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
from fedjax_het import config_files  # noqa: E402
from fedjax_het.sweeps import eta as eta_lib  # noqa: E402
from fedjax_het.sweeps import figures  # noqa: E402
from fedjax_het.sweeps import gates  # noqa: E402
from fedjax_het.sweeps import paired  # noqa: E402
from fedjax_het.sweeps import plan as plan_lib  # noqa: E402
from fedjax_het.sweeps import plots  # noqa: E402
from fedjax_het.sweeps import results_page  # noqa: E402
from fedjax_het.sweeps import runner as sweep  # noqa: E402
from fedjax_het.sweeps import stats  # noqa: E402
from fedjax_het.sweeps import tables  # noqa: E402
from fedjax_het.sweeps import tensorboard_logs  # noqa: E402
from fedjax_het.sweeps.rundirs import RunData  # noqa: E402
from fedjax_het.sweeps.rundirs import read_json  # noqa: E402

# programs that compile far longer than they run: level 0 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("compile_bound")

EXPERIMENTS = os.path.join(ROOT, "experiments")  # the algorithms sweep files name

SETTING = "N=4,C=100%"
CELL = re.compile(r"^(\*\*)?\d+\.\d\d ± \d+\.\d\d(\*\*)?$")


def _row(algorithm, setting, seed, acc, status="done", sampled=None):
  return {"algorithm": algorithm, "setting": setting, "seed": seed, "status": status,
          "final_mean_test_acc": acc, "best_mean_test_acc": acc,
          "final_sampled_test_acc": sampled, "best_sampled_test_acc": sampled,
          "rounds_completed": 2, "uplink_params": 1.0, "downlink_params": 2.0,
          "compile_s": 1.5, "wall_s": 3.0,
          "workdir": f"{algorithm}/{plan_lib.slug(setting)}/seed{seed}"}


def _table_cells(markdown):
  """[[cells]] of the first Markdown table in ``markdown`` (header row first)."""
  lines = [line for line in markdown.splitlines() if line.startswith("|")]
  return [[c.strip() for c in line.strip("|").split("|")] for line in lines if "---" not in line]


def _metrics(rounds, accs, comm=10.0, wall=1.0):
  return tuple({"round": r, "mean_test_acc": a, "train_loss": 1.0, "uplink_params": comm * r,
                "downlink_params": comm * r, "wall_s": wall * r} for r, a in zip(rounds, accs))


def _run_data(method, seed, rows, per_client=None):
  return RunData(method, method, "", seed, method, "", rows, per_client)


# ----------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize("name,expected", [("N=10,C=100%", "n10_c100pct"),
                                           ("CIFAR-100 N=50,C=20%", "cifar-100_n50_c20pct"),
                                           ("lr=0.05", "lr0.05"), ("???", "default")])
def test_slug(name, expected):
  assert plan_lib.slug(name) == expected


def test_algorithm_entries_and_overrides():
  assert plan_lib.resolve_algorithm("fedmrl", "smoke", EXPERIMENTS) == (
      "fedmrl", os.path.join(ROOT, "experiments", "fedmrl.py"), "smoke")
  assert plan_lib.resolve_algorithm("cfg/x.py:other", "smoke") == ("x", "cfg/x.py", "other")
  nested = ml_collections.ConfigDict({"a": {"b": 1}, "c": 2})
  assert config_files.flatten(nested) == {"a.b": 1, "c": 2}
  dotted = ml_collections.ConfigDict({"B": {"partition.kind": "iid"}, "A": {}},
                                     allow_dotted_keys=True, sort_keys=False)
  assert plan_lib.named_overrides(dotted) == [("B", {"partition.kind": "iid"}), ("A", {})]
  assert plan_lib.named_overrides([("x", {"y": {"z": 1}})]) == [("x", {"y.z": 1})]


def test_mean_std_and_durations():
  np.testing.assert_allclose(tables.mean_std([0.5, 0.7]), [0.6, np.sqrt(0.02)])
  assert tables.mean_std([0.4]) == (0.4, 0.0)
  assert [metrics_lib.format_s(s) for s in (None, 12.4, 250, 3720)] == [
      "?", "12s", "4m10s", "1h02m"]
  assert eta_lib.sweep_eta([], 3) is None
  assert eta_lib.sweep_eta([10.0, 20.0], 2, elapsed=5.0) == 15 * 2 + 10
  assert eta_lib.sweep_eta([], 1, elapsed=4.0, projected=8.0) == 8 + 4
  # a run slower than the mean so far: its own progress counts for its remaining time
  assert eta_lib.sweep_eta([10.0], 2, elapsed=30.0, projected=60.0) == 10 * 2 + 30
  # ... and so does a faster one
  assert eta_lib.sweep_eta([10.0], 2, elapsed=2.0, projected=4.0) == 10 * 2 + 2
  # later runs of a cell that already finished runs count at that cell's mean
  runs = ([plan_lib.Run("a", "s", k, None, "") for k in range(2)]
          + [plan_lib.Run("b", "s", 0, None, "")])
  means = eta_lib.cell_means({("a", "s"): [100.0, 120.0]}, runs)
  assert means == [110.0, 110.0, None]
  assert eta_lib.sweep_eta([10.0, 20.0], means, elapsed=5.0) == 110 + 110 + 15 + 10
  assert eta_lib.sweep_eta([10.0, 20.0], [], elapsed=5.0, current=110.0) == 105
  # the same from the sweep's bookkeeping: 110 per later run, the current one 110 - 5
  assert eta_lib.seconds_left({("a", "s"): [100.0, 120.0]}, runs, elapsed=5.0,
                              current=runs[0]) == 3 * 110 + 105
  # a batch of 3 seeds on a replica axis, 12 s of wall time in, projected to take 60 s:
  # 48 s of it are left (not a third of that: the seeds share the wall time); then 3
  # later runs at their cell's mean per run, 20 s
  assert eta_lib.sweep_eta([20.0], [20.0] * 3, elapsed=12.0, projected=60.0,
                           runs_now=3) == 3 * 20 + 48
  # before its projection: 3 runs at the cell's mean, 3 * 20 - 12 left
  assert eta_lib.sweep_eta([20.0], [20.0] * 3, elapsed=12.0, current=20.0,
                           runs_now=3) == 3 * 20 + 48
  # the first batch of a sweep: later runs at its projection per run
  assert eta_lib.sweep_eta([], 3, elapsed=12.0, projected=60.0, runs_now=3) == 60 + 48
  assert eta_lib.seconds_left({("a", "s"): [100.0, 120.0]}, runs[2:], elapsed=30.0,
                              current=runs[0], runs_now=3) == 110 + 3 * 110 - 30
  # a cell that has not run counts at its FLOPs (costs.json) times the seconds per FLOP
  # the finished runs took: a later cell of 5x the FLOPs, 5x their time
  flops = {("a", "s"): 2.0, ("b", "s"): 10.0}
  assert eta_lib.cell_means({("a", "s"): [100.0, 120.0]}, runs, flops) == [110.0, 110.0,
                                                                          550.0]
  assert eta_lib.cell_means({}, runs, flops) == [None, None, None]  # no rate measured yet
  # cells of unknown (0) FLOPs (a GPU's costs.json before the estimate lowered for the
  # CPU) give no rate: the finished cell's mean, None elsewhere, and no ZeroDivisionError
  zero = {("a", "s"): 0.0, ("b", "s"): 0.0}
  assert eta_lib.cell_means({("a", "s"): [100.0, 120.0]}, runs, zero) == [110.0, 110.0,
                                                                         None]
  assert eta_lib.seconds_left({("a", "s"): [100.0, 120.0]}, runs[2:], zero) == 110.0
  # between runs (a run just finished): only the later runs are left
  assert eta_lib.sweep_eta([10.0, 20.0], [], elapsed=None) == 0
  assert eta_lib.sweep_eta([10.0, 20.0], means, elapsed=None) == 110 + 110 + 15
  # the projection starts after the first round line: compile time is not extrapolated
  assert eta_lib.projected_duration((20.0, 0.05), (20.0, 0.05)) is None
  assert eta_lib.projected_duration((20.0, 0.05), (25.0, 0.10)) == pytest.approx(20 + 5 * 19)


def test_prefixed_log_eta_ignores_compile_time():
  clock, lines = [0.0], []
  log, on_progress = eta_lib.prefixed_log(
      lines.append, "[1/2] x", lambda: clock[0],
      lambda now, projected: eta_lib.sweep_eta([], 1, now, projected))
  clock[0] = 20.0  # compile + round 1 of 20
  on_progress(1, 20)
  log("round 1/20 | acc")
  clock[0] = 22.0
  log("compiled in 18s")
  clock[0] = 24.0
  on_progress(2, 20)  # 4 s a round from here: 20 + 19 * 4 = 96 s a run; 72 + 96 left
  log("round 2/20 | acc")
  assert [line.rsplit("sweep ETA ", 1)[1] for line in lines] == ["?", "?", "2m48s"]
  assert lines[0].startswith("[1/2] x | round 1/20 | acc | ")
  clock[0] = 30.0  # the batch's seeds run again one by one: the projection restarts
  on_progress(1, 20)
  log("round 1/20 | acc")
  assert lines[-1].endswith("sweep ETA ?")


def test_markdown_table_layout_mean_std_and_bold():
  rows = [_row("a", "S1", 0, 0.50), _row("a", "S1", 1, 0.70), _row("a", "S2", 0, 0.20),
          _row("b", "S1", 0, 0.40), _row("b", "S1", 1, 0.40), _row("b", "S2", 0, 0.30),
          _row("b", "S2", 1, 0.50), _row("a", "S2", 1, None, status="failed: X")]
  cells = _table_cells(tables.markdown_table(rows, methods=["b", "a", "c"], num_seeds=2))
  assert cells[0] == ["Method", "S1", "S2"]  # columns settings, in first-seen order
  assert [r[0] for r in cells[1:]] == ["b", "a", "c"]  # rows methods, in the given order
  assert cells[1][1:] == ["40.00 ± 0.00", "**40.00 ± 14.14**"]
  assert cells[2][1:] == ["**60.00 ± 14.14**", "20.00 (n=1)"]  # the failed seed is out
  assert cells[3][1:] == ["–", "–"]
  text = tables.results_markdown(rows, seeds=[0, 1])
  assert "Final accuracy, protocol (a)" in text and "Failed runs: `a/s2/seed1`" in text
  assert "protocol (b)" not in text  # rows without the sampled-client evaluation
  both = tables.results_markdown([_row("a", "S1", 0, 0.4, sampled=0.7)], seeds=[0])
  assert both.count("| a | **40.00** |") == 2 and both.count("| a | **70.00** |") == 2
  assert "protocol (b): the round's sampled clients right after local training" in both
  assert "| a | 3 (2) |" in both  # wall seconds (compile seconds)


def test_csv_round_trip():
  rows = [_row("a", "N=10,C=100%", 0, 0.5), _row("b", "S", 1, None, status="failed: E")]
  text = tables.csv_text(rows)
  assert text.splitlines()[0] == ",".join(tables.CSV_COLUMNS)
  back = tables.parse_csv(text)
  assert back[0] == rows[0]
  assert back[1]["final_mean_test_acc"] is None and back[1]["seed"] == 1


def test_curves_and_cost_to_target():
  a = [_run_data("a", s, _metrics([1, 2, 3], accs)) for s, accs in
       ((0, [0.1, 0.3, 0.5]), (1, [0.3, 0.5, 0.7]))]
  b = [_run_data("b", 0, _metrics([1, 2, 3, 4], [0.1, 0.2, 0.3, 0.4], comm=1.0, wall=2.0))]
  curves = {"a": figures.mean_curve(a), "b": figures.mean_curve(b)}
  np.testing.assert_allclose(curves["a"].acc, [0.2, 0.4, 0.6])
  np.testing.assert_allclose(curves["a"].acc_std, [np.sqrt(0.02)] * 3)
  np.testing.assert_allclose(curves["a"].comm, [20, 40, 60])
  assert stats.first_reach([0.1, 0.4, 0.3], 0.35) == 1
  assert stats.first_reach([0.1], 0.35) is None
  assert figures.default_target(curves) == pytest.approx(0.4)
  costs = figures.target_costs(curves, 0.35)
  assert costs["a"] == {"round": 2, "comm": 40.0, "wall": 2.0}
  assert costs["b"] == {"round": 4, "comm": 8.0, "wall": 8.0}
  assert figures.target_costs(curves, 0.65) == {"a": None, "b": None}


def test_client_diff_pairs_seeds_and_gate_histograms():
  a = [_run_data("a", 0, (), (0.5, 0.6)), _run_data("a", 1, (), (0.7, 0.2))]
  b = [_run_data("b", 1, (), (0.5, 0.4)), _run_data("b", 2, (), (0.0, 0.0))]
  np.testing.assert_allclose(figures.client_diff(a, b), [0.2, -0.2])  # seed 1 only
  hist = figures.gate_histograms([np.array([0.0, 0.1, 0.95, 1.0]), np.array([0.5])], bins=2)
  np.testing.assert_allclose(hist, [[0.5, 0.0], [0.5, 1.0]])


def test_sweep_files_plan_without_running(tmp_path):
  runs = plan_lib.plan(
      config_files.load_config_file(os.path.join(ROOT, "experiments/sweeps/smoke.py")),
      str(tmp_path), configs_dir=EXPERIMENTS)
  assert len(runs) == 3 * 2 * 2
  assert runs[0].workdir == str(tmp_path / "standalone" / "n5_c100pct" / "seed0")
  assert {r.config.num_rounds for r in runs} == {3}  # the smoke variant
  assert {r.config.participation for r in runs} == {1.0, 0.6}
  table = plan_lib.plan(config_files.load_config_file(
      os.path.join(ROOT, "experiments/sweeps/paper_table.py")), str(tmp_path),
      configs_dir=EXPERIMENTS)
  assert len(table) == 10 * 6 * 3
  assert {(r.config.data.name, r.config.num_clients) for r in table} == {
      (d, n) for d in ("cifar10", "cifar100") for n in (10, 50, 100)}
  # Moss's public set is held out for every algorithm: one partition per (cell, seed)
  assert {r.config.data.public for r in table} == {500}
  cell = [r for r in table if r.setting == table[0].setting and r.seed == 0]
  y = np.arange(60000) % 10
  parts = [pool_lib.partition_clients(y, 10, **config_lib.partition_args(r.config))[0]
           for r in cell
           if r.algorithm in ("moss", "fedmrl")]
  assert len(parts) == 2
  for a, b in zip(*parts):
    np.testing.assert_array_equal(a, b)


def test_sweep_dry_run_cli(tmp_path):
  out = subprocess.run([sys.executable, os.path.join(ROOT, "experiments/sweep.py"),
                        "--sweep=experiments/sweeps/smoke.py", f"--sweep_dir={tmp_path}",
                        "--dry_run", "--sweep.seeds=3,"], capture_output=True, text=True,
                       cwd=ROOT, timeout=120, env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert out.returncode == 0, out.stderr[-2000:]
  assert "[6/6] fedmoe | N=5,C=60% | seed 3 | to run" in out.stdout
  assert not os.listdir(tmp_path)


def test_a_sweep_cut_to_some_rows_and_columns_keeps_their_runs():
  path = os.path.join(ROOT, "experiments/claims/table.py")
  sweep = config_files.load_config_file(path)
  sweep.seeds = (0,)
  lines = []
  cut = plan_lib.select(sweep, algorithms="standalone,fedmoe", configs_dir=EXPERIMENTS,
                        log=lines.append)
  assert list(cut.algorithms) == ["standalone", "fedmoe"]
  assert lines == ["sweep: the algorithm_overrides of fedkd, fedmrl, moss dropped: not "
                   "among the algorithms selected (standalone, fedmoe)"]
  assert list(cut.algorithm_overrides.keys()) == []
  assert len(sweep.algorithms) == 7 and "moss" in sweep.algorithm_overrides  # untouched
  # the same runs as the whole file's: Moss's public set still held out of the pool
  table = config_files.load_config_file(os.path.join(ROOT, "experiments/sweeps/paper_table.py"))
  table.seeds = (0,)
  full = {(r.algorithm, r.setting): r.config.to_dict()
          for r in plan_lib.plan(table, "d", configs_dir=EXPERIMENTS)}
  runs = plan_lib.plan(plan_lib.select(table, algorithms="standalone,fedmoe",
                                       settings="cifar-10_n10_c100pct",
                                       configs_dir=EXPERIMENTS, log=lines.append),
                       "d", configs_dir=EXPERIMENTS)
  assert [(r.algorithm, r.setting) for r in runs] == [
      ("standalone", "CIFAR-10 N=10,C=100%"), ("fedmoe", "CIFAR-10 N=10,C=100%")]
  assert all(r.config.to_dict() == full[(r.algorithm, r.setting)] for r in runs)
  assert {r.config.data.public for r in runs} == {500}  # Moss's, not their own 0
  # a row the file does not hold, given by name, is added
  added = plan_lib.select(sweep, algorithms=["fedavg", "moss"], configs_dir=EXPERIMENTS,
                          log=lines.append)
  assert list(added.algorithms) == ["moss", "fedavg"]
  assert list(added.algorithm_overrides.keys()) == ["moss"]
  with pytest.raises(ValueError, match="no algorithm named 'fedmo'.*'fedmoe'"):
    plan_lib.select(sweep, algorithms="fedmo", configs_dir=EXPERIMENTS)
  with pytest.raises(ValueError, match="no algorithm given"):
    plan_lib.select(sweep, algorithms="", configs_dir=EXPERIMENTS)


def test_a_sweep_cut_to_settings_by_name_or_slug():
  table = config_files.load_config_file(os.path.join(ROOT, "experiments/sweeps/paper_table.py"))
  assert plan_lib.split_names("N=10,C=100%,x,,y", ["N=10,C=100%"]) == [
      "N=10,C=100%", "x", "y"]
  cut = plan_lib.select(table, settings="cifar-100_n50_c20pct,CIFAR-10 N=10,C=100%")
  assert list(cut.settings.keys()) == ["CIFAR-10 N=10,C=100%", "CIFAR-100 N=50,C=20%"]
  assert dict(plan_lib.named_overrides(cut.settings)) == {
      n: v for n, v in plan_lib.named_overrides(table.settings) if n in cut.settings}
  assert list(cut.algorithms) == list(table.algorithms)
  with pytest.raises(ValueError, match="no setting named 'N=10'; the sweep's settings"):
    plan_lib.select(table, settings=["N=10"])


def test_subset_flags_are_taken_out_of_argv():
  argv = ["sweep.py", "--sweep=s.py", "--sweep.algorithms", "a,b", "--sweep.seeds=0,",
          "--sweep.settings=N=10,C=100%", "--sweep.algorithms=c"]
  assert sweep.subset_args(argv) == (["sweep.py", "--sweep=s.py", "--sweep.seeds=0,"],
                                     {"algorithms": "a,b,c", "settings": "N=10,C=100%"})


def test_sweep_cli_runs_some_rows_of_a_file(tmp_path):
  cmd = [sys.executable, os.path.join(ROOT, "experiments/sweep.py"),
         "--sweep=experiments/claims/table.py", f"--sweep_dir={tmp_path}", "--dry_run",
         "--sweep.algorithms=standalone,fedmoe", "--sweep.seeds=0,",
         "--sweep.settings=cifar-10_n10_c100pct_5k+1k_examples"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  out = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120, env=env)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.splitlines()[0] == (
      "sweep: the algorithm_overrides of fedkd, fedmrl, moss dropped: not among the "
      "algorithms selected (standalone, fedmoe)")
  assert [line.split(" | ")[0] for line in out.stdout.splitlines()[1:]] == [
      "[1/2] standalone", "[2/2] fedmoe"]
  bad = subprocess.run(cmd[:-3] + ["--sweep.algorithms=fedmo"], capture_output=True,
                       text=True, cwd=ROOT, timeout=120, env=env)
  assert bad.returncode == 2 and bad.stderr.startswith(
      "error: sweep.algorithms: no algorithm named 'fedmo'"), bad.stderr[-2000:]
  helped = subprocess.run(cmd[:2] + ["--help"], capture_output=True, text=True, cwd=ROOT,
                          timeout=120, env=env)
  assert "--sweep.algorithms=a,b" in " ".join(helped.stdout.split())


# ----------------------------------------------------------------------------- real runs


@pytest.fixture(scope="module")
def tiny_sweep(synthetic_npz, tmp_path_factory):
  """Standalone and FedAvg x 1 setting x 2 seeds, tiny models, 2 rounds (4 real runs)."""
  cfg = ml_collections.ConfigDict()
  cfg.algorithms = ["standalone", "fedavg"]
  cfg.settings = ml_collections.ConfigDict({SETTING: {"participation": 1.0}},
                                           allow_dotted_keys=True, sort_keys=False)
  cfg.seeds = (0, 1)
  cfg.base_overrides = ml_collections.ConfigDict(
      {"models": "tiny", "data.path": synthetic_npz, "data.subsample": 200,
       "num_clients": 4, "num_rounds": 2, "batch_size": 16, "eval_every": 1,
       "checkpoint_every": 0, "partition.kind": "iid", "runtime.num_devices": 1},
      allow_dotted_keys=True)  # one device: a third of the compile time of four
  sweep_dir = str(tmp_path_factory.mktemp("sweep"))
  logs = []
  rows = sweep.run_sweep(cfg, sweep_dir, log=logs.append,
                         command="python experiments/sweep.py --sweep=tiny.py",
                         configs_dir=EXPERIMENTS)
  return cfg, sweep_dir, rows, logs


def test_sweep_writes_csv_table_and_progress(tiny_sweep):
  _, sweep_dir, rows, logs = tiny_sweep
  with open(os.path.join(sweep_dir, "results.csv")) as f:
    csv_rows = tables.parse_csv(f.read())
  assert [(r["algorithm"], r["seed"]) for r in csv_rows] == [
      ("standalone", 0), ("fedavg", 0), ("standalone", 1), ("fedavg", 1)]
  for r in csv_rows:
    assert r["status"] == "done" and r["rounds_completed"] == 2 and r["wall_s"] > 0
    assert r["workdir"] == f"{r['algorithm']}/n4_c100pct/seed{r['seed']}"
    summary = read_json(os.path.join(sweep_dir, r["workdir"], "summary.json"))
    assert r["final_mean_test_acc"] == summary["final_mean_test_acc"]
    # a finished run keeps its last step only (the default; checkpoint_every=0: one)
    assert os.listdir(os.path.join(sweep_dir, r["workdir"], "checkpoints")) == ["2"]
  assert csv_rows[0]["uplink_params"] == 0 and csv_rows[1]["uplink_params"] > 0
  with open(os.path.join(sweep_dir, "results.md")) as f:
    cells = _table_cells(f.read())
  assert cells[0] == ["Method", SETTING]
  assert [c[0] for c in cells[1:3]] == ["standalone", "fedavg"]
  for k, method in enumerate(("standalone", "fedavg")):
    assert CELL.match(cells[1 + k][1])
    m, s = tables.mean_std([r["final_mean_test_acc"] for r in csv_rows
                           if r["algorithm"] == method])
    assert cells[1 + k][1].strip("*") == f"{100 * m:.2f} ± {100 * s:.2f}"
  assert logs[1].startswith(f"[1/4] standalone | {SETTING} | seed 0 | start")
  assert any(re.match(r"\[4/4\] fedavg .* \| round 2/2 \|.* \| sweep ETA \d+s$", line)
             for line in logs)


def test_second_sweep_skips_finished_and_resumes_unfinished(tiny_sweep, monkeypatch):
  cfg, sweep_dir, rows, _ = tiny_sweep
  summary = os.path.join(sweep_dir, "fedavg", "n4_c100pct", "seed1", "summary.json")
  mtime = os.stat(summary).st_mtime_ns

  def refuse(*args, **kwargs):
    raise AssertionError("a finished run was recomputed")

  monkeypatch.setattr(sweep.loop, "run", refuse)
  logs = []
  assert sweep.run_sweep(cfg, sweep_dir, log=logs.append, configs_dir=EXPERIMENTS) == rows
  assert sum("skipped" in line for line in logs) == 4
  assert os.stat(summary).st_mtime_ns == mtime
  # A run without its summary (killed before the end) goes through loop.run, which
  # resumes it from its last checkpoint.
  monkeypatch.undo()
  calls = []
  monkeypatch.setattr(sweep.loop, "run",
                      lambda *a, run=loop.run, **k: calls.append(a[1]) or run(*a, **k))
  os.remove(summary)
  logs = []
  again = sweep.run_sweep(cfg, sweep_dir, log=logs.append, configs_dir=EXPERIMENTS)
  assert calls == [os.path.dirname(summary)]
  assert any("resumed from round 2" in line for line in logs)
  assert [r["final_mean_test_acc"] for r in again] == [r["final_mean_test_acc"] for r in rows]


def test_a_sweeps_runs_do_not_suggest_the_cpu_variant(tiny_config, tmp_path, monkeypatch):
  # every CPU run long enough to hint; run directly it names the ':cpu' variants, run by
  # the sweep (whose file fixes the configs) it does not
  monkeypatch.setattr(metrics_lib, "CPU_HINT_S", -1.0)
  config = tiny_config(overrides={"num_rounds": 3, "eval_every": 1})
  direct = []
  loop.run(config, str(tmp_path / "direct"), log=direct.append)
  assert any(line.startswith("compiled in") and "':cpu' variant" in line for line in direct)
  swept = []
  run = plan_lib.Run("standalone", "N=8", 0, config, str(tmp_path / "swept"))
  assert isinstance(sweep.run_batch([run], swept.append)[0], dict)
  assert any(line.startswith("compiled in") for line in swept)
  assert not any("':cpu' variant" in line for line in swept)


def _png_size(path):
  assert os.path.getsize(path) > 0
  img = mpimg.imread(path)
  assert img.std() > 0  # not a blank canvas
  return img.shape[1], img.shape[0]


def test_plots_pngs_tensorboard_and_results_page(tiny_sweep, tmp_path):
  _, sweep_dir, rows, _ = tiny_sweep
  out = str(tmp_path / "plots")
  manifest = plots.make_plots(sweep_dir, out, compare=("fedavg", "standalone"),
                              log=lambda s: None, command="python experiments/plots.py x")
  kinds = {f["kind"]: f for f in manifest["figures"]}
  assert sorted(kinds) == ["accuracy", "client_diff", "target"]
  assert all(f["setting"] == SETTING for f in manifest["figures"])
  sizes = {k: _png_size(os.path.join(out, f["path"])) for k, f in kinds.items()}
  assert sizes == {"accuracy": (640, 480), "client_diff": (640, 480),
                   "target": (1280, 480)}
  # TensorBoard: one log per run, holding the metrics.jsonl scalars.
  assert len(manifest["tensorboard"]) == 4
  run = "fedavg/n4_c100pct/seed0"
  scalars = tensorboard_logs.read_scalars(os.path.join(out, "tb", run))
  metrics = metrics_lib.read_jsonl(os.path.join(sweep_dir, run, "metrics.jsonl"))
  assert set(tensorboard_logs.SCALARS) < set(scalars)
  assert [s for s, _ in scalars["mean_test_acc"]] == [1, 2]
  np.testing.assert_allclose([v for _, v in scalars["mean_test_acc"]],
                             [m["mean_test_acc"] for m in metrics], rtol=1e-6)
  # The results page: tables, figure links that resolve, the commands.
  page_path = str(tmp_path / "docs" / "results.md")
  page = results_page.write_page(sweep_dir, out, page_path, command="python page")
  for cmd in ("python experiments/sweep.py --sweep=tiny.py",
              "python experiments/plots.py x", "python page"):
    assert cmd in page
  assert "| Method | N=4,C=100% |" in page
  links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", page)
  assert len(links) == 3
  assert all(os.path.exists(os.path.join(tmp_path / "docs", link)) for link in links)
  # An earlier sweep's tables follow, with its command and a link to its numbers.
  both = results_page.write_page(sweep_dir, out, page_path, command="python page",
                                 earlier=(sweep_dir,))
  assert both.startswith(page) and f"## Another sweep: {sweep_dir}" in both
  assert both.count("| Method | N=4,C=100% |") == 2 * page.count("| Method | N=4,C=100% |")
  # ... with its environment, how far it is from the paper (its sweep file's
  # PAPER_CELLS) and its figures, where <sweep_dir>/plots has them
  other = str(tmp_path / "other")
  shutil.copytree(sweep_dir, other)
  shutil.copytree(out, os.path.join(other, "plots"))
  other_sweep = tmp_path / "other_sweep.py"
  other_sweep.write_text('"""A sweep on another machine."""\nPAPER_CELLS = {"cell": "Table X", '
                         '"values": {"fedavg": 50.0}}\n')
  info = read_json(os.path.join(other, "sweep.json"))
  info["command"] = f"python experiments/sweep.py --sweep={other_sweep}"
  info["environment"] = {"backend": "gpu", "devices": "1 x NVIDIA H200"}
  metrics_lib.write_json(os.path.join(other, "sweep.json"), info)
  section = results_page.write_page(sweep_dir, out, page_path, earlier=(other,)).split(
      f"## Another sweep: {other}")[1]
  assert "A sweep on another machine." in section and "Environment: backend gpu, devices 1 x NVIDIA H200." in section
  with open(os.path.join(other, "results.csv")) as f:
    (best, _, _), = [v for (a, _), v in tables.cell_stats(
        tables.parse_csv(f.read()), "best_mean_test_acc").items() if a == "fedavg"]
  assert f"Against Table X (best round): ours minus the paper's, fedavg {100 * best - 50:+.2f}" in section
  links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", section)
  assert len(links) == 3 and all(
      os.path.exists(os.path.join(tmp_path / "docs", link)) and "other/plots" in link
      for link in links)
  # A section of seed-matched differences against a method, before the figures.
  with_paired = results_page.write_page(sweep_dir, out, page_path, command="python page",
                                        paired="standalone")
  section = with_paired[with_paired.index("## Paired against standalone"):]
  table = section.split("Where each difference is going")[0]
  row = [line for line in table.splitlines() if line.startswith("| fedavg | ")]
  assert len(row) == 1 and row[0].split(" | ")[1:3] == [SETTING, "2"]
  assert section.index("| fedavg | ") < section.index("## Figures")
  with pytest.raises(ValueError, match="no method or setting"):
    results_page.write_page(sweep_dir, out, page_path, paired="fedmrl")
  # With --paired the figures add each method's difference by round and at the end.
  manifest = plots.make_plots(sweep_dir, out, paired="standalone", gates=False,
                              log=lambda s: None)
  kinds = [f["kind"] for f in manifest["figures"]]
  assert kinds == ["accuracy", "target", "paired_rounds", "paired_dots"]
  assert _png_size(os.path.join(out, manifest["figures"][2]["path"])) == (640, 480)


def test_results_page_answers_in_sentences_from_its_numbers():
  comparisons = [
      paired.Comparison("fedprox", "s", "standalone", "s", (0, 1, 2),
                        {"best (a)": np.array([1.0, 1.2, 1.4])}, {}),
      paired.Comparison("moss", "s", "standalone", "s", (0, 1, 2),
                        {"best (a)": np.array([-5.0, -6.0, -7.0])}, {}),
      paired.Comparison("fedmrl", "s", "standalone", "s", (0, 1, 2),
                        {"best (a)": np.array([-1.0, 0.5, 1.0])}, {})]
  rows = [{"algorithm": "standalone", "setting": "s", "status": "done",
           "best_mean_test_acc": v} for v in (0.80, 0.90)]
  lines = results_page.answer_lines(
      comparisons, rows, {"cell": "the paper's cell", "values": {"standalone": 90.0,
                                                                 "fedkd": 80.0}})
  assert lines == [
      "Against standalone at the same seeds (best (a), points, mean ± standard error): "
      "fedprox (+1.20 ± 0.12) is above standalone; moss (-6.00 ± 0.58) is below "
      "standalone beyond two standard errors; fedmrl within them.",
      "Against the paper's cell (best round): ours minus the paper's, standalone -5.00 "
      "points."]
  assert results_page.answer_lines([], rows, None) == []


def _random_state(abstract, seed=0):
  """A state of the abstract's shapes: floats uniform in [0.5, 1.5] (so batch-norm
  variances are positive), integers zero; built without compiling ``init``."""
  rng = np.random.default_rng(seed)
  return jax.tree.map(
      lambda a: jax.device_put(
          rng.uniform(0.5, 1.5, a.shape).astype(a.dtype)
          if np.issubdtype(a.dtype, np.floating) else np.zeros(a.shape, a.dtype),
          a.sharding), abstract)


def test_fedmoe_gate_figure_from_checkpoint(tiny_config, tmp_path):
  # A FedMoE checkpoint written the way loop.run writes it, of a random state: compiling
  # FedMoE's init and round on CPU would add 15-40 s for nothing the gate figure needs.
  config = tiny_config("fedmoe", "tiny", {
      "algo.global_arch": "tiny", "algo.gating_hidden": 8, "num_clients": 4,
      "data.subsample": 200, "partition.kind": "iid", "runtime.num_devices": 1})
  exp = experiment.prepare(config)
  state = _random_state(program.compile_fns(exp).abstract)
  ckpt = ckpt_lib.Checkpointer(str(tmp_path / "checkpoints"), max_to_keep=1,
                               fingerprint=runfiles.fingerprint(exp))
  ckpt.save(0, state, {})
  ckpt.close()
  metrics_lib.write_json(str(tmp_path / "config.json"), exp.config.to_dict())
  weights = gates.gate_weights_by_client(str(tmp_path))
  assert [len(w) for w in weights] == [int(c.sum()) for c in exp.class_counts[:, 1]]
  assert all(((w >= 0) & (w <= 1)).all() for w in weights)
  assert np.concatenate(weights).std() > 0
  path = figures.plot_gates(weights, "fedmoe", str(tmp_path / "gates.png"))
  assert _png_size(path) == (640, 480)
  # with each sample's label: a client's labels are its test split's classes
  samples = gates.gate_samples_by_client(str(tmp_path))
  for k, (w, labels) in enumerate(samples):
    np.testing.assert_array_equal(w, weights[k])
    np.testing.assert_array_equal(np.bincount(labels, minlength=exp.class_counts.shape[-1]),
                                  exp.class_counts[k, 1])
  run = RunData("fedmoe", "fedmoe", "", 0, "fedmoe", str(tmp_path), ({"round": 3},), ())
  gates.write_gates(run)  # what the claims ledger commits, read back
  for (w, labels), (w2, labels2) in zip(samples, gates.read_gates(run)):
    np.testing.assert_allclose(w2, w, atol=1e-5)
    np.testing.assert_array_equal(labels2, labels)
  other = config_lib.override(exp.config, {"learning_rate": 0.5})
  metrics_lib.write_json(str(tmp_path / "config.json"), other.to_dict())
  with pytest.raises(ckpt_lib.ConfigMismatchError):  # the checkpoint of another config
    gates.gate_weights_by_client(str(tmp_path))


def _sweeps_imports(module: str) -> set[str]:
  """The ``fedjax_het.sweeps`` modules a module of the package imports, lazily or not."""
  import ast  # noqa: PLC0415
  with open(os.path.join(ROOT, "fedjax_het", "sweeps", module + ".py")) as f:
    tree = ast.parse(f.read())
  found = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module == "fedjax_het.sweeps":
      found |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
        "fedjax_het.sweeps."):
      found.add(node.module.split(".")[2])
  return found


def test_the_sweeps_modules_import_without_a_circle():
  modules = sorted(f[:-3] for f in os.listdir(os.path.join(ROOT, "fedjax_het", "sweeps"))
                   if f.endswith(".py") and f != "__init__.py")
  graph = {m: _sweeps_imports(m) for m in modules}
  assert graph["verdicts"] == {"stats", "claim_runs", "claims", "rundirs"}  # not the page's
  assert graph["claims"] == set() and graph["stats"] == set()
  order: list[str] = []  # a topological order exists exactly when there is no circle
  while len(order) < len(modules):
    ready = [m for m in modules if m not in order and graph[m] <= set(order)]
    assert ready, {m: sorted(graph[m] - set(order)) for m in modules if m not in order}
    order += ready
