"""Freed host memory handed back to the system between dispatches."""
import chex
import jax
import numpy as np

from fedjax_het.training import experiment
from fedjax_het.training import host_memory
from fedjax_het.training import loop
from fedjax_het.training import program


def _resident() -> int:
  with open("/proc/self/status") as f:
    return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


def test_release_freed_returns_the_heaps_free_pages():
  baseline = _resident()
  blocks = [np.ones(100_000 // 8) for _ in range(2000)]  # 100 kB each: malloc's heap
  kept = blocks[::10]  # 20 MB between the freed blocks: free() alone cannot shrink it
  del blocks
  assert _resident() - baseline > 150 * 2**20  # 180 MB freed, still resident
  assert host_memory.release_freed()
  assert _resident() - baseline < 60 * 2**20
  assert len(kept) == 200


def test_the_loop_releases_after_the_init_and_every_dispatch(tiny_config, tmp_path, monkeypatch):
  released, dispatches = [], []
  monkeypatch.setattr(host_memory, "release_freed", lambda: released.append(1) or True)
  loop.run(tiny_config(models="tiny", overrides={"num_rounds": 3, "log_every": 1}),
           str(tmp_path), log=lambda s: None,
           on_progress=lambda done, total: dispatches.append(done))
  assert dispatches[-1] == 3 and len(dispatches) >= 2
  # once after the init's one run (loop gives its program back), once after the
  # dispatch's compile (before its first run), then after every dispatch
  assert len(released) == 2 + len(dispatches)


def test_a_dispatch_compiles_once_ahead_and_gives_the_heap_back_before_it_runs(
    tiny_config, monkeypatch):
  exp = experiment.prepare(tiny_config(models="tiny"))
  fns = program.compile_fns(exp)
  dispatch = program.compile_dispatch(exp, 4)
  events = []
  monkeypatch.setattr(host_memory, "release_freed", lambda: events.append("release"))
  compile_ = jax.stages.Lowered.compile

  def compile_lowered(self, *args, **kwargs):
    events.append("compile")
    return compile_(self, *args, **kwargs)
  monkeypatch.setattr(jax.stages.Lowered, "compile", compile_lowered)
  state, rows, _ = dispatch(fns.init(jax.random.PRNGKey(0)), exp.data, np.int32(2))
  state, more, _ = dispatch(state, exp.data, np.int32(1))
  assert events == ["compile", "release"]  # compiled once, the heap given back first
  # the same rounds as the jitted program run directly
  state_j, rows_j, _ = dispatch.jitted(fns.init(jax.random.PRNGKey(0)), exp.data,
                                       np.int32(2), dispatch.schedule)
  chex.assert_trees_all_equal(rows, rows_j)
  assert int(state.round) == 3 and int(more["evaluated"].shape[0]) == 4
