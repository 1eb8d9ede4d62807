"""benchmarks/compare.py and torch_reference.py at a tiny size: shapes of the table only.

No timing is asserted: these check that every implementation runs the same round, the
table has its rows and columns with positive finite numbers, and that the PyTorch
reference builds the same networks (parameter counts) as ours.
"""
import importlib.util
import math
import os
import re
import sys
import types

import jax
import jax.numpy as jnp
import pytest

from fedjax_het import packing
from fedjax_het.training import compile_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import compare  # noqa: E402

HAS_TORCH = importlib.util.find_spec("torch") is not None
TINY = compare.SIZES["tiny"].settings


def test_table_has_every_implementation():
  impls = [i for i in compare.IMPLS if HAS_TORCH or i != "torch"]
  rows = compare.compare(TINY, ["fedavg"], impls, arch="tiny", repeats=1, num_devices=1,
                         torch_threads=1)
  auto = f"ours-auto[{'sequential' if jax.default_backend() == 'cpu' else 'vmap'}]"
  assert [r.implementation for r in rows] == [auto] + impls[1:]
  for r in rows:
    assert r.setting == "N=2 C=100% n=20 B=10" and r.algorithm == "fedavg"
    for v in (r.seconds, r.examples_per_s, r.tflops):
      assert math.isfinite(v) and v > 0
    assert math.isfinite(r.vs_torch) == HAS_TORCH
  table = compare.format_table(rows).splitlines()
  assert [c.strip() for c in table[0].strip("|").split("|")] == list(compare.COLUMNS)
  assert len(table) == 2 + len(rows)
  assert compare.auto_vs_loop(rows)[0].startswith("N=2 C=100% n=20 B=10 fedavg: ours-auto")


@pytest.mark.parametrize("algorithm", ["fedmrl", "fedmoe"])
def test_per_client_trainer_keeps_state_shapes(algorithm):
  """The jit-per-client step (traced, not compiled) returns the client state's tree and
  an upload shaped like the server's shared part."""
  exp = compare.build(TINY[0], algorithm, arch="tiny", num_devices=1)
  state = jax.eval_shape(exp.algorithm.init, jax.random.PRNGKey(0))
  client = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype),
                        packing.as_tree(state.clients[0]))
  train = compare.client_trainer(compare.client_problem(exp), 0, exp.runtime)
  index = exp.data.groups[0]
  new, upload = jax.eval_shape(train, client, state.server, exp.data.x, exp.data.y,
                               index.train_idx[0], index.train_mask[0],
                               jax.random.PRNGKey(1))
  assert jax.tree.structure(new) == jax.tree.structure(client)
  assert jax.tree.map(lambda a: a.shape, new) == jax.tree.map(lambda a: a.shape, client)
  assert jax.tree.map(lambda a: a.shape, upload) == jax.tree.map(lambda a: a.shape,
                                                                   state.server)


def test_flop_count_matches_xla():
  """The analytic count is within 5% of XLA's for one CNN-1 FedMRL training step."""
  exp = compare.build(TINY[0], "fedmrl", num_devices=1)
  problem = compare.client_problem(exp)
  state = jax.eval_shape(exp.algorithm.init, jax.random.PRNGKey(0))
  client = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape[1:], a.dtype),
                        packing.as_tree(state.clients[0]))
  batch = compare.cl.Batch(jnp.zeros((8, 32, 32, 3)), jnp.zeros(8, jnp.int32),
                           jnp.ones(8, bool))

  def grads(client, server):
    params, model_state, _ = problem.start(client, server)
    return jax.grad(lambda p: problem.loss_fns[0](p, model_state, batch, None)[0])(params)

  cost = jax.jit(grads).lower(client, state.server).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  analytic = 8 * compare.train_flops_per_example("fedmrl")
  assert abs(cost["flops"] / analytic - 1) < 0.05


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (pip install -e '.[bench]')")
def test_torch_reference_matches_our_networks(monkeypatch):
  import torch_reference as tr

  from fedjax_het.models import count_params

  for algorithm in tr.ALGORITHMS:
    exp = compare.build(TINY[0], algorithm, num_devices=1)
    state = jax.eval_shape(exp.algorithm.init, jax.random.PRNGKey(0))
    ours = state.server if algorithm == "fedavg" else state.clients[0].unpack().params
    ours_client = count_params(ours) // (1 if algorithm == "fedavg" else
                                         exp.runtime.layout.padded_sizes[0])
    client = tr.make_client(algorithm)
    assert tr.count_params(client) == ours_client
    assert tr.count_params(tr.shared_module(client)) == count_params(state.server)
  # a clock of our own: the three timed rounds read 1, 5 and 2 s; time_round returns
  # their median
  readings = iter([0.0, 1.0, 10.0, 15.0, 20.0, 22.0])
  monkeypatch.setattr(tr, "time", types.SimpleNamespace(perf_counter=lambda: next(readings)))
  sec = tr.time_round("fedmrl", clients=2, examples=20, batch=10, device="cpu",
                      arch="tiny", threads=1, repeats=3, warmup=0)
  assert sec == 2.0


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (pip install -e '.[bench]')")
def test_protocol_table_times_our_run_and_torch_on_the_same_clients(tiny_config, tmp_path):
  """--protocol: one row for ours and one per torch thread count, positive figures; the
  torch loop gets every client with its own architecture and examples."""
  config = tiny_config("fedmrl", models="tiny,tiny2",
                       overrides={"num_clients": 4, "algo.small_arch": "tiny",
                                  "algo.d1": 16})
  exp = compare.experiment.prepare(compare.validation.with_algo_defaults(config))
  clients = compare.protocol_clients(exp)
  assert [c[0] for c in clients] == ["tiny", "tiny2", "tiny", "tiny2"]
  index = exp.data.groups[0]
  assert len(clients[0][1]) == int(index.num_train[0])
  assert len(clients[0][3]) == int(index.num_test[0])
  table = compare.protocol_table(config, rounds=1, repeats=1, torch_threads=[1],
                                 workdir=str(tmp_path)).splitlines()
  assert [row.split("|")[2].strip() for row in table[2:]] == ["ours", "torch-1t"]
  for row in table[2:]:
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert float(cells[2]) > 0 and 0 <= float(cells[6]) <= 1
  assert float(table[2].split("|")[5]) > 0  # our compile seconds


