"""Test setup: 4 forced CPU devices so sharded code paths run without a GPU."""
import contextlib
import functools
import json
import os
import shutil
import tempfile
import time

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def _session_dir(variable: str, prefix: str) -> str | None:
  """A temporary directory (removed at the end) named by ``variable`` for this session
  and its subprocesses, or None when the caller set ``variable`` (their own stays)."""
  if variable in os.environ:
    return None
  os.environ[variable] = path = tempfile.mkdtemp(prefix=prefix)
  return path


# One persistent compilation cache for the whole session (subprocesses inherit it):
# the end-to-end tests compile the same round several times.
_SESSION_CACHE = _session_dir("JAX_COMPILATION_CACHE_DIR", "fedjax_het_jit_cache_")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
# ... and one dataset cache (fedjax_het.data.cache): CIFAR-10's npz is inflated and
# sorted once, not in every process and run that reads it (2.3 s each).
_SESSION_DATA_CACHE = _session_dir("FEDJAX_HET_DATA_CACHE", "fedjax_het_data_cache_")
# XLA:CPU's compiles and the tiny models' rounds share the suite's time. Without LLVM's
# expensive passes and with XLA:CPU's classic elemental emitters (not its MLIR fusion
# emitters) the programs compile faster: tests/test_fedmrl.py -n 0 44-45 s -> 27-33 s,
# the suite (-n 2) 1477 s -> 1309 s on one 2-core machine. The backend's optimisation
# level 1 compiles slower than level 0 but runs a round about 4x faster (a tiny FedMRL
# round of 8 clients 1.77 s -> 0.42 s, its dispatch compiled in 10 s instead of 5 s), which
# pays wherever a program runs several rounds or comes back from the compilation cache:
# the suite (-n 2) 1322 s -> 1172 s, 2196 -> 1946 CPU s (one 2-core machine, the same day).
# Modules whose programs compile far longer than they run ask for level 0
# (``compile_bound``). Two workers share the 2 cores, so each process runs Eigen and
# XLA's code generation on one thread: two concurrent pytest processes (as -n 2) took
# 79 s instead of 84 (test_baselines_mutual with test_moss), 301 s instead of 328
# (test_replicas' replica tests with test_protocol). Subprocesses inherit it.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=1 "
                      "--xla_llvm_disable_expensive_passes=true "
                      "--xla_cpu_use_fusion_emitters=false "
                      "--xla_cpu_multi_thread_eigen=false "
                      "--xla_cpu_parallel_codegen_split_count=1")
# An init runs once: compiled at level 0 instead of the library's 1 for CPU inits
# (compile_options.init_level), a tiny FedMRL's init of 8 clients compiles in 4.6 s
# instead of 12.6 s (one 2-core machine). Subprocesses inherit it.
os.environ.setdefault("FEDJAX_HET_INIT_LEVEL", "0")
# ``compile_bound``'s setting in a subprocess's environment (jax reads it at import)
COMPILE_BOUND_ENV = {"JAX_DISABLE_MOST_OPTIMIZATIONS": "1"}

import jax  # noqa: E402

jax.config.update("jax_num_cpu_devices", 4)
# Tests need determinism, not a particular stream or its statistical quality: 'rbg' keys
# compile several times faster on CPU than threefry, and 'unsafe_rbg' (rbg's bits, a
# cheaper split and fold_in) faster still: test_baselines_mutual, test_fedmrl,
# test_fedmoe and test_moss with -n 0 took 139 s and 123 s with 'rbg', 121 s and 113 s
# with it. Like 'rbg', its draws under vmap differ from one key at a time (tests of that
# property switch to threefry).
jax.config.update("jax_default_prng_impl", "unsafe_rbg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from fedjax_het import config as config_lib  # noqa: E402


def pytest_sessionfinish(session, exitstatus):
  """The session's compilation and dataset caches go with it (the process that made
  them: the xdist controller, or pytest without workers)."""
  del exitstatus
  if not hasattr(session.config, "workerinput"):
    for cache in (_SESSION_CACHE, _SESSION_DATA_CACHE):
      if cache:
        shutil.rmtree(cache, ignore_errors=True)


# FEDJAX_HET_COMPILE_CENSUS=<dir>: where the suite's time goes, as lines of
# <dir>/<pid>.jsonl (tests/compile_census.py sums them): each test phase's CPU seconds
# (its process and the subprocesses it waited for), and every XLA compile, trace and
# lowering of a test process (not of its subprocesses): the phase it ran in, the
# function, seconds, and whether the persistent cache served a compile.
_CENSUS_DIR = os.environ.get("FEDJAX_HET_COMPILE_CENSUS")
_census_where = ["(collection)"]
_CENSUS_EVENTS = {"/jax/core/compile/backend_compile_duration": "compile",
                  "/jax/core/compile/jaxpr_trace_duration": "trace",
                  "/jax/core/compile/jaxpr_to_mlir_module_duration": "lower"}


@functools.cache
def _census_file():
  os.makedirs(_CENSUS_DIR, exist_ok=True)
  return open(os.path.join(_CENSUS_DIR, f"{os.getpid()}.jsonl"), "a", buffering=1)


def _census_write(kind, secs, fun="", hit=None, **more):
  _census_file().write(json.dumps({"where": _census_where[0], "kind": kind, "fun": fun,
                                   "secs": round(secs, 3), "hit": hit, **more}) + "\n")


def _start_census():
  from jax import monitoring
  hit = [False]

  def on_event(event, **kwargs):
    if event == "/jax/compilation_cache/cache_hits":
      hit[0] = True

  def on_duration(event, secs, **kwargs):
    kind = _CENSUS_EVENTS.get(event)
    if kind == "compile":
      _census_write(kind, secs, kwargs.get("fun_name", ""), hit[0])
      hit[0] = False
    elif kind:
      _census_write(kind, secs, kwargs.get("fun_name", ""))

  monitoring.register_event_listener(on_event)
  monitoring.register_event_duration_secs_listener(on_duration)


if _CENSUS_DIR:
  _start_census()


def _cpu_s() -> float:
  """CPU seconds of this process and of its children that ended (waited for)."""
  import resource
  own, children = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                    resource.RUSAGE_CHILDREN))
  return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@contextlib.contextmanager
