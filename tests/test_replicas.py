"""Seeds on a replica axis (``loop.run_seeds``), evaluation inside the dispatch, deadlines."""
import functools
import json
import os
import re
import time

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import SHARDED
from conftest import make_tiny_config

from fedjax_het import sharding
from fedjax_het.algorithms import State
from fedjax_het.data import federated
from fedjax_het.sweeps import runner
from fedjax_het.sweeps.plan import Run
from fedjax_het.training import checkpoint as ckpt_lib
from fedjax_het.training import experiment
from fedjax_het.training import loop
from fedjax_het.training import program
from fedjax_het.training import runfiles

# programs that compile far longer than they run: level 0 (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("compile_bound")

# the algorithms a sweep names (``standalone``) are config files here
EXPERIMENTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                           "experiments")


def _rows(workdir):
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    return [json.loads(line) for line in f]


def _assert_same_rows(a, b, tol=1e-5):
  assert [r["round"] for r in a] == [r["round"] for r in b]
  for ra, rb in zip(a, b):
    assert set(ra) == set(rb)
    for key in ra:
      if key != "wall_s":
        np.testing.assert_allclose(ra[key], rb[key], atol=tol, err_msg=key)


@pytest.fixture
def threefry():
  """The default PRNG (the suite uses 'unsafe_rbg'): a longer shape's draws start with a
  shorter one's, which is what makes padded replica tables train like the originals."""
  with jax.default_prng_impl("threefry2x32"):
    yield


def test_pad_examples_keeps_entries_and_masks():
  index = federated.ClientIndex(
      train_idx=np.array([[3, 4, 0]], np.int32), train_mask=np.array([[1, 1, 0]], bool),
      test_idx=np.array([[5, 0]], np.int32), test_mask=np.array([[1, 0]], bool),
      num_train=np.array([2], np.int32), num_test=np.array([1], np.int32))
  padded = federated.pad_examples(index, 5, 4)
  np.testing.assert_array_equal(padded.train_idx, [[3, 4, 0, 0, 0]])
  np.testing.assert_array_equal(padded.train_mask, [[1, 1, 0, 0, 0]])
  np.testing.assert_array_equal(padded.test_mask, [[1, 0, 0, 0]])
  np.testing.assert_array_equal(padded.num_train, [2])
  with pytest.raises(ValueError, match="cannot pad"):
    federated.pad_examples(index, 2, 4)


def test_stack_replicas_shares_an_identical_pool():
  x, y = np.zeros((6, 2, 2, 1), np.uint8), np.arange(6) % 2
  d0, _ = federated.build_federated_data(x, y, [np.arange(2), np.arange(2, 3)],
                                         [[4], [5]], ["a", "a"], num_classes=2)
  d1, _ = federated.build_federated_data(x, y, [np.arange(1), np.arange(1, 4)],
                                         [[4], [5]], ["a", "a"], num_classes=2)
  data, axes = federated.stack_replicas([d0, d1])
  assert axes.x is None and data.x.shape == x.shape
  assert data.groups[0].train_idx.shape == (2, 2, 3)  # [replicas, clients, widest]
  np.testing.assert_array_equal(data.groups[0].train_idx[0], [[0, 1, 0], [2, 0, 0]])
  np.testing.assert_array_equal(data.groups[0].num_train, [[2, 1], [1, 3]])
  d2 = d1.replace(x=x + 1)
  data, axes = federated.stack_replicas([d0, d2])
  assert axes.x == 0 and data.x.shape == (2,) + x.shape


def _config(tiny_config, seed, **overrides):
  return tiny_config("fedmrl", "tiny,tiny2", overrides={
      "seed": seed, "num_rounds": 3, "participation": 0.5, "momentum": 0.9,
      "data.augment": "flip_crop_erase", "checkpoint_every": 2, **overrides})


SEEDS = (0, 1)


@pytest.fixture(scope="module")
def separate_runs(tiny_npz, tmp_path_factory):
  """``[(workdir, summary)]``: plain runs of ``_config``'s seeds 0 and 1 (threefry keys,
  one device), made once for the tests that hold a batch of those seeds against them
  and for the deadline test (seed 0 is its uninterrupted run). The tests that use it or
  its program are one xdist group: one worker runs them, in this file's order."""
  root = tmp_path_factory.mktemp("separate")
  make = functools.partial(make_tiny_config, tiny_npz)
  with jax.default_prng_impl("threefry2x32"):
    return [(root / f"sep{s}", loop.run(_config(make, s), str(root / f"sep{s}"),
                                         log=lambda _: None)) for s in SEEDS]


