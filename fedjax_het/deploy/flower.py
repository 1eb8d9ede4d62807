r"""Any fedjax-het algorithm as a Flower App on Flower's Deployment Runtime.

``server_app`` (a ``flwr.serverapp.ServerApp``) wraps a ``ServerNode`` and
``client_app`` (a ``flwr.clientapp.ClientApp``) wraps a ``ClientNode``, both from
``federation.py``: they only call the algorithm's ``Protocol``, the pure functions the
simulator's round is built from, so no algorithm is written twice. Flower runs them in
its own processes: ``flower-superlink`` starts the ServerApp (one process for the whole
run) when ``flwr run`` submits the app (``fedjax_het/deploy/flower_app``), every
``flower-supernode`` starts a ClientApp process for each message it receives.

Configuration. The run config (``[tool.flwr.app.config]``, ``flwr run --run-config``;
``ServerSettings``) names the experiment config file and its overrides and the server's
knobs; the ServerApp resolves and validates the config before anything else and sends
the resolved config in every message, so a SuperNode needs neither the file nor the
server's working directory. Each SuperNode's node config (``NodeSettings``) says which
client it is (``client-id``), where it keeps its state (``workdir``; a ClientApp lives
for one message, the client's private model lives in its checkpoints there) and where
its data is (``data-path``, else ``$FEDJAX_HET_DATA``).

What crosses the wire (message types of ``flwr.app.MessageType``):

- ``query`` (once per SuperNode): the config down; the node's client id up. The node
  compiles its round meanwhile (the JAX compilation cache in its workdir makes later
  messages cheap).
- ``train`` (round r): the payload ``downlink(server, g)`` of the client's group, the
  round, the client's PRNG key (the simulator's) and its id down; the upload, the
  client's train example count and its training metrics up.
- ``evaluate`` (evaluation rounds): the payload down; ``(correct, total)`` of the
  client's personalized model on its test split up.

Identity. The server learns which client a SuperNode is from its ``query`` reply; when
the SuperNode's key was registered with a name (``flwr supernode register --name
client-<k>``, what the loopback launcher does), the claimed id must match that name,
which only the operator sets, so a node cannot pose as another client. Every reply
must claim the client its message was sent to. With SuperNode authentication off
(``--insecure``) nothing binds a node to an id, and the server says so.

Round r on the server (``FlowerServer``): learn new SuperNodes (all ``num_clients``
before round 1, at most ``startup-timeout`` s; ``min-available-clients`` later), draw
the round's clients as the simulator does, send each connected drawn client its train
message, wait at most ``round-timeout`` s (``straggler-timeout`` s once
``min-fit-clients`` uploads are in), check every reply
(``federation.check_upload``: sender, size, shapes, dtypes, finite values; its weight
and metrics too) and aggregate the good ones if there are at least ``min-fit-clients``
(a missing, failed or rejected reply is that client's failure for the round, counted
in ``metrics.jsonl``'s ``clients_failed`` and logged with its id); else the round is
tried again (at most ``round-attempts`` times). The state is checkpointed after every
aggregated round (after the metrics row on evaluation rounds). A resubmitted run with
the same ``workdir`` resumes from the newest checkpoint; clients roll their own state
back to it (``ClientNode``).

docs/deploy.md has the commands; ``fedjax_het/deploy/loopback.py`` starts a loopback
federation.
"""
from __future__ import annotations

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # no phoning home from a lab cluster

import ast  # noqa: E402
import dataclasses  # noqa: E402
import hashlib  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from typing import (
  Any,  # noqa: E402
  Callable,  # noqa: E402
  Mapping,  # noqa: E402
)

import numpy as np  # noqa: E402
from flwr.app import ArrayRecord  # noqa: E402
from flwr.app import ConfigRecord  # noqa: E402
from flwr.app import Context  # noqa: E402
from flwr.app import Message  # noqa: E402
from flwr.app import MessageType  # noqa: E402
from flwr.app import MetricRecord  # noqa: E402
from flwr.app import RecordDict  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.common.constant import ErrorCode  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.serverapp import ServerApp  # noqa: E402

