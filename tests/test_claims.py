"""The claims ledger: its sweeps, the budget prefix, verdicts and the generated page."""
import math
import os

import jax
import numpy as np
import pytest

from fedjax_het import config as config_lib
from fedjax_het.algorithms import SPECS
from fedjax_het.config_files import flatten
from fedjax_het.config_files import load_config_file
from fedjax_het.config_files import load_module
from fedjax_het.sweeps import claim_runs
from fedjax_het.sweeps import claims
from fedjax_het.sweeps import claims_page
from fedjax_het.sweeps import plan as plan_lib
from fedjax_het.sweeps import stats
from fedjax_het.sweeps import verdicts
from fedjax_het.training import experiment
from fedjax_het.training import loop

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLAIMS = os.path.join(ROOT, "experiments", "claims")
EXPERIMENTS = os.path.join(ROOT, "experiments")  # the algorithms sweep files name
SWEEPS = sorted(f for f in os.listdir(CLAIMS)
                if f.endswith(".py") and f not in ("protocol.py", "ledger.py"))
# the sweeps of paper_cpu's N=10, C=100% cell (``protocol.cell_sweep``)
CELL_SWEEPS = ["baselines.py", "cell_seeds.py", "moss_cell.py", "table.py"]
# the algorithms whose rounds depend on the run's total number of rounds
SCHEDULED = {"fedkd"}  # its SVD energy anneal spans the run


def _round_jaxpr(tiny_config, name, num_rounds):
  overrides = {"num_rounds": num_rounds}
  if name == "moss":
    overrides.update({"data.public": 16, "algo.public_size": 16, "algo.public_batch": 8,
                      "algo.wire_layers": "rep"})
  archs = "tiny" if SPECS[name].homogeneous_only else "tiny,tiny2"
  exp = experiment.prepare(tiny_config(name, archs, overrides))
  state = jax.eval_shape(exp.algorithm.init, jax.random.PRNGKey(0))
  return str(jax.make_jaxpr(exp.algorithm.round)(state, exp.data))


@pytest.mark.parametrize("name", sorted(SPECS))
def test_a_round_depends_on_the_total_rounds_only_where_said(tiny_config, name):
  """Round t of a 3T-round run is round t of a T-round run (same keys: ``fold_in(rng,
  t)``), so the ledger reads its T-round verdicts off the 3T runs: the traced round is
  the same program whatever ``num_rounds`` is, except for FedKD's anneal."""
  same = _round_jaxpr(tiny_config, name, 40) == _round_jaxpr(tiny_config, name, 120)
  assert same == (name not in SCHEDULED)


@pytest.mark.parametrize("sweep_file", SWEEPS)
@pytest.mark.parametrize("dataset", ["", "cifar100"])
def test_every_claims_sweep_plans_on_both_datasets(sweep_file, dataset, tmp_path):
  """Every config of every claims sweep validates, on CIFAR-10 and by ``:cifar100``;
  all keep their cut (N=100, C=10%, or paper_cpu's N=10, C=100% for the headline and
  the baselines' switches and Moss's ablations there) and hold the same public set out."""
  sweep = load_config_file(os.path.join(CLAIMS, sweep_file), dataset or None)
  runs = plan_lib.plan(sweep, str(tmp_path), configs_dir=EXPERIMENTS)
  assert runs
  for run in runs:
    c = run.config
    cut = ((10, 1.0) if sweep_file in CELL_SWEEPS else (100, 0.1))
    assert (c.num_clients, c.participation, c.data.public) == (*cut, 200)
    assert c.data.name == (dataset or "cifar10")
    if c.partition.kind == "pathological":
      assert c.partition.classes_per_client >= (10 if dataset else 2)
  with pytest.raises(ValueError, match="unknown claims dataset 'mnist'"):
    load_config_file(os.path.join(CLAIMS, sweep_file), "mnist")


@pytest.mark.parametrize("sweep_file", CELL_SWEEPS)
def test_a_cell_sweep_changes_paper_cpus_runs_only_by_its_variant(sweep_file, tmp_path):
  """The N=10 cell's claims pair their runs with paper_cpu's (moss_cell copies three):
  a run's config is paper_cpu's run of its method and seed but for its setting's own
  overrides (``protocol.cell_sweep``'s variants), and for T in table.py."""
  cpu_sweep = load_config_file(os.path.join(EXPERIMENTS, "sweeps", "paper_cpu.py"))
  cpu = {r.algorithm: r.config for r in plan_lib.plan(cpu_sweep, str(tmp_path / "cpu"),
                                                      configs_dir=EXPERIMENTS)
         if r.seed == 0}
  (cell_values,) = cpu_sweep.settings.values()
  sweep = load_config_file(os.path.join(CLAIMS, sweep_file))
  for run in plan_lib.plan(sweep, str(tmp_path / "claims"), configs_dir=EXPERIMENTS):
    ours = flatten(run.config.to_dict())
    theirs = {**flatten(cpu[run.algorithm].to_dict()), "seed": run.seed}
    changed = {k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k)}
    variant = set(sweep.settings[run.setting].keys()) - set(cell_values.keys())
    assert changed == variant | ({"num_rounds"} if sweep_file == "table.py" else set()), (
        run.setting, changed)


