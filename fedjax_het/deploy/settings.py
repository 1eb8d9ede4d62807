"""The Flower App's settings: the run config, each SuperNode's node config, the config.

The run config (``[tool.flwr.app.config]``, ``flwr run --run-config``; ``ServerSettings``)
names the experiment config file and its overrides and the server's knobs: timeouts,
quorum, the defences of ``robust.py``. Each SuperNode's node config (``NodeSettings``) says
which client it is (``client-id``), where it keeps its state (``workdir``) and where its
data is (``data-path``, else ``$FEDJAX_HET_DATA``), and its fault drills (tests).
``load_config`` resolves a config file and its overrides as ``--config=`` and
``--config.key=value`` do.
"""
from __future__ import annotations

import ast
import dataclasses
import os
import shlex
from typing import Any, Mapping

from fedjax_het import cli
from fedjax_het import config as config_lib
from fedjax_het import config_files
from fedjax_het.deploy import robust

# fault drills of a SuperNode (``NodeSettings.fault``): the first two act on the process,
# the others send a malformed reply (``client._malformed``)
FAULTS = ("kill", "hang", "nan", "oversize", "shape", "impersonate", "torch", "zip",
          "overlong", "huge", "truncated", "dtype", "scaled", "flood", "overflow", "replay",
          "inflate")
# drills of the evaluate message (the others act on the train message)
EVAL_FAULTS = frozenset({"inflate"})


# ---------------------------------------------------------------- configuration
def _from_mapping(cls, mapping: Mapping[str, Any], what: str):
  """``cls`` (a frozen dataclass whose defaults have the fields' types) from kebab-case
  keys, each value converted to its field's type."""
  fields = {f.name: f.default for f in dataclasses.fields(cls)}
  values = {}
  for key, value in mapping.items():
    name = key.replace("-", "_")
    if name not in fields:
      valid = sorted(f.replace("_", "-") for f in fields)
      raise ValueError(f"unknown {what} key {key!r}; valid keys are {valid}")
    kind = type(fields[name])
    if (kind is bool) != isinstance(value, bool) or (
        kind is int and isinstance(value, float) and not value.is_integer()):
      raise ValueError(f"{what} {key}={value!r} must be a {kind.__name__}")
    try:
      values[name] = kind(value)
    except (TypeError, ValueError) as err:
      raise ValueError(f"{what} {key}={value!r} must be a {kind.__name__}") from err
  return cls(**values)