def test_map_replicas_sequential_equals_vmap_with_shared_and_stacked_data():
  data = federated.FederatedData(
      x=np.arange(6.0).reshape(3, 2),  # shared (axis None)
      y=np.array([[1.0, 2.0], [3.0, 4.0]]),  # stacked: replica r reads row r
      groups=())
  axes = federated.FederatedData(x=None, y=0, groups=())
  state = np.array([10.0, 20.0])
  fn = lambda s, d: (s + d.x.sum() * d.y[0], d.y * s)  # noqa: E731
  outs = [jax.jit(program.map_replicas(fn, axes, p))(state, data)
          for p in ("sequential", "vmap")]
  chex.assert_trees_all_close(outs[0], outs[1])
  chex.assert_trees_all_close(outs[0][0], np.array([10.0 + 15.0, 20.0 + 45.0]))
  chex.assert_shape(outs[0][1], (2, 2))


def test_sequential_replicas_overwrite_the_stacked_state_in_place():
  """Inside a dispatch's loop XLA:CPU's sequential map holds no second stacked state:
  each replica's new state overwrites its slot (a lax.map's outputs were a new S x state
  buffer every round: 4.7 GiB more for an N = 100 FedMRL pair), and it traces the
  function once."""
  num, size = 3, 1 << 18
  axes = federated.FederatedData(x=None, y=0, groups=())
  data = federated.FederatedData(x=np.zeros(2, np.float32),
                                 y=np.ones((num, 2), np.float32), groups=())
  traces = []

  def fn(s, d):
    traces.append(s.shape)
    return jnp.sin(s) * d.y[0], jnp.sum(s)
  state = jax.ShapeDtypeStruct((num, size), jnp.float32)
  temp, traced = {}, {}
  for p in ("sequential", "vmap"):
    mapped = program.map_replicas(fn, axes, p)
    rounds = lambda s, d, n, mapped=mapped: jax.lax.fori_loop(  # noqa: E731
        0, n, lambda i, s: mapped(s, d)[0], s)
    traces.clear()
    compiled = jax.jit(rounds, donate_argnums=0).lower(state, data, 2).compile()
    temp[p], traced[p] = compiled.memory_analysis().temp_size_in_bytes, len(traces)
  assert temp["sequential"] < size * 4, temp  # not even one replica's state
  assert traced == {"sequential": 1, "vmap": 1}, traced
  assert temp["vmap"] < size * 4, temp
  x = np.arange(num * 4, dtype=np.float32).reshape(num, 4)
  outs = [jax.jit(program.map_replicas(fn, axes, p))(x, data) for p in ("sequential", "vmap")]
  chex.assert_trees_all_close(outs[0], outs[1])


def test_replica_state_frees_each_seed_once_stacked():
  mesh = sharding.client_mesh(1)
  shared = jnp.full((2,), 7.0)  # one array in two places of a seed's state: freed once
  states = [State(round=jnp.int32(3), rng=jnp.arange(2, dtype=jnp.uint32) + s,
                  clients=({"w": jnp.full((4, 3), float(s))},),
                  server={"a": shared if s == 0 else jnp.zeros(2),
                          "b": shared if s == 0 else jnp.ones(2)})
           for s in range(2)]
  leaves = [jax.tree.leaves(s) for s in states]
  stacked = program.replica_state(states, mesh)
  chex.assert_trees_all_equal(stacked.clients[0]["w"][1], np.ones((4, 3)))
  chex.assert_trees_all_equal(stacked.server["a"], np.array([[7.0, 7.0], [0.0, 0.0]]))
  chex.assert_trees_all_equal(stacked.server["b"], np.array([[7.0, 7.0], [1.0, 1.0]]))
  chex.assert_shape(stacked.round, (2,))
  assert all(a.is_deleted() for seed in leaves for a in seed)


# CPU's auto: a lax.map, on one device; vmap (an accelerator's auto) on the client axis
# sharded over the 4 forced devices. Either batch is held against the same separate
# runs: plain ones (auto, one device), which both parametrisations share.
@pytest.mark.xdist_group("replica_axis")
@pytest.mark.parametrize("parallelism,devices", [("auto", {}), ("vmap", SHARDED)],
                         ids=["auto", "vmap"])