def test_cifar100_claims_cell_runs_on_synthetic_arrays(tmp_path):
  """The ``:cifar100`` switch reaches the data: a 2-round run of the table's cell on a
  synthetic 100-class npz (CIFAR-100 is not on these machines), one local epoch (the
  cell's 5 took most of the test's time)."""
  import numpy as np
  rng = np.random.default_rng(0)
  path = str(tmp_path / "cifar100.npz")
  y_tr, y_te = np.repeat(np.arange(100), 14), np.repeat(np.arange(100), 3)
  np.savez(path, x_train=rng.integers(0, 256, (len(y_tr), 32, 32, 3), np.uint8),
           y_train=y_tr, x_test=rng.integers(0, 256, (len(y_te), 32, 32, 3), np.uint8),
           y_test=y_te)
  sweep = load_config_file(os.path.join(CLAIMS, "table.py"), "cifar100")
  (run,) = [r for r in plan_lib.plan(sweep, str(tmp_path), configs_dir=EXPERIMENTS)
            if r.algorithm == "standalone" and r.seed == 0]
  c = config_lib.override(run.config, {
      "data.path": path, "data.subsample": 0, "data.public": 100, "num_rounds": 2,
      "local_epochs": 1, "models": "tiny", "data.augment": "none"})
  summary = loop.run(c, str(tmp_path / "run"), log=lambda s: None)
  assert summary["rounds_completed"] == 2
  assert summary["data"]["num_classes"] == 100


# ----------------------------------------------------------------------------- verdicts


def test_verdicts_follow_the_ledger_rules():
  verdict = verdicts.verdict
  assert verdict(8.0, 1.0, 13.1) == "reproduced"  # beyond 2 s.e., >= half the paper's
  assert verdict(5.0, 1.0, 13.1) == "same direction, smaller"
  assert verdict(1.9, 1.0, 13.1) == "not seen"
  assert verdict(-3.0, 1.0, 13.1) == "opposite"
  assert verdict(-10.0, 2.0, -18.76) == "reproduced"  # a negative claim
  assert verdict(0.5, 0.2, None) == "reproduced"  # a sign without a number
  assert verdict(0.5, 0.2, None, direction=-1) == "opposite"
  assert verdict(0.3, 0.2, None, direction=0) == "reproduced"  # no difference claimed
  assert verdict(0.5, 0.2, None, direction=0) == "differs"
  with pytest.raises(ValueError, match="two seeds"):
    verdict(1.0, float("nan"), 1.0)


def _ledger_runs(root):
  """table: standalone, fedmoe = standalone + 0.2 * round / 100 (seed-varied) at seeds
  0-2 for 12 rounds; clients: fedmoe beats standalone on 3 of 4 clients."""
  import json

  import numpy as np
  for method in ("standalone", "fedmoe"):
    for seed in range(3):
      workdir = os.path.join(root, "table", method, "cell", f"seed{seed}")
      os.makedirs(workdir)
      with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump({"algorithm": method, "seed": seed}, f)
      rows = [{"round": t, "mean_test_acc": 0.5 + (method == "fedmoe") * (0.002 + 0.001
                                                                          * seed) * t}
              for t in range(1, 13)]
      with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
      per_client = [0.5, 0.5, 0.5, 0.5] if method == "standalone" else [0.6, 0.7, 0.8, 0.4]
      with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump({"per_client_test_acc": list(np.asarray(per_client))}, f)