@dataclasses.dataclass(frozen=True)
class ServerSettings:
  """The app's run config (kebab-case keys in ``[tool.flwr.app.config]``).

  Attributes:
    config: the experiment config file, ``path[:variant]`` (as ``--config=``; a relative
      path is read from the SuperLink's working directory).
    overrides: ``key=value`` pairs separated by spaces, as ``--config.key=value``.
    workdir: the server's outputs (``metrics.jsonl``, ``summary.json``, ``config.json``,
      ``server.log``, ``checkpoints/``); a run resubmitted with it resumes.
    round_timeout: seconds a round waits for its replies.
    startup_timeout: seconds to wait for all clients before round 1 (and for a
      SuperNode's first reply).
    min_fit_clients: uploads needed to aggregate a round (0: half the clients sent the
      round's message, rounded up: a round aggregates without its failed half; -1: every
      one of them, the strictest).
    min_available_clients: connected clients needed to start a round after the first
      (0: the quorum of a round whose every drawn client is sent its message).
    straggler_timeout: once ``min_fit_clients`` uploads are in, seconds a round still
      waits for the others (0: until ``round_timeout``).
    round_attempts: tries of a round that gets too few uploads before the run fails.
    fresh_start: discard a previous run's checkpoints and metrics in ``workdir``.
    upload_norm_bound: B > 0 (default ``robust.DEFAULT_BOUND`` = 10) bounds every
      upload's update (its distance from the payload it was sent): each coordinate and
      its L2 norm by B times the round's reference (lower medians), class tables by
      their counts and rows (``robust.py``); 0: no bound (with ``aggregation=mean``
      the run says on its first line that it is unbounded).
    upload_norm_action: ``clip`` (default: scaled down to the bound, the client named
      in the log) or ``reject`` (the client's failure for the round).
    aggregation: ``mean`` (the algorithm's own), ``median`` or ``trimmed-mean``
      (coordinate-wise, for the algorithms whose ``Spec.averages`` is true).
    trim_fraction: the fraction cut at each end by ``trimmed-mean``, in [0, 0.5):
      ``floor(f n)`` of n uploads, at least 1 with 3 or more (``robust.trim_count``); a
      run whose ``floor(f n)`` is 0 for its full draw is refused at start.
    bench_after: a client whose upload is rejected this many rounds running is not
      drawn for ``bench_rounds`` rounds (0: never benched).
    bench_rounds: rounds a benched client sits out.
  """
  config: str = ""
  overrides: str = ""
  workdir: str = ""
  round_timeout: float = 600.0
  startup_timeout: float = 600.0
  min_fit_clients: int = 0
  min_available_clients: int = 0
  straggler_timeout: float = 0.0
  round_attempts: int = 3
  fresh_start: bool = False
  upload_norm_bound: float = robust.DEFAULT_BOUND
  upload_norm_action: str = "clip"
  aggregation: str = "mean"
  trim_fraction: float = 0.1
  bench_after: int = 3
  bench_rounds: int = 3

  @classmethod
  def from_run_config(cls, run_config: Mapping[str, Any]) -> "ServerSettings":
    s = _from_mapping(cls, run_config, "run config")
    if not s.config or not s.workdir:
      raise ValueError("the run config needs config (an experiment config file) and "
                       "workdir (the server's output directory)")
    if min(s.round_timeout, s.startup_timeout) <= 0 or s.round_attempts < 1 or (
        s.straggler_timeout < 0):
      raise ValueError("round-timeout and startup-timeout must be > 0, "
                       "straggler-timeout >= 0, round-attempts >= 1")
    if s.min_fit_clients < -1 or s.min_available_clients < 0:
      raise ValueError("min-fit-clients must be >= -1 and min-available-clients >= 0")
    if s.upload_norm_bound < 0 or s.upload_norm_action not in robust.NORM_ACTIONS:
      raise ValueError(f"upload-norm-bound must be >= 0 (0: none) and upload-norm-action "
                       f"one of {list(robust.NORM_ACTIONS)}")
    if s.aggregation not in robust.AGGREGATIONS or not 0 <= s.trim_fraction < 0.5:
      raise ValueError(f"aggregation must be one of {list(robust.AGGREGATIONS)} and "
                       "trim-fraction in [0, 0.5)")
    if min(s.bench_after, s.bench_rounds) < 0:
      raise ValueError("bench-after and bench-rounds must be >= 0")
    return s

  def quorum(self, sent: int) -> int:
    """Uploads a round that sent ``sent`` train messages needs (``min_fit_clients``)."""
    if self.min_fit_clients == -1:
      return sent
    return self.min_fit_clients or max(1, -(-sent // 2))


@dataclasses.dataclass(frozen=True)
class NodeSettings:
  """A SuperNode's node config (``flower-supernode --node-config``).

  Attributes:
    client_id: which client this SuperNode is.
    workdir: where the client keeps its state between messages (checkpoints), its data
      and the JAX compilation cache.
    data_path: the client's data (``config.data.path``; '' keeps the config's, else
      ``$FEDJAX_HET_DATA``).
    fault: fault drills for tests, ``kind@round`` separated by commas: ``kill`` (the
      SuperNode's processes SIGKILL themselves when asked to train that round),
      ``hang`` (never answers), ``impersonate`` (the reply claims another client's id),
      and malformed uploads: ``nan`` (NaN values), ``oversize`` (an extra 4 MiB array),
      ``shape`` (a declared shape that differs), ``torch`` (a ``torch.Tensor`` payload
      type), ``zip`` (bytes of a zip file), ``overlong`` (a ``.npy`` header longer than
      its bytes), ``huge`` (a ``.npy`` header of 2^40 elements), ``truncated`` (half the
      values' bytes), ``dtype`` (float64 values where float32 are due), ``scaled`` (the
      upload times 1e30). Every malformed array but ``shape``'s and ``oversize``'s comes
      with the expected declared dtype and shape: only the bytes lie. Well-formed but
      hostile: ``flood`` (3e38, finite, in every floating-point value), ``overflow``
      (1e20 in every one: a class table's counts times means overflow float32),
      ``replay`` (the client's previous train reply sent again, its round and nonce
      included), ``inflate`` (an evaluation reply claiming every test example correct).
  """
  client_id: int = -1
  workdir: str = ""
  data_path: str = ""
  fault: str = ""

  @classmethod
  def from_node_config(cls, node_config: Mapping[str, Any]) -> "NodeSettings":
    s = _from_mapping(cls, node_config, "node config")
    if s.client_id < 0 or not s.workdir:
      raise ValueError("the node config needs client-id (>= 0) and workdir")
    parse_faults(s.fault)
    return s


def parse_faults(text: str) -> dict[int, str]:
  """``'kill@2,nan@1'`` -> ``{2: 'kill', 1: 'nan'}`` (round -> fault drill)."""
  out = {}
  for item in filter(None, (t.strip() for t in text.split(","))):
    kind, _, round_ = item.partition("@")
    if kind not in FAULTS or not round_.isdigit():
      raise ValueError(f"fault {item!r} is not kind@round with kind in {list(FAULTS)}")
    out[int(round_)] = kind
  return out


def parse_overrides(text: str) -> dict[str, str]:
  """``'num_clients=3 data.path="/a b"'`` -> ``{'num_clients': '3', 'data.path': '/a b'}``."""
  out = {}
  for item in shlex.split(text):
    key, sep, value = item.partition("=")
    if not sep or not key:
      raise ValueError(f"config override {item!r} is not key=value")
    out[key] = value
  return out


def _coerce(current: Any, text: str) -> Any:
  """``text`` as the type of the config value it replaces (as ``--config.key=`` does)."""
  if isinstance(current, bool):
    if text.lower() not in ("true", "false"):
      raise ValueError(f"{text!r} is not True or False")
    return text.lower() == "true"
  if isinstance(current, (int, float, str)):
    return type(current)(text)
  return ast.literal_eval(text)


def load_config(spec: str, overrides: str = ""):
  """The experiment config of ``--config=spec`` with ``overrides`` applied.

  Raises:
    FileNotFoundError: no such file.
    ValueError: an unknown key or a value of the wrong type.
  """
  config = config_files.load_config_file(spec)
  for key, text in parse_overrides(overrides).items():
    cli.check_key(config, key)
    node = config
    for part in key.split(".")[:-1]:
      node = node[part]
    try:
      value = _coerce(node[key.split(".")[-1]], text)
    except (ValueError, SyntaxError) as err:
      raise ValueError(f"config override {key}={text!r}: {err}") from err
    config_lib.override(config, {key: value})
  return config


# the config keys that name files: a relative one is made absolute where it is given
PATH_KEYS = ("data.path", "partition.path")


def overrides_of(argv, *, cwd: str | None = None) -> str:
  """The ``--config.key=value`` flags of ``argv`` as an ``overrides`` string; a relative
  path of ``PATH_KEYS`` made absolute against ``cwd`` (default the working directory),
  since the server and the clients run elsewhere."""
  items = []
  for a in argv:
    if a.startswith("--config.") and "=" in a:
      key, _, value = a[len("--config."):].partition("=")
      if key in PATH_KEYS and value and not os.path.isabs(value):
        value = os.path.abspath(os.path.join(cwd or os.getcwd(), value))
      items.append(f"{key}={value}")
  return " ".join(shlex.quote(i) for i in items)


def use_compilation_cache(directory: str) -> None:
  """Caches compiled programs in ``directory`` (unless a cache is configured already,
  ``JAX_COMPILATION_CACHE_DIR``): a ClientApp lives for one message, so every message
  after the first loads its round instead of compiling it."""
  import jax  # pylint: disable=import-outside-toplevel
  if jax.config.jax_compilation_cache_dir:
    return
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
  jax.config.update("jax_persistent_cache_min_entry_size_bytes", -1)

