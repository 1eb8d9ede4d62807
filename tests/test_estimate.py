"""A run's FLOPs from XLA's cost analysis, the calibration, and the budget plan."""
import json
import logging
import math
import os
import sys

import jax
import pytest
from conftest import TINY_SHARED
from conftest import make_tiny_config

from fedjax_het.sweeps import budget
from fedjax_het.sweeps import runner
from fedjax_het.sweeps.plan import Run
from fedjax_het.training import estimate
from fedjax_het.training import experiment
from fedjax_het.training import loop

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))
import compare  # noqa: E402

# programs that compile far longer than they run: level 0 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("compile_bound")


@pytest.mark.parametrize("algorithm", ["fedavg", "fedmrl", "fedmoe"])
def test_step_flops_agree_with_the_analytic_count(synthetic_npz, algorithm):
  """XLA's count of one local step (lowered, loops counted once) against
  ``compare.train_flops_per_example`` (layer sizes, on CIFAR's 32x32 images): within 3 %."""
  cnn5_shared = {key: "cnn5" for key in TINY_SHARED.get(algorithm, {})}  # the analytic's
  exp = experiment.prepare(make_tiny_config(synthetic_npz, algorithm, models="cnn1",
                                            overrides=cnn5_shared), place=False)
  train, predict = estimate.step_flops(exp)
  analytic = compare.train_flops_per_example(algorithm, arch="cnn1")
  assert train[0] == pytest.approx(analytic, rel=0.03)
  assert 0 < predict[0] < train[0] / 2  # a prediction is a forward pass


def test_step_flops_are_counted_by_the_cpu_client(tiny_config, monkeypatch):
  """On a GPU ``Lowered.cost_analysis()`` is None (its client, behind PJRT's C API, has
  no pre-compilation analysis; seen on an H200): simulated here by a cost analysis that
  answers only for a program lowered with the CPU as the default device. The count is
  the same as the plain CPU count, and with no analysis at all the error says why."""
  exp = experiment.prepare(tiny_config("fedavg", models="cnn1"), place=False)
  expected = estimate.step_flops(exp)
  real = jax.stages.Lowered.cost_analysis
  lowered_on = []

  def gpu_like(self):
    device = jax.config.jax_default_device
    lowered_on.append(device)
    return real(self) if getattr(device, "platform", None) == "cpu" else None

  monkeypatch.setattr(jax.stages.Lowered, "cost_analysis", gpu_like)
  assert estimate.step_flops(exp) == expected and expected[0][0] > 0
  assert lowered_on and all(d.platform == "cpu" for d in lowered_on)
  monkeypatch.setattr(estimate, "_cost_device", lambda: None)  # JAX_PLATFORMS without cpu
  with pytest.raises(RuntimeError, match="cost analysis is unavailable.*--noestimate"):
    estimate.step_flops(exp)


def test_run_cost_is_rounds_times_round_plus_evaluations(tiny_config):
  c = tiny_config("standalone", overrides={"num_rounds": 5, "eval_every": 2,
                                           "participation": 0.5, "local_epochs": 3})
  exp = experiment.prepare(c, place=False)
  cost = estimate.run_cost(exp)
  expected_round = 0.0
  for g, index in enumerate(exp.data.groups):
    share = exp.runtime.expected_sampled(g) / exp.runtime.layout.group_sizes[g]
    expected_round += share * (index.num_train.sum() * 3 * cost.train_flops_per_example[g]
                               + index.num_test.sum() * cost.predict_flops_per_example[g])
  assert cost.round_flops == pytest.approx(expected_round)
  assert cost.total_flops == pytest.approx(5 * cost.round_flops + 3 * cost.eval_flops)
  cal = estimate.Calibration(compile_s=10.0, round_s=1.0, flops_per_s=cost.total_flops / 5)
  assert estimate.estimate_seconds(cost, cal) == pytest.approx(15.0)
  assert estimate.estimate_seconds(cost, cal, rounds_left=2, compile_s=0.0) == (
      pytest.approx(2.0))


def test_calibration_times_the_runs_own_dispatch(tiny_config):
  exp = experiment.prepare(tiny_config("fedmrl", overrides={"num_rounds": 4}))
  cal = estimate.calibrate(exp)
  assert cal.compile_s >= 0 and cal.round_s > 0 and math.isfinite(cal.flops_per_s)
  assert estimate.format_flops(3.2e15) == "3.2 PFLOP"
  assert estimate.format_flops(5.12e11) == "512.0 GFLOP"


def test_a_batch_is_calibrated_on_the_program_its_seeds_run(tiny_config, tmp_path, caplog):
  configs = [tiny_config(overrides={"seed": s, "num_rounds": 3}) for s in (0, 1)]
  exps = [experiment.prepare(c, place=False) for c in configs]
  cal = estimate.calibrate(exps)
  # the work of both seeds per round (a single run's calibration counts one)
  assert cal.flops_per_s == pytest.approx(2 * estimate.run_cost(exps[0]).round_flops
                                          / cal.round_s)
  # the seeds on their replica axis compile nothing: the persistent cache (conftest's)
  # serves the calibrated dispatch
  caplog.set_level(logging.DEBUG, logger="jax._src.compiler")
  loop.run_seeds(configs, [str(tmp_path / "s0"), str(tmp_path / "s1")], log=lambda _: None)
  lines = [r.getMessage() for r in caplog.records if "'jit_dispatch'" in r.getMessage()]
  assert lines and all(m.startswith("Persistent compilation cache hit") for m in lines), lines