def test_claims_page_reads_rounds_and_links_figures_that_exist(tmp_path):
  results = str(tmp_path / "results")
  _ledger_runs(results)
  a, b = (claims.Group("table", m, "cell") for m in ("fedmoe", "standalone"))
  ledger = [
      claims.Claim("headline", "paper says +1", 1.0, "the cut", a, b, (4, 12),
                   ("experiments/claims/table.py",)),
      claims.Claim("per client", "76% of clients", 26.0, "the cut", a, b, (12,),
                   ("experiments/claims/table.py",), test="clients"),
      claims.Claim("not run", "a claim", None, "the cut",
                   claims.Group("p1_classes", "fedmoe", "4 classes"), b, (4,),
                   ("experiments/claims/p1_classes.py",)),
  ]
  runs = claim_runs.load_sweeps(results, ledger)
  (r4, r12) = verdicts.read(ledger[0], runs)
  # at round t seed s differs by (0.2 + 0.1 s) t points: mean 0.3 t, s.e. 0.1 t / sqrt(3)
  assert (r4.round, r12.round) == (4, 12)
  assert r4.mean == pytest.approx(1.2) and r12.mean == pytest.approx(3.6)
  assert r4.verdict == "reproduced" and r12.trend.direction == "rising"
  assert r12.trend.slope == pytest.approx(3.0)  # points per 10 rounds
  (clients,) = verdicts.read(ledger[1], runs)
  assert clients.mean == pytest.approx(25.0) and clients.se == 0.0  # 3/4 - 50%
  assert verdicts.read(ledger[2], runs) == []
  page = str(tmp_path / "docs" / "claims.md")
  os.makedirs(os.path.dirname(page))
  text = claims_page.render(ledger, runs, page_path=page,
                       figures_dir=os.path.join(results, "figures"), results=results,
                       notes=[("P5", "needs checkpoints")])
  assert "| **all** | **3** | **0** |" in text  # 3 claims, none at a shorter budget
  assert "3 claims, each counted once at its longest budget (2 with finished runs)" in text
  assert "| not run | a claim |" in text and "| pending |" in text
  assert ("| 12 | +3.60 ± 0.69 (n=3) | rising (+3.00 ± 0.58 / 10 rounds) | reproduced | "
          "fedmoe 53.6% (no floor: no partition.json); standalone 50.0% (no floor: no "
          "partition.json) |") in text
  assert "- **P5**: needs checkpoints" in text
  assert "`differs`, a claim of no difference with a difference beyond them." in text
  links = [line.split("](")[1].rstrip(")") for line in text.splitlines()
           if line.startswith("![")]
  assert len(links) == 2
  for link in links:  # every figure the page links exists, relative to the page
    assert os.path.exists(os.path.join(os.path.dirname(page), link)), link


def test_the_summary_counts_every_verdict_it_read():
  g = claims.Group("s", "fedmoe", "cell")
  three = [claims.Claim(f"c{i}", "p", None, "cut", g, g, (20,), ()) for i in range(3)]
  rows = [(c, [verdicts.Reading(20, None, 1.0, se, None, verdicts.claim_verdict(1.0, se, c))])
          for c, se in zip(three, (0.1, float("nan")))] + [(three[2], [])]
  assert [rs[0].verdict for _, rs in rows[:2]] == ["reproduced", verdicts.ONE_SEED]
  assert claims_page.counts_lines(rows)[2:] == [
      "| reproduced | 1 | 0 |", f"| {verdicts.ONE_SEED} | 1 | 0 |",
      f"| {claims_page.PENDING} | 1 | 0 |", "| **all** | **3** | **0** |"]


def test_a_figure_says_what_is_subtracted_from_what():
  built, naive = (claims.Group("s", "moss", s) for s in ("as built", "naive mapping"))
  ablation = claims.Claim("S2", "WIRE above naive", None, "the cut", built, naive, (20,), ())
  assert claims_page.figure_title(ablation) == "S2: moss\nas built minus naive mapping"
  assert claims_page.side_labels(ablation) == ("moss, as built", "moss, naive mapping")
  pair = claims.Claim("P1", "above FedProto", None, "the cut",
                      claims.Group("s", "fedmoe", "2 classes"),
                      claims.Group("s", "fedproto", "2 classes"), (20,), ())
  assert claims_page.figure_title(pair) == "P1: fedmoe minus fedproto\n2 classes"
  assert claims_page.side_labels(pair) == ("fedmoe", "fedproto")


def test_every_ledger_group_names_a_planned_cell(tmp_path):
  """Every claim's groups are (sweep file, method, setting) cells its sweep plans, and
  every claim names the sweep files that make its runs."""
  ledger = load_module(os.path.join(CLAIMS, "ledger.py"))
  cells, rounds = {}, {}
  for f in SWEEPS:
    sweep = load_config_file(os.path.join(CLAIMS, f))
    cells[f[:-3]] = {(r.algorithm, r.setting)
                     for r in plan_lib.plan(sweep, str(tmp_path), configs_dir=EXPERIMENTS)}
    rounds[f[:-3]] = sweep.base_overrides.num_rounds
  assert len({c.id for c in ledger.CLAIMS}) == len(ledger.CLAIMS)
  cells["paper_cpu"] = {(r.algorithm, r.setting) for r in plan_lib.plan(
      load_config_file(os.path.join(ROOT, "experiments", "sweeps", "paper_cpu.py")),
      str(tmp_path), configs_dir=EXPERIMENTS)}
  files = {"paper_cpu": "experiments/sweeps/paper_cpu.py"}
  for claim in ledger.CLAIMS:
    for sweep, method, setting in [c for g in (claim.a, claim.b) for c in g.cells]:
      name = sweep.removeprefix("claims/")
      assert (method, setting) in cells[name], (claim.id, sweep, method, setting)
      assert files.get(name, f"experiments/claims/{name}.py") in claim.sweep_files, claim.id
      # a claim reads its sweep's last round (T), or the T-round prefix of a 3 T run
      assert max(claim.rounds) == rounds.get(name, ledger.T_CELL), (claim.id, rounds)
  # the T-round cell's 5-seed methods are the ones cell_seeds.py runs, at other seeds
  cell_seeds = load_module(os.path.join(CLAIMS, "cell_seeds.py"))
  assert set(ledger.FIVE_SEEDS) == set(cell_seeds.ALGORITHMS)
  assert not set(cell_seeds.SEEDS) & set(load_config_file(os.path.join(
      ROOT, "experiments", "sweeps", "paper_cpu.py")).seeds)