@pytest.mark.skipif(not HAS_TORCH, reason="torch is not installed (pip install -e '.[bench]')")
def test_torch_protocol_federation_standalone_and_fedmrl():
  """The torch loop of --protocol: a round trains and evaluates every client; FedMRL's
  shared small model ends as the example-weighted mean of the clients' copies."""
  import numpy as np
  import torch
  import torch_reference as tr

  rng = np.random.default_rng(0)
  data = lambda n: (rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
                    rng.integers(0, 10, n))
  clients = [("tiny", *data(n), *data(5)) for n in (12, 20)]
  for algorithm in tr.PROTOCOL_ALGORITHMS:
    walls, cpus, acc = tr.time_protocol(algorithm, clients, rounds=1, warmup=0, threads=1,
                                        batch=8, momentum=0.9, weight_decay=1e-3,
                                        grad_clip=50.0, d1=16, small_arch="tiny",
                                        device="cpu")
    assert walls[0] > 0 and cpus[0] > 0 and 0 <= acc <= 1
  fed = tr.ProtocolFederation("fedmrl", clients, batch=8, d1=16, small_arch="tiny",
                              evaluate=False, device="cpu")  # keeps the trained copies
  fed.round()
  for name, v in fed.global_state.items():
    mean = sum(n * m.small.state_dict()[name] for n, m in zip((12, 20), fed.models)) / 32
    torch.testing.assert_close(v, mean)


def test_compare_times_the_settings_asked_for(capsys):
  """``--settings`` picks the size's settings by position (a GPU lease that timed the
  first can time the others alone); a position out of range is refused with the list."""
  assert compare.parse_args(["--size=paper"]).settings == [1, 2, 3]
  assert compare.parse_args(["--size=paper", "--settings=2,3"]).settings == [2, 3]
  for bad in ("4", "0", "two"):
    with pytest.raises(SystemExit):
      compare.parse_args(["--size=paper", f"--settings={bad}"])
  err = capsys.readouterr().err
  assert "4 is not between 1 and 3" in err and "N=1000 C=10% n=500 B=50" in err
  assert "comma-separated integers" in err


def test_init_compile_times_each_level_and_compares_bits(synthetic_npz, capsys):
  import init_compile
  config = os.path.join(ROOT, "experiments", "standalone.py") + ":smoke"
  init_compile.main([f"--config={config}", f"--set=data.path={synthetic_npz}",
                     "--set=models=tiny", "--levels=1"])
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 2
  assert lines[0].startswith("standalone N=5 tiny on cpu | default level: compile ")
  # the suite's backend compiles at level 1 (conftest): level 1 is its default, bit for bit
  assert lines[1].startswith("standalone N=5 tiny on cpu | level 1: compile ")
  assert lines[1].endswith("same bits in 12 of 12 leaves (largest difference 0.0e+00)")
  with pytest.raises(SystemExit):
    init_compile.main(["--sweep=experiments/claims/p1_classes.py"])  # no --algorithm
  assert "give --config, or --sweep with --algorithm" in capsys.readouterr().err