def test_a_batch_whose_seeds_cannot_share_a_program_is_calibrated_on_its_first_run(
    tiny_config):
  configs = [tiny_config(overrides={"seed": 0, "num_rounds": 3}),
             tiny_config(overrides={"seed": 1, "num_rounds": 3, "learning_rate": 0.5})]
  runs = [Run("standalone", "N=8", c.seed, c, f"/x/{c.seed}") for c in configs]
  cal = runner.first_calibration(runs, [0, 1])  # run_batch runs them one by one
  cost = estimate.run_cost(experiment.prepare(configs[0], place=False))
  assert cal.flops_per_s == pytest.approx(cost.round_flops / cal.round_s)


def _run(algorithm, seed):
  return Run(algorithm, "N=10", seed, None, f"/x/{algorithm}/{seed}")


def test_plan_budget_by_hand():
  runs = [_run("a", 0), _run("a", 1), _run("b", 0)]
  costs = {"a|N=10": {"total_flops": 2e9}, "b|N=10": {"total_flops": 4e9}}
  cal = estimate.Calibration(compile_s=1.0, round_s=0.5, flops_per_s=1e9)
  lines = budget.plan_budget(runs, [[0, 1], [2]], costs, cal, budget_s=6.0)
  assert [(row.positions, row.flops, row.seconds, row.cumulative, row.fits) for row in lines] == [
      ((0, 1), 4e9, 5.0, 5.0, True), ((2,), 4e9, 5.0, 10.0, False)]
  text = budget.format_plan(runs, lines, cal, 6.0)
  assert text[0] == "calibration: compile 1s, 0.50 s per round, 0.001 TFLOP/s achieved"
  assert text[1] == "  a | N=10 | seeds 0,1: 4.0 GFLOP, about 5s (total 5s)"
  assert text[2].endswith("(total 10s)  (after the budget: next call)")
  assert text[-1] == "plan: 2 of 3 runs fit (budget 6s); estimated 10s for all"


def test_cell_costs_are_kept_for_the_next_call(tiny_config, tmp_path, monkeypatch):
  runs = [Run("standalone", "s", seed, tiny_config(overrides={"seed": seed}),
                     str(tmp_path / str(seed))) for seed in (0, 1)]
  first = budget.cell_costs(runs, [0, 1], str(tmp_path), log=lambda _: None)
  assert list(first) == ["standalone|s"] and first["standalone|s"]["total_flops"] > 0
  monkeypatch.setattr(estimate, "run_cost", lambda exp: pytest.fail("computed again"))
  assert budget.cell_costs(runs, [1], str(tmp_path), log=lambda _: None) == first
  with open(tmp_path / budget.COSTS_FILE) as f:
    assert json.load(f) == first


def test_cell_costs_of_zero_flops_are_computed_again(tiny_config, tmp_path):
  """A costs.json cell saved with 0 FLOPs (a GPU's, before the estimate lowered for the
  CPU) is neither planned with nor reused: it is computed again and rewritten."""
  runs = [Run("standalone", "s", 0, tiny_config(), str(tmp_path / "0"))]
  first = budget.cell_costs(runs, [0], str(tmp_path), log=lambda _: None)
  with open(tmp_path / budget.COSTS_FILE, "w") as f:
    json.dump({"standalone|s": {**first["standalone|s"], "total_flops": 0.0}}, f)
  assert budget.saved_costs(runs, str(tmp_path)) == {}
  assert budget.cell_costs(runs, [0], str(tmp_path), log=lambda _: None) == first
  with open(tmp_path / budget.COSTS_FILE) as f:
    assert json.load(f) == first


def test_memory_warning_compares_the_states_peak_with_what_is_available():
  gib = 2**30
  pair = estimate.memory_warning(int(2.36 * gib), 2, 9 * gib)
  assert pair.startswith("warning: 2 seeds on a replica axis hold 2 x 2.36 GiB of state")
  assert "about 11.3 GiB, more than the 9.0 GiB available now" in pair
  assert pair.endswith("run the seeds one at a time (a sweep's --seed_batch=1: about "
                       "5.7 GiB each)")
  one = estimate.memory_warning(int(2.36 * gib), 1, 5 * gib)
  assert one.startswith("warning: the run's state is 2.36 GiB") and "5.7 GiB" in one
  assert one.endswith("free memory, or run fewer clients or smaller models")
  assert estimate.memory_warning(int(2.36 * gib), 2, 12 * gib) is None  # 11.3 fits
  assert estimate.memory_warning(int(2.36 * gib), 2, None) is None  # unknown: no guess
  assert estimate.available_memory() is None or estimate.available_memory() > 0
  assert estimate.tree_bytes({"a": jax.ShapeDtypeStruct((3, 4), "float32"),
                               "b": jax.numpy.zeros(5, "int8")}) == 53


def test_a_run_that_may_not_fit_in_memory_says_so_before_it_starts(tiny_config, tmp_path,
                                                                   monkeypatch):
  monkeypatch.setattr(estimate, "available_memory", lambda: 1024)
  lines = []
  summary = loop.run(tiny_config(overrides={"num_rounds": 1}), str(tmp_path / "run"),
                     log=lines.append)
  assert lines[0].startswith("warning: the run's state is 0.00 GiB, and a CPU run peaks")
  assert lines[0].endswith("more than the 0.0 GiB available now; it may be killed for "
                           "memory: free memory, or run fewer clients or smaller models")
  assert lines[1].startswith("standalone | ") and summary["rounds_completed"] == 1