def _target_runs(root):
  """fast reaches 0.8 at round 2 (seed 0) / 3 (seeds 1, 2); slow at round 4 / 6 / never
  (seed 2, in ``never``); communication 10 + 2 per round (slow: 1 per round); FLOPs per
  round 3e9 (fast) and 1e9 (slow) in costs.json."""
  import json
  reach = {"fast": (2, 3, 3), "slow": (4, 6, 99)}
  comm = {"fast": 2.0, "slow": 1.0}
  for method, rounds in reach.items():
    for seed, t_hit in enumerate(rounds):
      workdir = os.path.join(root, "s", method, "cell", f"seed{seed}")
      os.makedirs(workdir)
      with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump({"algorithm": method, "seed": seed}, f)
      rows = [{"round": t, "mean_test_acc": 0.9 if t >= t_hit else 0.5,
               "uplink_params": comm[method] * t, "downlink_params": 10.0, "wall_s": t}
              for t in range(1, 9)]
      with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
      with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump({"per_client_test_acc": [0.9, 0.9]}, f)
  with open(os.path.join(root, "s", "costs.json"), "w") as f:
    json.dump({"fast|cell": {"round_flops": 3e9}, "slow|cell": {"round_flops": 1e9}}, f)


def test_a_groups_more_seeds_are_its_runs_at_other_seeds(tmp_path):
  """Every ledger group's ``more`` cells plan the group's own runs at other seeds: the
  same config but the seed (e.g. m2_m3_fedmrl.py's d1=500 cell is P1's FedMRL 2/10)."""
  ledger = load_module(os.path.join(CLAIMS, "ledger.py"))

  def planned(sweep, method, setting):
    path = (os.path.join(ROOT, "experiments", "sweeps", "paper_cpu.py")
            if sweep == "paper_cpu" else os.path.join(ROOT, "experiments", f"{sweep}.py"))
    return {r.seed: flatten(r.config.to_dict()) for r in plan_lib.plan(
        load_config_file(path), str(tmp_path / sweep), configs_dir=EXPERIMENTS)
            if (r.algorithm, r.setting) == (method, setting)}
  pairs = {(g.cells[0], c) for claim in ledger.CLAIMS for g in (claim.a, claim.b)
           for c in g.cells[1:]}
  assert len(pairs) == len(ledger.FIVE_SEEDS) + len(ledger.MORE_SEEDS)
  for own, more in pairs:
    (seed, config), *_ = planned(*own).items()
    extra = planned(*more)
    assert extra, more
    for s, c in extra.items():
      assert c == {**config, "seed": s}, (own, more, s)


def _seed_runs(root, sweep, seeds, acc=0.5, by_seed=True):
  """Finished 2-round runs of method ``m`` in setting ``cell`` of ``root/sweep``, at
  ``seeds``: mean test accuracy ``acc`` at round 1, ``acc + seed / 100`` at round 2
  (``acc`` at both without ``by_seed``)."""
  import json
  for seed in seeds:
    workdir = os.path.join(root, sweep, "m", "cell", f"seed{seed}")
    os.makedirs(workdir)
    with open(os.path.join(workdir, "config.json"), "w") as f:
      json.dump({"algorithm": "m", "seed": seed}, f)
    with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps({"round": t, "mean_test_acc": acc + by_seed * seed / 100 * (t - 1)})
                   + "\n" for t in (1, 2))
    with open(os.path.join(workdir, "summary.json"), "w") as f:
      json.dump({"per_client_test_acc": [acc]}, f)