def test_seeds_on_a_replica_axis_equal_separate_runs(tiny_config, tmp_path, separate_runs,
                                                     threefry, parallelism, devices):
  configs = [_config(tiny_config, s, **devices) for s in SEEDS]
  for c in configs:
    c.runtime.client_parallelism = parallelism
  widths = {tuple(g.train_idx.shape[1] for g in experiment.prepare(c, place=False).data.groups)
            for c in configs}
  assert len(widths) > 1  # the seeds' tables have other widths: padding is exercised
  lines = []
  batched = loop.run_seeds(configs, [str(tmp_path / f"bat{s}") for s in SEEDS],
                           log=lines.append)
  assert "seeds 0, 1 on a replica axis" in lines[0]
  assert any(line.startswith("round 1/3 | mean test acc ") and "/" in line.split("|")[1]
             for line in lines)
  for s, (sep_dir, a), b in zip(SEEDS, separate_runs, batched):
    _assert_same_rows(_rows(sep_dir), _rows(tmp_path / f"bat{s}"))
    np.testing.assert_allclose(a["per_client_test_acc"], b["per_client_test_acc"],
                               atol=1e-6)
    assert b["timing"]["replicas"] == 2 and b["config"]["seed"] == s
    assert set(os.listdir(tmp_path / f"bat{s}")) == set(os.listdir(sep_dir))


# Its batch is the [auto] batch's program and its resumed seed the separate runs' (3 and 4
# rounds size a dispatch alike: program.dispatch_rows); after them in the same worker, the
# persistent compilation cache serves both.
@pytest.mark.xdist_group("replica_axis")
def test_a_seed_of_a_batch_resumes_alone(tiny_config, tmp_path, threefry):
  configs = [_config(tiny_config, s) for s in SEEDS]
  loop.run_seeds(configs, [str(tmp_path / f"s{s}") for s in SEEDS], log=lambda _: None)
  longer = _config(tiny_config, 1, num_rounds=4)  # num_rounds may change on resume
  lines = []
  loop.run(longer, str(tmp_path / "s1"), log=lines.append)
  assert lines[0].startswith(f"resumed from round 3 in {tmp_path / 's1'}")
  assert [r["round"] for r in _rows(tmp_path / "s1")] == [1, 2, 3, 4]


@pytest.mark.xdist_group("replica_axis")  # the separate runs' program, as above
def test_run_seeds_refuses_other_differences_and_unaligned_checkpoints(tiny_config,
                                                                       tmp_path, threefry):
  a, b = _config(tiny_config, 0), _config(tiny_config, 1, learning_rate=0.1)
  with pytest.raises(ValueError, match=r"differ only in `seed`.*learning_rate"):
    loop.run_seeds([a, b], [str(tmp_path / "a"), str(tmp_path / "b")])
  with pytest.raises(ValueError, match="workdirs must differ"):
    loop.run_seeds([a, a], [str(tmp_path / "a"), str(tmp_path / "a")])
  with pytest.raises(loop.DeadlineReached):  # seed 1 is at round 1 (checkpointed)
    loop.run(_config(tiny_config, 1), str(tmp_path / "b"), log=lambda _: None,
             deadline=time.time())
  with pytest.raises(loop.SeedsNotAligned, match=r"different rounds \(\[0, 1\]\)"):
    loop.run_seeds([a, _config(tiny_config, 1)], [str(tmp_path / "a"), str(tmp_path / "b")])


def test_evaluation_inside_the_dispatch_equals_the_host_evaluation(tiny_config, tmp_path):
  config = tiny_config("fedmoe", "tiny,tiny2", overrides={"num_rounds": 3, "eval_every": 2})
  summary = loop.run(config, str(tmp_path / "run"), log=lambda _: None)
  assert [r["round"] for r in _rows(tmp_path / "run")] == [2, 3]
  exp = experiment.prepare(config)
  fns = program.compile_fns(exp)
  evaluate, abstract = fns.evaluate, fns.abstract
  ckpt = ckpt_lib.Checkpointer(str(tmp_path / "run" / "checkpoints"), max_to_keep=2,
                               fingerprint=runfiles.fingerprint(exp))
  state, _ = ckpt.restore_latest(abstract)
  ckpt.close()
  acc = program.per_client_accuracy(exp, evaluate(state, exp.data))
  np.testing.assert_allclose(summary["per_client_test_acc"], acc, atol=1e-7)
  np.testing.assert_allclose(summary["final_mean_test_acc"], acc.mean(), atol=1e-6)