from fedjax_het import cli  # noqa: E402
from fedjax_het import config as config_lib  # noqa: E402
from fedjax_het import config_files  # noqa: E402
from fedjax_het.algorithms import base  # noqa: E402
from fedjax_het.deploy import federation as fed_lib  # noqa: E402
from fedjax_het.training import environment  # noqa: E402
from fedjax_het.training import metrics as metrics_lib  # noqa: E402
from fedjax_het.training import runfiles  # noqa: E402

RECORD = "fedjax"  # the ConfigRecord of every message: round, client id, config, key
PAYLOAD, UPLOAD, AUX = "payload", "upload", "aux"
NODE_NAME = "client-{}"  # the name a SuperNode's key is registered under
FAULTS = ("kill", "hang", "nan", "oversize", "shape", "impersonate")


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
    min_fit_clients: uploads needed to aggregate a round (0: every drawn client).
    min_available_clients: connected clients needed to start a round after the first
      (0: ``min_fit_clients``).
    straggler_timeout: once ``min_fit_clients`` uploads are in, seconds a round still
      waits for the others (0: until ``round_timeout``).
    round_attempts: tries of a round that gets too few uploads before the run fails.
    fresh_start: discard a previous run's checkpoints and metrics in ``workdir``.
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
    if min(s.min_fit_clients, s.min_available_clients) < 0:
      raise ValueError("min-fit-clients and min-available-clients must be >= 0")
    return s


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
      ``hang`` (never answers), ``nan`` / ``oversize`` / ``shape`` (a malformed upload),
      ``impersonate`` (the reply claims another client's id).
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


def overrides_of(argv) -> str:
  """The ``--config.key=value`` flags of ``argv`` as an ``overrides`` string."""
  items = [a[len("--config."):] for a in argv if a.startswith("--config.") and "=" in a]
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


# ---------------------------------------------------------------- the wire
def _record(**values) -> ConfigRecord:
  return ConfigRecord(values)


def _ordered_arrays(record: ArrayRecord) -> list:
  """The arrays of an ``ArrayRecord`` built from a list (keys '0', '1', ...), in order."""
  keys = list(record.keys())
  if keys != [str(i) for i in range(len(keys))]:
    raise fed_lib.UploadRejected(f"array keys {keys[:5]}... are not 0..{len(keys) - 1}")
  return [record[k] for k in keys]


def _silence(reply: Message | None) -> str:
  why = "" if reply is None else f" ({reply.error.reason.split(' - ')[0].split(' —')[0]})"
  return "no reply within round-timeout" + why


def read_upload(reply: Message | None, client_id: int, like, expected_weight: int | None
                ) -> tuple[list[np.ndarray], int, dict]:
  """(arrays, weight, metrics) of a train reply, or ``UploadRejected`` saying why."""
  if unanswered(reply):
    raise fed_lib.UploadRejected(_silence(reply))
  if reply.has_error():
    raise fed_lib.UploadRejected(f"error reply ({reply.error.code}: {reply.error.reason})")
  meta = reply.content.config_records.get(RECORD)
  record = reply.content.array_records.get(UPLOAD)
  if meta is None or record is None:
    raise fed_lib.UploadRejected(f"reply without its {RECORD!r} and {UPLOAD!r} records")
  arrays = _ordered_arrays(record)
  headers = [fed_lib.ArrayHeader(a.dtype, tuple(a.shape), len(a.data)) for a in arrays]
  tree = fed_lib.check_upload(client_id, meta.get("client-id"), headers,
                              lambda: [a.numpy() for a in arrays], like)
  weight = fed_lib.check_weight(meta.get("num-examples"), expected_weight)
  aux = fed_lib.check_metrics(dict(reply.content.metric_records.get(AUX, {})))
  return fed_lib.encode(tree), weight, aux


def read_evaluation(reply: Message | None, client_id: int, expected_total: int | None
                    ) -> tuple[int, int]:
  """(correct, total) of an evaluate reply, or ``UploadRejected`` saying why."""
  if unanswered(reply):
    raise fed_lib.UploadRejected(_silence(reply))
  if reply.has_error():
    raise fed_lib.UploadRejected(f"error reply ({reply.error.code}: {reply.error.reason})")
  meta = reply.content.config_records.get(RECORD)
  if meta is None or meta.get("client-id") != client_id:
    raise fed_lib.UploadRejected(f"the reply to client {client_id} claims to come from "
                                 f"client {None if meta is None else meta.get('client-id')!r}")
  return fed_lib.check_counts(meta.get("correct"), meta.get("total"), expected_total)


def admission(claimed: Any, name: str, num_clients: int, taken: Mapping[int, int]
              ) -> str | None:
  """Why a SuperNode claiming client ``claimed`` is refused (None: admitted).

  Args:
    claimed: the client id its ``query`` reply claims.
    name: the name its key was registered under ('' when none: no authentication, or
      registered without ``--name``).
    num_clients: ids run over [0, num_clients).
    taken: client id -> node id of the SuperNodes already admitted and online.
  """
  if isinstance(claimed, bool) or not isinstance(claimed, int) or not (
      0 <= claimed < num_clients):
    return f"claims client id {claimed!r}, not one of [0, {num_clients})"
  if name and name != NODE_NAME.format(claimed):
    return f"claims client {claimed} but its key is registered as {name!r}"
  if claimed in taken:
    return f"claims client {claimed}, already served by SuperNode {taken[claimed]}"
  return None


def _refused_by_name(name: str, num_clients: int, taken: Mapping[int, int]) -> str | None:
  """Why a node is refused from its registered name alone (None: ask it)."""
  if not name:
    return None
  match = re.fullmatch(NODE_NAME.format(r"(\d+)"), name)
  if match is None:
    return f"its key is registered as {name!r}, no client's name ({NODE_NAME.format('<id>')})"
  why = admission(int(match.group(1)), name, num_clients, taken)
  return why and f"registered as {name!r}: {why}"


def unanswered(reply: Message | None) -> bool:
  """No reply, or the SuperLink's reply that none will come (the message expired, the
  node stopped sending heartbeats)."""
  return reply is None or (reply.has_error() and reply.error.code in (
      ErrorCode.MESSAGE_UNAVAILABLE, ErrorCode.REPLY_MESSAGE_UNAVAILABLE,
      ErrorCode.NODE_UNAVAILABLE))


def exchange(grid: Grid, messages: Mapping[int, Message], timeout: float, *,
             quorum: int = 0, grace: float = 0.0, poll: float = 0.25
             ) -> dict[int, Message | None]:
  """Sends ``{client: message}`` and waits at most ``timeout`` s for the replies.

  Once ``quorum`` replies without error are in (``quorum`` > 0 and ``grace`` > 0), the
  others get at most ``grace`` s more.

  Returns:
    ``{client: reply}``; None for a client whose reply did not come in time (or whose
    message could not be sent).
  """
  clients = list(messages)
  ids = list(grid.push_messages([messages[c] for c in clients])) if clients else []
  pending = {i: c for i, c in zip(ids, clients) if i}
  out: dict[int, Message | None] = {c: None for c in clients}
  deadline, good = time.monotonic() + timeout, 0
  while pending and time.monotonic() < deadline:
    for reply in grid.pull_messages(list(pending)):
      client = pending.pop(reply.metadata.reply_to_message_id, None)
      if client is not None:
        out[client] = reply
        good += not reply.has_error()
        if grace > 0 and 0 < quorum == good:
          deadline = min(deadline, time.monotonic() + grace)
    if pending:
      time.sleep(poll)
  return out


# ---------------------------------------------------------------- the server
class Roster:
  """Which online SuperNode is which client: admitted, refused, lost and asked ones.

  Args:
    grid: the ServerApp's grid.
    config_json: the resolved experiment config (sent with every query).
    num_clients: client ids run over [0, num_clients).
    timeout: seconds a query may take (its SuperNode compiles the client's round).
    log: where lines go.
  """

  def __init__(self, grid: Grid, config_json: str, num_clients: int, timeout: float,
               log: Callable[[str], None] = print):
    self.grid, self.config_json, self.num_clients = grid, config_json, num_clients
    self.timeout, self.log = timeout, log
    self.clients: dict[int, int] = {}  # client id -> node id (admitted, online)
    self.refused: dict[int, str] = {}  # node id -> why
    self.lost: set[int] = set()  # node ids that did not answer: skipped while online
    self.queries: dict[str, int] = {}  # query message id -> node id, awaiting replies

  def discover(self, wait_for: int) -> None:
    """Learns which client each new online SuperNode is, waiting up to ``timeout`` s
    until ``wait_for`` clients are connected (0: returns at once, queries sent).

    A node registered under the name of a client out of range or already served is
    refused as it appears; any other new node gets a ``query`` (its SuperNode compiles
    the client's round meanwhile) and is admitted when its reply claims the client its
    name says (``admission``). Unanswered queries stay pending across rounds, so a slow
    or dead node never holds up a federation that has enough clients.
    """
    deadline = time.monotonic() + self.timeout
    while True:
      nodes = {n.node_id: n.name for n in self.grid.get_nodes()}
      self.clients = {c: n for c, n in self.clients.items() if n in nodes}
      self.lost &= set(nodes)  # a lost node seen offline is asked again when back
      known = (set(self.clients.values()) | set(self.refused) | self.lost
               | set(self.queries.values()))
      ask = []
      for n in sorted(set(nodes) - known):
        why = _refused_by_name(nodes[n], self.num_clients, self.clients)
        if why:
          self._refuse(n, why)
        else:
          ask.append(n)
      if ask:
        messages = [Message(RecordDict({RECORD: _record(config=self.config_json)}),
                            dst_node_id=n, message_type=MessageType.QUERY,
                            ttl=self.timeout) for n in ask]
        self.queries.update({i: n for i, n in zip(self.grid.push_messages(messages), ask)
                             if i})
      if self.queries:
        for reply in self.grid.pull_messages(list(self.queries)):
          n = self.queries.pop(reply.metadata.reply_to_message_id, None)
          if n is not None:
            self._admit(n, nodes.get(n, ""), reply)
      if len(self.clients) >= wait_for or time.monotonic() >= deadline:
        return
      time.sleep(0.25)

  def _admit(self, node_id: int, name: str, reply: Message) -> None:
    """Admits or refuses the SuperNode whose ``query`` reply this is."""
    if unanswered(reply):
      self.lost.add(node_id)
      self.log(f"server: SuperNode {node_id} did not answer its query; asked again when "
               "it reconnects")
      return
    if reply.has_error():
      self._refuse(node_id, f"its query failed ({reply.error.reason})")
      return
    claimed = reply.content.config_records.get(RECORD, {}).get("client-id")
    why = admission(claimed, name, self.num_clients, self.clients)
    if why:
      self._refuse(node_id, why)
      return
    self.clients[claimed] = node_id
    self.log(f"server: SuperNode {node_id} is client {claimed} "
             f"({name or 'UNAUTHENTICATED: no registered name'})")

  def _refuse(self, node_id: int, why: str) -> None:
    self.refused[node_id] = why
    self.log(f"server: SuperNode {node_id} refused: {why}")

  def lose(self, client_id: int) -> None:
    """Stops sending to a client that did not answer (dead or hung) until its SuperNode
    goes offline and comes back, so later rounds do not wait for it."""
    self.lost.add(self.clients.pop(client_id))
    self.log(f"server: client {client_id} did not answer; skipped until its SuperNode "
             "reconnects")


class FlowerServer:
  """The server side of any algorithm on a Flower ``Grid`` (see module docstring).

  Args:
    grid: the ServerApp's grid.
    node: the server's state and checkpoints.
    settings: the run config.
    log: where progress lines go.
    roster: the SuperNodes known so far (None: none yet).
  """

  def __init__(self, grid: Grid, node: fed_lib.ServerNode, settings: ServerSettings,
               log: Callable[[str], None] = print, roster: Roster | None = None):
    self.grid, self.node, self.settings, self.log = grid, node, settings, log
    fed = node.fed
    self.layout = fed.runtime.layout
    self.config_json = config_json(fed)
    self.roster = roster or Roster(grid, self.config_json, self.layout.num_clients,
                                   settings.startup_timeout, log)
    self.min_fit = settings.min_fit_clients or len(node.draw())
    self.min_available = settings.min_available_clients or self.min_fit
    self.pending_row: dict | None = None
    meta = node.meta
    self.up, self.down = meta.get("uplink_params", 0.0), meta.get("downlink_params", 0.0)
    self.wall0, self.t0 = meta.get("wall_s", 0.0), time.perf_counter()
    self.rows = metrics_lib.MetricsLog(os.path.join(node.workdir, "metrics.jsonl"),
                                       node.round)
    self.progress = metrics_lib.Progress(fed.config.num_rounds, node.round, log)
    # the last evaluation's per-client accuracies, kept in the checkpoint's metadata
    self.last_accuracy = {int(k): v for k, v in meta.get("per_client_test_acc", {}).items()}
    self.payload_size = [base.count_params(fed_lib.abstract_payload(fed, g))
                         for g in node.groups]

  # ---- SuperNodes
  def _message(self, client_id: int, kind: str, round_: int, payload=None, key=None,
               timeout: float | None = None) -> Message:
    values = {"client-id": client_id, "round": round_, "config": self.config_json}
    if key is not None:
      values["key"] = fed_lib.key_to_bytes(key)
    content = RecordDict({RECORD: _record(**values)})
    if payload is not None:
      content[PAYLOAD] = ArrayRecord([np.ascontiguousarray(a) for a in payload])
    return Message(content, dst_node_id=self.roster.clients[client_id],
                   message_type=kind, group_id=str(round_),
                   ttl=timeout or self.settings.round_timeout)

  # ---- rounds
  def train_round(self) -> bool:
    """Trains, checks and aggregates the next round; False when too few uploads came."""
    node, round_ = self.node, self.node.round + 1
    draw = node.draw()
    payloads = {g: node.payload(g) for g in node.groups}
    messages = {c: self._message(c, MessageType.TRAIN, round_,
                                 payloads[self.layout.group_of(c)[0]], key)
                for c, (_, key) in sorted(draw.items(), key=lambda kv: kv[1][0])
                if c in self.roster.clients}
    missing = sorted(set(draw) - set(messages))
    self.log(f"server: round {round_}: training {len(messages)} of {len(draw)} drawn "
             "clients" + (f" (not connected: {missing})" if missing else ""))
    replies = exchange(self.grid, messages, self.settings.round_timeout,
                       quorum=self.min_fit, grace=self.settings.straggler_timeout)
    received, failed = {}, []
    for c, reply in sorted(replies.items()):
      g = self.layout.group_of(c)[0]
      try:
        received[c] = read_upload(reply, c, node.upload_like[g],
                                  fed_lib.expected_counts(node.fed, c)[0])
      except fed_lib.UploadRejected as err:
        failed.append(c)
        self.log(f"server: round {round_}: client {c} failed: {err}")
        if unanswered(reply):
          self.roster.lose(c)
    if len(received) < self.min_fit:
      self.log(f"server: round {round_}: {len(received)} uploads, {len(failed)} failed; "
               f"fewer than min-fit-clients={self.min_fit}: not aggregated")
      return False
    extra = node.aggregate({c: (a, w) for c, (a, w, _) in received.items()})
    ids = sorted(received)  # replies arrive in any order; sums go in client order
    self.up += float(np.mean([fed_lib.num_scalars(received[c][0]) for c in ids]))
    self.down += float(np.mean([self.payload_size[self.layout.group_of(c)[0]]
                                for c in ids]))
    losses = [received[c][2].get("loss", math.nan) for c in ids]
    self.pending_row = {"round": round_, "train_loss": float(np.mean(losses)),
                        "clients_trained": len(received), "clients_failed": len(failed),
                        **extra}
    self.log(f"server: round {round_}: aggregated {len(received)} uploads "
             f"({len(failed)} failed)")
    if not self._is_eval_round(round_):
      self._save()
    return True

  def evaluate_round(self) -> None:
    """Every connected client evaluates its model; writes the row, checkpoints."""
    round_ = self.node.round
    payloads = {g: self.node.payload(g) for g in self.node.groups}
    messages = {c: self._message(c, MessageType.EVALUATE, round_,
                                 payloads[self.layout.group_of(c)[0]])
                for c in sorted(self.roster.clients)}
    accuracy = {}
    for c, reply in sorted(exchange(self.grid, messages,
                                    self.settings.round_timeout).items()):
      try:
        correct, total = read_evaluation(reply, c, fed_lib.expected_counts(self.node.fed,
                                                                           c)[1])
        accuracy[c] = correct / max(total, 1)
      except fed_lib.UploadRejected as err:
        self.log(f"server: round {round_}: client {c}'s evaluation failed: {err}")
        if unanswered(reply):
          self.roster.lose(c)
    self._finish_row(accuracy)

  def run(self) -> None:
    """Rounds until ``num_rounds``; raises RuntimeError when a round cannot aggregate."""
    config = self.node.fed.config
    first = True
    while self.node.round < config.num_rounds:
      for attempt in range(1, self.settings.round_attempts + 1):
        self.roster.discover(self.layout.num_clients if first else self.min_available)
        first = False
        if self.train_round():
          break
        if attempt == self.settings.round_attempts:
          raise RuntimeError(f"round {self.node.round + 1} got fewer than "
                             f"min-fit-clients={self.min_fit} uploads in {attempt} "
                             "attempts; resubmit the run to resume")
      if self._is_eval_round(self.node.round):
        self.evaluate_round()

  # ---- rows and checkpoints
  def _is_eval_round(self, round_: int) -> bool:
    config = self.node.fed.config
    return round_ % config.eval_every == 0 or round_ == config.num_rounds

  def _wall(self) -> float:
    return self.wall0 + time.perf_counter() - self.t0

  def _save(self) -> None:
    self.node.save({"uplink_params": self.up, "downlink_params": self.down,
                    "wall_s": self._wall(),
                    "per_client_test_acc": {str(k): v for k, v in
                                            sorted(self.last_accuracy.items())}})

  def _finish_row(self, accuracy: dict[int, float]) -> None:
    """Writes the evaluation round's metrics row, then checkpoints the round."""
    row, self.pending_row = self.pending_row, None
    self.last_accuracy = accuracy
    acc = (float(np.mean([accuracy[k] for k in sorted(accuracy)])) if accuracy
           else math.nan)  # in client order: the same float sum on every run
    row = {"round": row["round"], "mean_test_acc": acc, "train_loss": row["train_loss"],
           "uplink_params": self.up, "downlink_params": self.down,
           **{k: v for k, v in row.items() if k not in ("round", "train_loss")},
           "clients_evaluated": len(accuracy), "wall_s": self._wall()}
    self.rows.append(row)
    self.progress.update(row["round"], acc, row["train_loss"])
    self._save()

  def summary(self) -> dict:
    rows = self.rows.rows
    return {
        "final_mean_test_acc": rows[-1]["mean_test_acc"] if rows else math.nan,
        "best_mean_test_acc": max((r["mean_test_acc"] for r in rows), default=math.nan),
        "per_client_test_acc": {str(k): v for k, v in sorted(self.last_accuracy.items())},
        "rounds_completed": self.node.round,
        "uplink_params": self.up, "downlink_params": self.down,
        "refused_supernodes": {str(k): v for k, v in sorted(self.roster.refused.items())},
        "config": self.node.fed.config.to_dict(),
        "environment": environment.describe(),  # the server process's (clients may differ)
    }


def config_json(fed: fed_lib.Federation) -> str:
  """The resolved experiment config, as every message carries it."""
  return json.dumps(fed.config.to_dict(), sort_keys=True)


def _server_log(workdir: str) -> Callable[[str], None]:
  """Prints a line (Flower keeps it as the run's log) and appends it, timed, to
  server.log."""
  path = os.path.join(workdir, "server.log")

  def log(line: str) -> None:
    print(line, flush=True)
    with open(path, "a") as f:
      f.write(f"{time.strftime('%H:%M:%S')} {line}\n")
  return log


def run_server(grid: Grid, settings: ServerSettings) -> dict:
  """Runs (or resumes) the server of a deployment until ``num_rounds``.

  Returns:
    the summary also written to ``<workdir>/summary.json``.
  """
  fed = fed_lib.prepare_federation(load_config(settings.config, settings.overrides))
  workdir = os.path.abspath(settings.workdir)
  os.makedirs(workdir, exist_ok=True)
  if settings.fresh_start:
    runfiles.clear_outputs(workdir)
  log = _server_log(workdir)
  use_compilation_cache(os.path.join(workdir, "jax_cache"))
  roster = Roster(grid, config_json(fed), fed.runtime.layout.num_clients,
                  settings.startup_timeout, log)
  roster.discover(0)  # the SuperNodes compile their rounds while the server compiles
  node = fed_lib.ServerNode(fed, workdir)
  metrics_lib.write_json(os.path.join(workdir, "config.json"), fed.config.to_dict())
  server = FlowerServer(grid, node, settings, log, roster)
  if node.round:
    log(f"server: resumed from round {node.round} in {workdir}")
  log(f"server: run {grid.run.run_id}: {fed.runtime.layout.num_clients} clients, "
      f"{fed.config.num_rounds - node.round} rounds of {fed.config.algorithm} to go")
  try:
    server.run()
  finally:
    node.close()
    summary = server.summary()
    metrics_lib.write_json(os.path.join(workdir, "summary.json"), summary)
  log(f"server: done after {node.round} rounds; final mean test acc "
      f"{summary['final_mean_test_acc']:.4f}")
  return summary


server_app = ServerApp()


@server_app.main()
def _server_main(grid: Grid, context: Context) -> None:
  run_server(grid, ServerSettings.from_run_config(context.run_config))


# ---------------------------------------------------------------- the client
def _say(line: str) -> None:
  """A ClientApp's progress line (in its SuperNode's output), timed."""
  print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


def open_client(settings: NodeSettings, config_json: str) -> fed_lib.ClientNode:
  """This SuperNode's client: the config the server sent, the node's data and state."""
  import ml_collections  # pylint: disable=import-outside-toplevel
  config = ml_collections.ConfigDict(json.loads(config_json))
  if settings.data_path:
    config.data.path = settings.data_path
  if not 0 <= settings.client_id < config.num_clients:
    raise ValueError(f"client-id={settings.client_id} is not in [0, config.num_clients="
                     f"{config.num_clients})")
  workdir = client_workdir(settings, config)
  use_compilation_cache(os.path.join(settings.workdir, "jax_cache"))
  fed, data = fed_lib.prepare_client(config, settings.client_id, workdir)
  return fed_lib.ClientNode(fed, settings.client_id, data, workdir)


def client_workdir(settings: NodeSettings, config) -> str:
  """Where this client keeps the state of one experiment, ``<workdir>/runs/<hash of
  the config but its resumable keys>``: one SuperNode serves several experiments, and
  a resubmitted run (more rounds, say) finds its state."""
  flat = runfiles.comparable(config.to_dict())
  digest = hashlib.sha256(json.dumps(flat, sort_keys=True, default=str).encode())
  return os.path.join(settings.workdir, "runs", digest.hexdigest()[:12])


def _addressed(message: Message, settings: NodeSettings) -> ConfigRecord:
  """The message's record, after checking it is meant for this client."""
  meta = message.content.config_records[RECORD]
  if meta.get("client-id") != settings.client_id:
    raise ValueError(f"a message for client {meta.get('client-id')!r} reached client "
                     f"{settings.client_id}'s SuperNode; refused")
  return meta


def _payload(message: Message) -> list[np.ndarray]:
  return [a.numpy() for a in _ordered_arrays(message.content.array_records[PAYLOAD])]


def _drill(kind: str, meta: dict) -> None:
  """Announces a fault drill (``NodeSettings.fault``); ``kill`` and ``hang`` act now."""
  _say(f"client {meta['client-id']}: fault drill {kind!r} in round {meta['round']}")
  if kind == "kill":
    os.killpg(os.getpgrp(), signal.SIGKILL)  # the SuperNode and everything it started
  while kind == "hang":
    time.sleep(3600)


def _malformed(kind: str, upload: list[np.ndarray], out: dict) -> list[np.ndarray]:
  """The upload (and reply record ``out``) a malformed-upload drill sends instead."""
  if kind == "nan":
    return [np.full_like(a, np.nan) if np.issubdtype(a.dtype, np.inexact) else a
            for a in upload]
  if kind == "oversize":
    return upload + [np.zeros(1 << 20, np.float32)]
  if kind == "shape":
    return [upload[0][None]] + upload[1:]
  if kind == "impersonate":
    out["client-id"] += 1  # speaks for the next client
  return upload


def _train(message: Message, context: Context) -> Message:
  settings = NodeSettings.from_node_config(context.node_config)
  meta = _addressed(message, settings)
  round_ = int(meta["round"])
  drill = parse_faults(settings.fault).get(round_)
  if drill:
    _drill(drill, {"client-id": settings.client_id, "round": round_})
  t0 = time.perf_counter()
  node = open_client(settings, meta["config"])
  try:
    upload, weight, aux = node.fit(round_, _payload(message),
                                   fed_lib.key_from_bytes(meta["key"]))
    _say(f"client {settings.client_id}: round {round_} trained on {weight} examples | "
         f"loss {aux.get('loss', math.nan):.4f} | {time.perf_counter() - t0:.1f}s")
  finally:
    node.close()
  out = {"client-id": settings.client_id, "round": round_, "num-examples": weight}
  if drill:
    upload = _malformed(drill, upload, out)
  return Message(RecordDict({RECORD: _record(**out),
                             UPLOAD: ArrayRecord([np.ascontiguousarray(a) for a in upload]),
                             AUX: MetricRecord(aux)}), reply_to=message)


def _evaluate(message: Message, context: Context) -> Message:
  settings = NodeSettings.from_node_config(context.node_config)
  meta = _addressed(message, settings)
  t0 = time.perf_counter()
  node = open_client(settings, meta["config"])
  try:
    correct, total = node.evaluate(_payload(message))
  finally:
    node.close()
  _say(f"client {settings.client_id}: round {meta['round']} evaluated: {correct}/{total} "
       f"correct | {time.perf_counter() - t0:.1f}s")
  return Message(RecordDict({RECORD: _record(**{
      "client-id": settings.client_id, "correct": correct, "total": total})}),
                 reply_to=message)


def _query(message: Message, context: Context) -> Message:
  settings = NodeSettings.from_node_config(context.node_config)
  t0 = time.perf_counter()
  node = open_client(settings, message.content.config_records[RECORD]["config"])
  try:
    node.warmup()
  finally:
    node.close()
  _say(f"client {settings.client_id} ({node.fed.client_archs[settings.client_id]}): state "
       f"from round {node.state_round}, ready in {time.perf_counter() - t0:.1f}s")
  return Message(RecordDict({RECORD: _record(**{
      "client-id": settings.client_id, "state-round": node.state_round})}),
                 reply_to=message)


client_app = ClientApp()
client_app.query()(_query)
client_app.train()(_train)
client_app.evaluate()(_evaluate)