def test_a_group_reads_further_seeds_from_its_more_sweeps(tmp_path):
  """``Group.more``: a sweep that runs another's cell at new seeds adds them to the
  group (paired by seed with the other side); a seed in two of its cells is one run
  copied (kept once) or refused when their metrics differ."""
  results = str(tmp_path / "results")
  _seed_runs(results, "first", (0, 1, 2))
  _seed_runs(results, "more", (2, 3, 4))  # seed 2: a copy of first's
  _seed_runs(results, "base", (0, 1, 2, 3, 4), acc=0.4, by_seed=False)
  a = claims.Group("first", "m", "cell", (claims.Group("more", "m", "cell"),))
  b = claims.Group("base", "m", "cell")
  assert a.sweeps == ("first", "more") and str(a) == "m (first + more: cell)"
  claim = claims.Claim("five", "above", None, "cut", a, b, (2,), ())
  runs = claim_runs.load_sweeps(results, [claim])
  assert sorted(runs) == ["base", "first", "more"]
  assert sorted(r.seed for r in claim_runs.group_runs(runs, a)) == [0, 1, 2, 3, 4]
  (r,) = verdicts.read(claim, runs)
  np.testing.assert_allclose(r.diffs, [10 + s for s in range(5)])  # 10 + seed points
  # without ``more`` the same claim pairs the first sweep's three seeds
  (r3,) = verdicts.read(claims.Claim("three", "above", None, "cut",
                                   claims.Group("first", "m", "cell"), b, (2,), ()), runs)
  assert len(r3.diffs) == 3
  _seed_runs(results, "again", (2,), acc=0.6)  # seed 2 again, other metrics
  twice = claims.Group("first", "m", "cell", (claims.Group("again", "m", "cell"),))
  with pytest.raises(ValueError, match="seed 2 finished in .* with different metrics"):
    claim_runs.group_runs(claim_runs.load_sweeps(results, [claims.Claim(
        "twice", "above", None, "cut", twice, b, (2,), ())]), twice)
  with pytest.raises(ValueError, match="groups without a 'more'"):
    claims.Group("first", "m", "cell", (a,))


def test_cost_to_target_claims(tmp_path):
  results = str(tmp_path / "results")
  _target_runs(results)
  a, b = claims.Group("s", "fast", "cell"), claims.Group("s", "slow", "cell")

  def claim(measure, target=0.8, direction=1):
    return claims.Claim(f"to target {measure}", "fewer", None, "cut", a, b, (8,),
                        ("experiments/claims/table.py",), test="target", target=target,
                        measure=measure, direction=direction)
  runs = claim_runs.load_sweeps(results, [claim("rounds")])
  # seed 2 of slow never reaches 0.8: no verdict, and the page says how many seeds
  (r,) = verdicts.read(claim("rounds"), runs)
  assert r.verdict == verdicts.NOT_REACHED and r.round == 8
  assert r.diffs[:2].tolist() == [50.0, 50.0] and np.isnan(r.diffs[2])
  # at 0.4 every run reaches it at round 1: nothing saved in rounds, 3x the FLOPs
  (r,) = verdicts.read(claim("rounds", target=0.4), runs)
  assert r.mean == 0.0 and r.verdict == "not seen"
  (r,) = verdicts.read(claim("computation", target=0.4), runs)
  assert r.diffs.tolist() == [-200.0] * 3 and r.verdict == "opposite"
  # communication to round 1: fast 2 + 10, slow 1 + 10; a claim that A spends more
  (r,) = verdicts.read(claim("communication", target=0.4, direction=-1), runs)
  np.testing.assert_allclose(r.diffs, [100 * (11 - 12) / 11] * 3)
  assert r.verdict == "reproduced"
  page = str(tmp_path / "claims.md")
  text = claims_page.render([claim("rounds"), claim("computation", target=0.4)], runs,
                       page_path=page, figures_dir=str(tmp_path / "figures"),
                       results=results)
  assert "| 8 | 1 of 3 seeds did not reach it | – | target not reached in every run |" in text
  assert "-200.00 ± 0.00% of B's computation saved (n=3)" in text
  assert os.path.exists(tmp_path / "figures" / "to_target_rounds.png")
  with pytest.raises(ValueError, match="needs target in"):
    claim("rounds", target=80)
  with pytest.raises(ValueError, match="measure='time'"):
    claim("time")