def test_log_every_bounds_the_rounds_between_progress_lines(tiny_config, tmp_path):
  config = tiny_config(overrides={"num_rounds": 4, "eval_every": 4, "log_every": 1,
                                  "checkpoint_every": 0})
  lines = []
  loop.run(config, str(tmp_path / "run"), log=lines.append)
  assert [line.split(" |")[0] for line in lines if line.startswith("round ")] == [
      "round 1/4", "round 2/4", "round 3/4", "round 4/4"]


# seed 0 of the separate runs is the uninterrupted run (checkpoints change no metric)
@pytest.mark.xdist_group("replica_axis")
def test_deadline_checkpoints_and_the_rerun_continues(tiny_config, tmp_path, separate_runs,
                                                      threefry):
  config = _config(tiny_config, 0, checkpoint_every=0)
  full_dir, full = separate_runs[0]
  with pytest.raises(loop.DeadlineReached, match="after round 1 of 3") as err:
    loop.run(config, str(tmp_path / "part"), log=lambda _: None, deadline=time.time())
  assert err.value.round == 1
  assert os.listdir(tmp_path / "part" / "checkpoints") == ["1"]
  resumed = loop.run(config, str(tmp_path / "part"), log=lambda _: None)
  _assert_same_rows(_rows(full_dir), _rows(tmp_path / "part"), tol=0)
  assert resumed["per_client_test_acc"] == full["per_client_test_acc"]


def _fake_runs():
  return [Run(a, s, seed, None, f"/x/{a}/{s}/{seed}")
          for s in ("N=10", "N=50") for seed in (0, 1, 2) for a in ("fd", "fedmrl")]


def test_batches_group_a_cells_unfinished_seeds_in_order():
  runs = _fake_runs()
  done = [None] * len(runs)
  done[0] = {"finished": True}  # fd N=10 seed 0
  assert runner.batches(runs, done, 1)[:2] == [[1], [2]]
  assert runner.batches(runs, done, 2) == [[1, 3], [2, 4], [5], [6, 8], [7, 9], [10],
                                           [11]]
  by_method_first = runner.batches(runs, done, 3,
                                   order=lambda r: (r.algorithm != "fedmrl", r.seed))
  assert by_method_first == [[1, 3, 5], [7, 9, 11], [6, 8, 10], [2, 4]]  # by first seed
  assert runner.batch_prefix([1, 3, 5], 12, runs) == "[2,4,6/12] fedmrl | N=10 | seeds 0,1,2"
  cell = [Run("fedmrl", "N=10", seed, None, "") for seed in (0, 1, 2)]
  assert runner.batch_prefix([0, 1, 2], 3, cell) == "[1-3/3] fedmrl | N=10 | seeds 0,1,2"


def test_sweep_stops_at_its_deadline_and_continues(synthetic_npz, tmp_path):
  import ml_collections
  sweep = ml_collections.ConfigDict({
      "algorithms": ["standalone"], "variant": "smoke",
      "settings": {"N=4": {"num_clients": 4, "models": "tiny", "num_rounds": 2}},
      "seeds": (0, 1),
      "base_overrides": ml_collections.ConfigDict({"data.path": synthetic_npz},
                                                  allow_dotted_keys=True)})
  with pytest.raises(ValueError, match=r"keep_checkpoints='some'; valid: \['all'"):
    runner.run_sweep(sweep, str(tmp_path / "refused"), keep_checkpoints="some",
                     configs_dir=EXPERIMENTS)
  assert not os.path.exists(tmp_path / "refused")  # before anything runs
  lines = []
  rows = runner.run_sweep(sweep, str(tmp_path), log=lines.append, deadline=time.time(),
                          configs_dir=EXPERIMENTS)
  assert rows == [] and "the time budget is used up; 2 runs left" in lines[-1]
  rows = runner.run_sweep(sweep, str(tmp_path), log=lines.append, seed_batch=2,
                          configs_dir=EXPERIMENTS, keep_checkpoints="none")
  assert [(r["seed"], r["status"]) for r in rows] == [(0, "done"), (1, "done")]
  for seed in (0, 1):  # finished: its checkpoints removed, as asked
    assert "checkpoints" not in os.listdir(tmp_path / "standalone" / "n4" / f"seed{seed}")
  assert any(re.search(r"done in .* \| checkpoints pruned to 'none': [\d.]+ MiB freed \|",
                       line) for line in lines)
  assert any("[1-2/2] standalone | N=4 | seeds 0,1 | start" in line for line in lines)