def _census_phase(item, phase):
  """Names the phase for the census and, after it, writes its CPU seconds and its wall
  clock (``start``, ``wall``: when each worker ran what, whether one waited at the end)."""
  if not _CENSUS_DIR:
    yield
    return
  _census_where[0] = f"{item.nodeid} {phase}"
  start, wall = _cpu_s(), time.time()
  try:
    yield
  finally:
    _census_write("cpu", _cpu_s() - start, start=round(wall, 3),
                  wall=round(time.time() - wall, 3))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
  with _census_phase(item, "setup"):
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
  with _census_phase(item, "call"):
    return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item):
  with _census_phase(item, "teardown"):
    return (yield)


@pytest.fixture(scope="module")
def compile_bound():
  """XLA's backend optimisation level 0 for the programs a module compiles (jax's
  ``jax_disable_most_optimizations``: read at each compile and part of the persistent
  cache's keys, not of jit's in-memory cache, so a program the worker compiled before
  keeps its level).

  For modules whose programs compile far longer than they run (one round, or a few):
  test_protocol.py took 313 s of the suite at level 1 against 256 s at 0, test_moss.py
  109 s against 76 s; each module alone (``pytest -n 0``, wall s at level 1 -> 0):
  test_replicas 219 -> 183, test_baselines_mutual 46 -> 40, test_fedmrl 28 -> 24,
  test_deploy 20 -> 13, test_fedmoe 26 -> 22, test_estimate 78 -> 64,
  test_baselines_share 46 -> 40 (test_claims 37 -> 36, user s 40 -> 41: left at 1);
  test_deploy_flower with its processes (``COMPILE_BOUND_ENV``; two runs side by side,
  CPU s of pytest and the processes it waited for) 499 -> 422, its simulator calls
  96 -> 76 s.
  On 16x16 images (``tiny_npz``), side by side with level 1 (user s of pytest and its
  waited subprocesses): test_sweep_plots with test_models 26.9 -> 22.0, test_distributed's
  processes with test_docs' quickstart run 35.7 -> 32.9, the SIGKILL-and-resume processes
  36.6 -> 31.8 (test_training with test_reliability in-process 147 against 149, and
  test_benchmarks' timed runs 30 against 38 at 0: left at 1).
  Modules whose runs dominate stay at 1 (test_training 203 against 225 at 0,
  test_reliability 114 against 136, test_flower_app 41 against 46). Level 0 changes the
  last bits of some results, so a test that compares two runs computes both under the
  same level.
  """
  with _level_zero():
    yield


@pytest.fixture(autouse=True)
def compile_bound_test(request):
  """``compile_bound`` for one test marked ``@pytest.mark.compile_bound`` (a test whose
  programs none of its module's fixtures share: a module fixture's run compiled at level
  1 would differ from the test's in the last bits)."""
  if request.node.get_closest_marker("compile_bound") is None:
    yield
    return
  with _level_zero():
    yield


@contextlib.contextmanager
def _level_zero():
  previous = jax.config.read("jax_disable_most_optimizations")
  jax.config.update("jax_disable_most_optimizations", True)
  try:
    yield
  finally:
    jax.config.update("jax_disable_most_optimizations", previous)


@pytest.fixture(autouse=True)
def fresh_trace_counts():
  """``chex.assert_max_traces`` counts traces per function source across a worker's
  tests; algorithms sharing a round (``rounds.protocol_round``) must not add up."""
  import chex
  chex.clear_trace_counter()