def test_gate_weights_differ_beyond_chance():
  # groups explaining all the variance: eta^2 = 1, chance (k - 1) / (n - 1) = 1/3
  assert stats.excess_eta_squared([0, 0, 1, 1], ["a", "a", "b", "b"]) == pytest.approx(
      100 * (1 - 1 / 3))
  assert stats.excess_eta_squared([0, 1, 0, 1], ["a", "a", "b", "b"]) == pytest.approx(
      -100 / 3)  # none of it
  assert np.isnan(stats.excess_eta_squared([0, 1], ["a", "a"]))  # one group
  rng = np.random.default_rng(0)
  labels = np.repeat([0, 1], 50)
  # clients whose gates sit at different levels, with class effects inside the first
  samples = [(0.3 + 0.2 * labels + 0.01 * rng.standard_normal(100), labels),
             (0.7 + 0.01 * rng.standard_normal(100), labels)]
  assert claim_runs.gate_excess(samples, "clients") > 50
  by_class = claim_runs.gate_excess(samples, "classes")  # client 0: ~100, client 1: ~0
  assert 40 < by_class < 60


def test_gates_claim_reads_gates_json(tmp_path):
  import json

  rng = np.random.default_rng(1)
  for seed in range(3):
    workdir = tmp_path / "s" / "fedmoe" / "cell" / f"seed{seed}"
    os.makedirs(workdir)
    (workdir / "config.json").write_text(json.dumps({"algorithm": "fedmoe", "seed": seed}))
    (workdir / "metrics.jsonl").write_text(json.dumps({"round": 5, "mean_test_acc": 0.5})
                                           + "\n")
    (workdir / "summary.json").write_text(json.dumps({"per_client_test_acc": [0.5] * 3}))
    if seed < 2:  # seed 2 has no gates.json: not read
      (workdir / "gates.json").write_text(json.dumps({"round": 5, "clients": [
          {"alpha_global": (level + 0.01 * rng.standard_normal(20)).tolist(),
           "label": [0, 1] * 10} for level in (0.2, 0.5, 0.8)]}))
  group = claims.Group("s", "fedmoe", "cell")
  claim = claims.Claim("P5", "differ", None, "cut", group, group, (5,),
                       ("experiments/claims/table.py",), test="gates", measure="clients")
  runs = claim_runs.load_sweeps(str(tmp_path), [claim])
  (r,) = verdicts.read(claim, runs)
  assert len(r.diffs) == 2 and r.mean > 90 and r.verdict == "reproduced"
  text = claims_page.render([claim], runs, page_path=str(tmp_path / "claims.md"),
                       figures_dir=str(tmp_path / "figures"), results=str(tmp_path))
  assert "| fedmoe, cut | 5 |" in text and "points above chance (n=2)" in text
  assert os.path.exists(tmp_path / "figures" / "p5.png")
  with pytest.raises(ValueError, match="measure='rounds'"):
    claims.Claim("P5", "differ", None, "cut", group, group, (5,), (), test="gates",
                 measure="rounds")


def test_spearman_with_ties_by_hand():
  np.testing.assert_array_equal(stats.ranks([0.3, 0.1, 0.3, 0.2]), [3.5, 1, 3.5, 2])
  assert stats.spearman([1, 2, 3], [10, 20, 40]) == pytest.approx(1.0)
  assert stats.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
  # x ranks (1.5, 1.5, 3), y ranks (1, 2, 3): centred (-.5, -.5, 1), (-1, 0, 1)
  assert stats.spearman([5, 5, 7], [1, 2, 3]) == pytest.approx(1.5 / np.sqrt(1.5 * 2))
  assert np.isnan(stats.spearman([1, 1, 1], [1, 2, 3]))