def test_compile_time_stages_init_and_dispatch_of_one_and_of_several_seeds(synthetic_npz,
                                                                          capsys):
  """A line per program naming the run, the switches in force and every stage's seconds;
  ``--seeds=2`` stages the replica axis's dispatch; bad arguments are refused first."""
  import compile_time
  config = os.path.join(ROOT, "experiments", "standalone.py") + ":smoke"
  sets = [f"--set=data.path={synthetic_npz}", "--set=models=tiny"]
  number = r"\d+\.\d+"
  for seeds in (1, 2):
    compile_time.main([f"--config={config}", *sets, f"--seeds={seeds}"])
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    plural = "s" if seeds > 1 else ""
    name = (r"standalone N=5 tiny sequential on cpu \(XLA_FLAGS .+, threefry kernel off, "
            r"dispatch options none\)")
    size = (r"\d+ StableHLO ops, largest computation \d+ \(\d+ computations; as written "
            r"\d+ ops, largest \d+\)")
    sizes = rf" \| cpu: {size}; cuda: {size}"
    kernels = r"[1-9]\d* fused computations, [1-9]\d* distinct kernels"
    assert re.fullmatch(rf"{name} \| init: trace {number} s, lower {number} s, compile "
                        rf"{number} s, run {number} s, temporaries {number} MB, {kernels}{sizes}",
                        lines[0])
    assert re.fullmatch(rf"{name} \| dispatch of {seeds} seed{plural}: trace {number} s, "
                        rf"lower {number} s, compile {number} s, first round {number} s, "
                        rf"then {number} s a round, temporaries {number} MB, {kernels}{sizes}",
                        lines[1])
  # --no_compile: the dispatch's sizes and its trace and lower seconds only
  compile_time.main([f"--config={config}", *sets, "--no_compile"])
  lines = capsys.readouterr().out.splitlines()
  for line, program in zip(lines, ("init", "dispatch of 1 seed")):
    assert re.fullmatch(rf"{name} \| {program}: trace {number} s, lower {number} s, "
                        rf"not compiled{sizes}", line)
  # --kernel_kinds: a line more after each program, its distinct kernels by kind
  compile_time.main([f"--config={config}", *sets, "--kernel_kinds"])
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 4
  kind = r"[1-9]\d* [a-z\-]+"
  for line, program in ((lines[1], "init"), (lines[3], "dispatch of 1 seed")):
    assert re.fullmatch(rf"{name} \| {program} kernels by kind: {kind}(, {kind})*", line)
  distinct = int(re.search(r"(\d+) distinct kernels", lines[2]).group(1))
  assert sum(map(int, re.findall(r"(\d+) [a-z\-]+", lines[3].split("kernels by kind: ")[1]))) == distinct
  # --group_programs: each group's round and evaluation compiled as a program of its own
  compile_time.main([f"--config={config}", *sets, "--group_programs"])
  lines = capsys.readouterr().out.splitlines()
  assert len(lines) == 3
  assert re.fullmatch(rf"{name} \| 2 group computations as programs of their own: trace "
                      rf"{number} s, lower {number} s, compile {number} s one after "
                      rf"another \(largest {number} s\), {number} s on \d+ threads \| "
                      r"cuda: \d+ StableHLO ops as written, largest computation \d+",
                      lines[2])
  for bad, says in ((["--sweep=experiments/claims/p1_classes.py"],
                     "give --config, or --sweep with --algorithm"),
                    ([f"--config={config}", "--seeds=0"], "--seeds=0: must be >= 1"),
                    ([f"--config={config}", "--seeds=2", "--group_programs"],
                     "--group_programs compiles one seed's programs")):
    with pytest.raises(SystemExit):
      compile_time.main(bad)
    assert says in capsys.readouterr().err


SWEEP = """import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.algorithms = ["standalone"]
  c.variant = "smoke"
  c.settings = ml_collections.ConfigDict({"N=4": {"num_clients": 4}},
                                         allow_dotted_keys=True)
  c.seeds = (0, 1)
  c.base_overrides = ml_collections.ConfigDict(
      {"data": {"path": %r}, "models": "tiny", "runtime": {"num_devices": 1}})
  c.algorithm_overrides = ml_collections.ConfigDict({}, allow_dotted_keys=True)
  return c
"""


@pytest.mark.parametrize("way", ["both", "replica"])
def test_replicas_times_each_way_and_reports_the_peak_memory(tmp_path, synthetic_npz,
                                                             capsys, way):
  import replicas
  sweep = tmp_path / "sweep.py"
  sweep.write_text(SWEEP % synthetic_npz)
  settings = compile_cache.settings()
  replicas.main([f"--sweep={sweep}", "--algorithm=standalone", "--seeds=0,1",
                 "--rounds=1", f"--way={way}"])
  # its own cache (deleted) does not outlive it in the suite's process
  assert compile_cache.settings() == settings
  lines = capsys.readouterr().out.splitlines()
  assert lines[0] == "standalone | N=4 | seeds 0,1 | 1 rounds"
  assert lines[-1].startswith(f"peak resident memory of this process ({way}): ")
  assert float(lines[-1].split(": ")[1].split()[0]) > 0
  finals = r"final mean test acc per seed \d+\.\d\d / \d+\.\d\d %"
  if way == "both":
    assert re.fullmatch(r"separate runs: \d+\.\d s", lines[1])
    m = re.fullmatch(r"replica axis: \d+\.\d s; separate / replica = \d+\.\d\dx; "
                     + finals + r", largest difference to the separate runs "
                     r"(\d+\.\d+) points", lines[2])
    assert m and float(m.group(1)) < 0.01, lines[2]
  else:
    assert len(lines) == 3
    assert re.fullmatch(r"replica axis: \d+\.\d s; " + finals, lines[1])