def _save_synthetic(directory, name: str, **shape) -> str:
  """``make_synthetic(600, 200, 10, seed=0, **shape)`` saved as ``<directory>/<name>.npz``."""
  from fedjax_het.data import make_synthetic
  raw = make_synthetic(600, 200, 10, seed=0, **shape)
  path = directory / f"{name}.npz"
  np.savez(path, x_train=raw.x_train, y_train=raw.y_train, x_test=raw.x_test,
           y_test=raw.y_test)
  return str(path)


@pytest.fixture(scope="session")
def synthetic_npz(tmp_path_factory):
  """A small learnable CIFAR-shaped dataset saved as npz (600 train + 200 test)."""
  return _save_synthetic(tmp_path_factory.mktemp("data"), "cifar10")


# ``tiny_config``'s data: ``tiny_npz``, 16x16 RGB images of a dataset of its own name. A
# quarter of CIFAR's pixels: a tiny round runs about 4x less convolution (the tests that
# tiny_config runs took 277 user s on 32x32 images, 219 on 16x16; the programs compile
# alike). Tests of CIFAR's shapes (its loaders, the CNNs' FLOPs) use ``synthetic_npz``.
TINY_DATA = "synthetic"
TINY_IMAGE_SHAPE = (16, 16, 3)


@pytest.fixture(scope="session")
def tiny_npz(tmp_path_factory):
  """``synthetic_npz``'s classes and sizes on ``TINY_IMAGE_SHAPE`` images (``TINY_DATA``)."""
  return _save_synthetic(tmp_path_factory.mktemp("tiny_data"), TINY_DATA,
                         image_shape=TINY_IMAGE_SHAPE)


# ``tiny_config`` overrides of a test of the sharded paths: every forced host device
SHARDED = {"runtime.num_devices": 0}
# ``tiny_config``'s shared models: 'tiny' where the algorithm's default is a CNN-5
TINY_SHARED = {"fedmrl": {"algo.small_arch": "tiny"}, "fedmoe": {"algo.global_arch": "tiny"},
               "fedkd": {"algo.small_arch": "tiny"}, "fml": {"algo.small_arch": "tiny"},
               "fedapen": {"algo.small_arch": "tiny"}}


def make_tiny_config(npz: str, algorithm="standalone", models="tiny,tiny2", overrides=None):
  """``tiny_config``'s config, on the dataset saved at ``npz`` (for module fixtures):
  ``tiny_npz`` (``TINY_DATA``), or ``synthetic_npz`` (CIFAR-10's name and shape)."""
  c = config_lib.base_config()
  c.runtime.num_devices = 1
  c.algorithm = algorithm
  c.models = models
  c.data.path = npz
  if os.path.basename(npz) == f"{TINY_DATA}.npz":
    c.data.name = TINY_DATA
  c.num_clients = 8
  c.num_rounds = 2
  c.batch_size = 16
  c.eval_every = 1
  c.checkpoint_every = 1
  c.partition.kind = "dirichlet"
  c.partition.alpha = 1.0
  return config_lib.override(c, {**TINY_SHARED.get(algorithm, {}), **(overrides or {})})


@pytest.fixture
def tiny_config(tiny_npz):
  """A config that runs in seconds on CPU: 8 clients, synthetic data, one device.

  ``make(algorithm='standalone', models='tiny,tiny2', overrides=None)``
  (``make_tiny_config`` on ``tiny_npz``: 16x16 images). Models: 'tiny' and 'tiny2' clients, and
  a 'tiny' shared model where the algorithm's default is CNN-5 (``TINY_SHARED``): a
  CNN-5 took most of a tiny run's compile.

  ``runtime.num_devices`` is 1: on a 2-core machine the 4 forced host devices cost a
  run about twice the time (a FedMRL round of 8 tiny clients: 1.7 s sharded over 4,
  0.57 s on one; its compile 9.1 s against 6.4 s). Tests of the sharded paths (the
  client axis padded to the device count, padding slots, the replica axis, every
  algorithm's simulator against its deployment) ask for ``SHARDED`` explicitly.
  """
  return functools.partial(make_tiny_config, tiny_npz)


def assert_server_holds_no_client_leaf(state):
  """The privacy boundary: no server leaf equals one client's own (unaggregated) leaf.

  Every float leaf of ``state.server`` is compared with the same-shaped slice of every
  client of every group (``state.clients[g]`` leaves are stacked on a client axis); an
  exact match would mean the server kept a client's parameters (or anything else of its
  state) without aggregation.
  """
  import jax

  from fedjax_het import packing

  server = [np.asarray(x) for x in jax.tree.leaves(state.server)
            if np.issubdtype(np.asarray(x).dtype, np.floating)]
  for group in state.clients:
    for leaf in jax.tree.leaves(packing.as_tree(group)):  # leaf by leaf
      leaf = np.asarray(leaf)
      if not np.issubdtype(leaf.dtype, np.floating):
        continue
      for s in server:
        if s.shape == leaf.shape[1:] and s.size > 1:
          for k in range(leaf.shape[0]):
            assert not np.array_equal(s, leaf[k]), (
                f"a server leaf of shape {s.shape} equals client {k}'s own leaf")