def test_fidelity_claim_maps_types_to_clients(tmp_path):
  """Clients of 'tiny,tiny2' alternate types: the fidelity of group g goes to its clients."""
  import json

  accs = {0: [0.9, 0.5, 0.8, 0.4], 1: [0.5, 0.9, 0.4, 0.8]}  # seed 1: the other way
  for seed, acc in accs.items():
    workdir = tmp_path / "s" / "moss" / "cell" / f"seed{seed}"
    os.makedirs(workdir)
    (workdir / "config.json").write_text(json.dumps(
        {"algorithm": "moss", "seed": seed, "models": "tiny,tiny2", "num_clients": 4}))
    rows = [{"round": 1, "mean_test_acc": 0.5, "fidelity": [0.1, 0.2]},
            {"round": 2, "mean_test_acc": 0.6, "fidelity": [0.9, 0.3]}]
    (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (workdir / "summary.json").write_text(json.dumps({"per_client_test_acc": acc}))
  group = claims.Group("s", "moss", "cell")
  claim = claims.Claim("S5", "tracks", None, "cut", group, group, (2,),
                       ("experiments/claims/table.py",), test="fidelity")
  runs = claim_runs.load_sweeps(str(tmp_path), [claim])
  fid, acc = claim_runs.client_fidelity(claim_runs.group_runs(runs, group)[0])
  np.testing.assert_array_equal(fid, [0.9, 0.3, 0.9, 0.3])  # the last round's
  (r,) = verdicts.read(claim, runs)
  # fidelity ranks (3.5, 1.5, 3.5, 1.5); seed 0's accuracies agree, seed 1's disagree
  rho = 4 / np.sqrt(4 * 5)  # centred ranks (1, -1, 1, -1) and (1.5, -.5, .5, -1.5)
  np.testing.assert_allclose(r.diffs, [rho, -rho])
  assert r.verdict == "not seen"


def test_a_noisy_last_round_is_named_where_the_last_third_reads_otherwise(tmp_path):
  """A claim of no difference: rounds 1-11 sit 2.8-3.2 points below zero in every
  seed, round 12 jumps to +1 / -1 / 0: at round 12 the mean is 0 (``reproduced``);
  over rounds 9-12 it is -2.25 ± 0.20 (``differs``)."""
  import json

  results = str(tmp_path / "results")
  for setting, per_seed in (("b", [[0.0] * 12] * 3),
                            ("a", [[-3.0] * 11 + [1.0], [-3.2] * 11 + [-1.0],
                                   [-2.8] * 11 + [0.0]])):
    for seed, diffs in enumerate(per_seed):
      workdir = os.path.join(results, "abl", "moss", setting, f"seed{seed}")
      os.makedirs(workdir)
      with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump({"algorithm": "moss", "seed": seed}, f)
      with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps({"round": t, "mean_test_acc": 0.5 + d / 100}) + "\n"
                     for t, d in enumerate(diffs, start=1))
      with open(os.path.join(workdir, "summary.json"), "w") as f:
        json.dump({"per_client_test_acc": [0.5]}, f)  # finished
  a, b = claims.Group("abl", "moss", "a"), claims.Group("abl", "moss", "b")
  claim = claims.Claim("S4", "no difference claimed", None, "the cut", a, b, (12,), (),
                       direction=0)
  runs = claim_runs.load_sweeps(results, [claim])
  (r,) = verdicts.read(claim, runs)
  assert r.mean == pytest.approx(0.0, abs=1e-9) and r.verdict == "reproduced"
  assert (r.trend.first, r.trend.last) == (9, 12)
  assert r.trend.level == pytest.approx(-2.25) and r.window == "differs"
  assert r.trend.level_se == pytest.approx(0.35 / math.sqrt(3))  # seeds: -2.0, -2.65, -2.1
  assert claims_page.window_table([(claim, [r])])[2] == (
      "| S4 | round 12: reproduced (+0.00 ± 0.58) | rounds 9-12: differs (-2.25 ± 0.20) |")
  assert claims_page.window_lines([r]) == [
      "Round 12: +0.00 ± 0.58, reproduced; over rounds 9-12 (the last third), the mean "
      "difference -2.25 ± 0.20: differs."]
  page = str(tmp_path / "claims.md")
  text = claims_page.render([claim], runs, page_path=page,
                       figures_dir=os.path.join(results, "figures"), results=results)
  assert claims_page.window_lines([r])[0] in text.split("### S4")[1]  # the figure's text
  # where both readings agree, the page names nothing
  same = verdicts.Reading(12, r.diffs, r.mean, r.se, r.trend, "differs", "differs")
  assert claims_page.window_table([(claim, [same])]) == []


def test_a_failed_run_is_named_and_left_out_of_the_pairs(tmp_path):
  """A seed the sweep's results.csv records as failed (a non-finite state stopped it
  after round 1 of 2) is left out of the pairs and named in the summary and under the
  claim's figure, with where its metrics end; a seed that another cell of the group
  finished is not named."""
  import json

  from fedjax_het.sweeps import tables
  results = str(tmp_path / "results")
  csv_rows = []
  for setting, seeds in (("b", (0, 1, 2)), ("a", (0, 1, 2))):
    for seed in seeds:
      workdir = os.path.join(results, "abl", "moss", setting, f"seed{seed}")
      os.makedirs(workdir)
      with open(os.path.join(workdir, "config.json"), "w") as f:
        json.dump({"algorithm": "moss", "seed": seed}, f)
      failed = setting == "a" and seed == 1
      with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
        f.writelines(json.dumps({"round": t, "mean_test_acc": 0.5 + (setting == "a")
                                 * (0.01 + 0.001 * seed)}) + "\n"
                     for t in ((1,) if failed else (1, 2)))
      if not failed:
        with open(os.path.join(workdir, "summary.json"), "w") as f:
          json.dump({"per_client_test_acc": [0.5]}, f)
      csv_rows.append({"algorithm": "moss", "setting": setting, "seed": seed,
                       "status": "failed: FloatingPointError" if failed else "done",
                       "workdir": os.path.relpath(workdir, os.path.join(results, "abl"))})
  with open(os.path.join(results, "abl", "results.csv"), "w") as f:
    f.write(tables.csv_text(csv_rows))
  a, b = claims.Group("abl", "moss", "a"), claims.Group("abl", "moss", "b")
  claim = claims.Claim("S3", "no difference claimed", None, "the cut", a, b, (2,), (),
                       direction=0)
  runs = claim_runs.load_sweeps(results, [claim])
  failures = claim_runs.load_failures(results, [claim])
  assert [r["seed"] for r in failures["abl"]] == ["1"]
  (r,) = verdicts.read(claim, runs)
  np.testing.assert_allclose(r.diffs, [1.0, 1.2])  # seeds 0 and 2
  text = ("moss, a, seed 1 (failed: FloatingPointError; its metrics end at round 1)")
  assert claim_runs.failed_runs(a, failures, runs) == [text]
  assert claim_runs.failed_runs(b, failures, runs) == []
  page = claims_page.render([claim], runs, page_path=str(tmp_path / "claims.md"),
                       figures_dir=os.path.join(results, "figures"), results=results,
                       failures=failures)
  assert (f"Runs that failed are left out of their claims' pairs: S3: {text}."
          in page.split("## Every row")[0])
  assert f"Failed, so not read: {text}." in page.split("### S3")[1]
  without = claims_page.render([claim], runs, page_path=str(tmp_path / "c.md"),
                          figures_dir=os.path.join(results, "figures"), results=results)
  assert "Runs that failed" not in without and "Failed, so not read" not in without
  # seed 1 finished in another cell of the group: the failure is not the group's
  _seed = os.path.join(results, "more", "moss", "a", "seed1")
  os.makedirs(_seed)
  with open(os.path.join(_seed, "config.json"), "w") as f:
    json.dump({"algorithm": "moss", "seed": 1}, f)
  with open(os.path.join(_seed, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps({"round": t, "mean_test_acc": 0.511}) + "\n" for t in (1, 2))
  with open(os.path.join(_seed, "summary.json"), "w") as f:
    json.dump({"per_client_test_acc": [0.5]}, f)
  both = claims.Group("abl", "moss", "a", (claims.Group("more", "moss", "a"),))
  runs = claim_runs.load_sweeps(results, [claims.Claim("S3", "", None, "", both, b, (2,), ())])
  assert claim_runs.failed_runs(both, failures, runs) == []


def test_the_ledger_names_its_budgets_readings_and_opening_rows():
  """Every row has a budget; the opening's comparisons and the readings' rows exist;
  a comparison's rows at T and 3 T share their cell but for the rounds."""
  ledger = load_module(os.path.join(CLAIMS, "ledger.py"))
  ids = {c.id for c in ledger.CLAIMS}
  assert set(ledger.BUDGETS) == ids
  headlines = {c.headline for c in ledger.CLAIMS if c.headline}
  assert {n for _, names in ledger.OPENING for n in names} <= headlines
  for _, rows in ledger.READINGS:
    assert len(rows) == len(ledger.READING_NAMES)
    assert {r for r in rows if r} <= ids, rows
  n100 = [b for b in ledger.BUDGETS.values() if b[0].startswith("N=100")]
  assert n100 and all(b[1] == (100, 100, 5) and b[2] == (500, 400, 10) for b in n100)
  for name in ("S6 Moss vs FD", "S6 Moss vs FedKD", "S6 Moss vs FML",
               "S6 Moss vs LG-FedAvg"):
    assert name in headlines


def test_the_committed_ledger_gives_no_verdict_against_a_side_at_its_floor():
  """Over the committed results: every side of every row has its floor and both rates;
  a row with a side at its floor is ``uninformative``; the counts add up to the
  claims, each once."""
  ledger = load_module(os.path.join(CLAIMS, "ledger.py"))
  runs = claim_runs.load_sweeps(os.path.join(ROOT, "results"), ledger.CLAIMS)
  rows = [(c, verdicts.read(c, runs)) for c in ledger.CLAIMS]
  for c, found in rows:
    for r in found:
      assert r.sides and all(not math.isnan(s.floor) and s.guess <= s.floor
                             and s.commonest <= s.floor for s in r.sides), c.id
      if any(s.at_floor for s in r.sides):
        assert r.verdict == verdicts.UNINFORMATIVE, c.id
  table = claims_page.counts_lines(rows)
  claims_count = len({c.headline or c.id for c in ledger.CLAIMS})
  assert table[-1].startswith(f"| **all** | **{claims_count}** |")
  assert sum(int(line.split("|")[2]) for line in table[2:-1]) == claims_count
  sentences = claims_page.summary_lines(rows, ledger.BUDGETS, ledger.READINGS, ledger.NOTE,
                                        names=ledger.READING_NAMES)
  assert len(sentences) <= 5 and all(len(s.split()) <= 40 for s in sentences), sentences
