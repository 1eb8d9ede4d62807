r"""The server of a deployment on a Flower ``Grid``: rounds, checks, defences, checkpoints.

Round r (``FlowerServer.train_round``): learn new SuperNodes (``roster.Roster``: all
``num_clients`` before round 1, at most ``startup-timeout`` s; ``min-available-clients``
later), draw the round's clients as the simulator does, leave out the benched ones
(``robust.Bench``), send each connected drawn client its train message, wait at most
``round-timeout`` s (``straggler-timeout`` s once the quorum of uploads is in), then:

1. read every reply defensively (``wire.read_upload``: sender, the message's round and
   nonce echoed (no replay), size, the ``.npy`` headers against the expected shapes and
   dtypes before any allocation, finite values, weight, metrics); any exception there
   is that client's rejection, logged with its reason;
2. bound every upload (on by default, ``upload-norm-bound`` 10): its update's
   coordinates and norm against the round's lower medians (``robust.bound_updates``),
   or, for class tables, its counts by the client's known examples and its rows
   (``robust.bound_tables``); a clipped upload is named in the log;
3. with at least the quorum of uploads left (``ServerSettings.quorum``: by default half
   of the clients sent a message, rounded up), aggregate them (``aggregation``: the
   algorithm's mean, or a coordinate-wise median or trimmed mean); else the round is
   tried again (at most ``round-attempts`` times, then the run fails);
4. refuse a new server state holding a non-finite value or one beyond
   ``robust.STATE_BOUND``; the upload that made it so is found by leaving one out at a
   time, rejected by name, and the rest aggregated (no honest client is blamed); where
   no single upload explains it the round is tried again from the previous state, so no
   checkpoint holds one (and a resumed run sets such a checkpoint aside);
5. bench a client rejected ``bench-after`` rounds running for ``bench-rounds`` rounds.

A missing reply, an error reply or a rejected upload is that client's failure for the
round, counted in ``metrics.jsonl``'s ``clients_failed``; a client that did not answer is
skipped until its SuperNode reconnects (``Roster.lose``). The state is checkpointed after
every aggregated round (after the metrics row on evaluation rounds). A resubmitted run
with the same ``workdir`` resumes from the newest checkpoint; clients roll their own
state back to it (``federation.ClientNode``).
"""
from __future__ import annotations

import json
import math
import os
import time
from typing import Callable

import jax
import numpy as np
from flwr.app import ArrayRecord
from flwr.app import Message
from flwr.app import MessageType
from flwr.app import RecordDict
from flwr.serverapp import Grid

from fedjax_het.algorithms import base
from fedjax_het.deploy import federation as fed_lib
from fedjax_het.deploy import private
from fedjax_het.deploy import robust
from fedjax_het.deploy import settings as settings_lib
from fedjax_het.deploy import wire
from fedjax_het.deploy.roster import Roster
from fedjax_het.deploy.roster import exchange
from fedjax_het.training import environment
from fedjax_het.training import metrics as metrics_lib
from fedjax_het.training import runfiles


class FlowerServer:
  """The server side of any algorithm on a Flower ``Grid`` (see module docstring).

  Args:
    grid: the ServerApp's grid.
    node: the server's state and checkpoints.
    settings: the run config.
    log: where progress lines go.
    roster: the SuperNodes known so far (None: none yet).
  """

  def __init__(self, grid: Grid, node: fed_lib.ServerNode,
               settings: settings_lib.ServerSettings,
               log: Callable[[str], None] = print, roster: Roster | None = None):
    self.grid, self.node, self.settings, self.log = grid, node, settings, log
    fed = node.fed
    robust.check_rule(settings.aggregation, fed.config.algorithm)
    self.layout = fed.runtime.layout
    self.config_json = config_json(fed)
    self.roster = roster or Roster(grid, self.config_json, self.layout.num_clients,
                                   settings.startup_timeout, log)
    self.min_available = settings.min_available_clients or settings.quorum(
        len(node.draw()))
    self.bench = robust.Bench(settings.bench_after, settings.bench_rounds)
    self.quorum = settings.quorum(len(node.draw()))  # of the round last sent
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
    # per group: the upload is the payload trained (its update = upload - payload), a
    # class table (``robust.bound_tables``), or an update of its own (FedKD's factors)
    self.update_of_payload = [_alike(node.upload_like[g], fed_lib.abstract_payload(fed, g))
                              for g in node.groups]
    self.tables = [robust.is_table(node.upload_like[g]) for g in node.groups]
    self.nonces: dict[int, str] = {}  # the nonce of each client's last message
    self.sent: dict[int, list[np.ndarray]] = {}  # the payloads of the round, by group
    self.update_norms: dict[int, float] = {}  # of the round's uploads as received
    self.round_norms: dict[int, dict[int, float]] = {}  # round -> update_norms
    robust.check_trim(settings.aggregation, settings.trim_fraction, len(node.draw()))
    for line in self.defence_lines():
      log(line)

  def defence_lines(self) -> list[str]:
    """What bounds one client's influence in this run (its first lines)."""
    s = self.settings
    warning = robust.unbounded_warning(s.aggregation, s.upload_norm_bound)
    if warning:
      return [warning]
    what = ("class tables: counts cut to each client's known examples, rows"
            if any(self.tables) else "updates")
    return [f"server: aggregation {s.aggregation}"
            + (f" (trim-fraction {s.trim_fraction:g})" if s.aggregation == "trimmed-mean"
               else "")
            + f"; {what} bounded by {s.upload_norm_bound:g} x the round's reference "
            f"({s.upload_norm_action})" if s.upload_norm_bound > 0 else
            f"server: aggregation {s.aggregation}; no upload bound"]

  # ---- SuperNodes
  def _message(self, client_id: int, kind: str, round_: int, payload=None, key=None,
               timeout: float | None = None) -> Message:
    self.nonces[client_id] = wire.new_nonce()
    values = {"client-id": client_id, "round": round_, "config": self.config_json,
              "nonce": self.nonces[client_id]}
    if key is not None:
      values["key"] = fed_lib.key_to_bytes(key)
    content = RecordDict({wire.RECORD: wire.record(**values)})
    if payload is not None:
      content[wire.PAYLOAD] = ArrayRecord([np.ascontiguousarray(a) for a in payload])
    return Message(content, dst_node_id=self.roster.clients[client_id],
                   message_type=kind, group_id=str(round_),
                   ttl=timeout or self.settings.round_timeout)

  # ---- rounds
  def _send_round(self, round_: int) -> tuple[dict, dict[int, Message | None]]:
    """Sends the round's train messages; returns (the draw, {client: reply})."""
    node = self.node
    draw = node.draw()
    payloads = {g: node.payload(g) for g in node.groups}
    self.sent = payloads
    benched = [c for c in self.bench.benched(round_) if c in draw]
    messages = {c: self._message(c, MessageType.TRAIN, round_,
                                 payloads[self.layout.group_of(c)[0]], key)
                for c, (_, key) in sorted(draw.items(), key=lambda kv: kv[1][0])
                if c in self.roster.clients and c not in benched}
    missing = sorted(set(draw) - set(messages) - set(benched))
    self.log(f"server: round {round_}: training {len(messages)} of {len(draw)} drawn "
             "clients" + (f" (not connected: {missing})" if missing else "")
             + (f" (benched: {benched})" if benched else ""))
    self.quorum = self.settings.quorum(len(messages))
    replies = exchange(self.grid, messages, self.settings.round_timeout,
                       quorum=self.quorum, grace=self.settings.straggler_timeout)
    return draw, replies

  def _read_round(self, round_: int, replies) -> tuple[dict, list[int]]:
    """({client: (arrays, weight, aux)} accepted, [clients rejected]) of the replies;
    every rejection logged with its reason, every upload bounded (``_bound``)."""
    node, received, failed = self.node, {}, []
    for c, reply in sorted(replies.items()):
      g = self.layout.group_of(c)[0]
      try:
        received[c] = wire.read_upload(reply, c, node.upload_like[g],
                                       fed_lib.expected_counts(node.fed, c)[0],
                                       nonce=self.nonces.get(c), round_=round_)
      except Exception as err:  # pylint: disable=broad-exception-caught
        failed.append(c)
        self.log(f"server: round {round_}: client {c} failed: {wire.rejection(err)}")
        if wire.unanswered(reply):
          self.roster.lose(c)
    self.update_norms = {}
    kept, notes = self._bound(received)
    self.round_norms[round_] = dict(self.update_norms)
    for c, why in sorted(notes.items()):
      if c in kept:
        self.log(f"server: round {round_}: client {c}'s upload clipped: {why}")
        received[c] = (kept[c],) + received[c][1:]
      else:
        self.log(f"server: round {round_}: client {c} failed: {why}")
        failed.append(c)
        del received[c]
    return received, sorted(failed)

  def _bound(self, received: dict) -> tuple[dict, dict[int, str]]:
    """The uploads bounded (``robust.bound_tables`` for class tables,
    ``robust.bound_updates`` for the others); ({client: arrays} kept, {client: why})."""
    s, group = self.settings, lambda c: self.layout.group_of(c)[0]
    bound = s.upload_norm_bound
    tables = {c: r[0] for c, r in received.items() if self.tables[group(c)]}
    others = {c: r[0] for c, r in received.items() if not self.tables[group(c)]}
    kept, notes = {}, {}
    if tables:
      known = {}
      for c in tables:
        per_class = fed_lib.expected_class_counts(self.node.fed, c)
        known[c] = per_class if per_class is not None else float(received[c][1])
      k, n = robust.bound_tables(tables, known, bound)
      kept.update(k)
      notes.update(n)
    if others:
      refs = {c: self.sent.get(group(c)) if self.update_of_payload[group(c)] else None
              for c in others}
      k, n, norms = robust.bound_updates(others, refs, bound, s.upload_norm_action)
      self.update_norms = norms
      kept.update(k)
      notes.update(n)
    return kept, notes

  def _aggregate(self, round_: int, received: dict, failed: list[int]) -> dict | None:
    """Aggregates ``received``; the protocol's metrics, or None (not aggregated).

    A new state that fails the checks (``federation.state_problem``) is never adopted:
    each upload is left out in turn (client order) until the rest pass; that client is
    rejected by name (moved from ``received`` to ``failed``) and the rest adopted.
    """
    node, s = self.node, self.settings

    def attempt(uploads: dict):
      rows = robust.robust_uploads({c: r[0] for c, r in uploads.items()}, s.aggregation,
                                   s.trim_fraction)
      return node.aggregate({c: (rows[c], uploads[c][1]) for c in uploads})
    try:
      return attempt(received)
    except fed_lib.NonFiniteState as err:
      self.log(f"server: round {round_}: not adopted: {err}; looking for the upload "
               "that caused it (each left out in turn)")
    for c in sorted(received):
      rest = {k: v for k, v in received.items() if k != c}
      if len(rest) < self.quorum:
        break
      try:
        extra = attempt(rest)
      except fed_lib.NonFiniteState:
        continue
      self.log(f"server: round {round_}: client {c} failed: the aggregate with its upload "
               "fails the server's checks, without it passes; aggregated the others")
      del received[c]
      failed.append(c)
      return extra
    self.log(f"server: round {round_}: not aggregated: no single upload explains the "
             "failed checks; kept the previous state")
    return None

  def train_round(self) -> bool:
    """Trains, checks and aggregates the next round; False when too few uploads came
    (or no aggregate passed the checks)."""
    round_ = self.node.round + 1
    _, replies = self._send_round(round_)
    received, failed = self._read_round(round_, replies)
    extra = None
    if len(received) < self.quorum:
      self.log(f"server: round {round_}: {len(received)} uploads, {len(failed)} failed; "
               f"fewer than the quorum of {self.quorum} (min-fit-clients): not aggregated")
    else:
      extra = self._aggregate(round_, received, failed)
    failed.sort()
    rejected = [c for c in failed if replies.get(c) is not None
                and not wire.unanswered(replies[c])]
    for c, last in sorted(self.bench.record(round_, rejected, list(received)).items()):
      self.log(f"server: round {round_}: client {c} benched until round {last} (not "
               f"drawn in rounds {round_ + 1}-{last}): its uploads were rejected "
               f"{self.settings.bench_after} rounds running")
    if extra is None:
      return False
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
        correct, total = wire.read_evaluation(
            reply, c, fed_lib.expected_counts(self.node.fed, c)[1], nonce=self.nonces.get(c))
        accuracy[c] = correct / max(total, 1)
        if total and correct == total:
          self.log(f"server: round {round_}: client {c} reports all its {total} test "
                   "examples correct: its own claim, which the server cannot check")
      except Exception as err:  # pylint: disable=broad-exception-caught
        self.log(f"server: round {round_}: client {c}'s evaluation failed: "
                 f"{wire.rejection(err)}")
        if wire.unanswered(reply):
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
          raise RuntimeError(f"round {self.node.round + 1} was not aggregated in "
                             f"{attempt} attempts (fewer than the quorum of "
                             f"{self.quorum} uploads (min-fit-clients), or a non-finite "
                             "aggregate); resubmit the run to resume")
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


def _alike(upload, payload) -> bool:
  """Whether an upload shaped ``upload`` has the leaves of the payload ``payload``
  (structure, shapes and dtypes): it is then the payload trained."""
  return jax.tree.structure(upload) == jax.tree.structure(payload) and all(
      a.shape == b.shape and a.dtype == b.dtype
      for a, b in zip(jax.tree.leaves(upload), jax.tree.leaves(payload)))


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


def run_server(grid: Grid, settings: settings_lib.ServerSettings) -> dict:
  """Runs (or resumes) the server of a deployment until ``num_rounds``.

  Returns:
    the summary also written to ``<workdir>/summary.json``.
  """
  fed = fed_lib.prepare_federation(settings_lib.load_config(settings.config,
                                                            settings.overrides))
  robust.check_rule(settings.aggregation, fed.config.algorithm)  # before any round
  workdir = os.path.abspath(settings.workdir)
  private.ensure_private(workdir)  # its checkpoints, logs and compiled programs
  if settings.fresh_start:
    runfiles.clear_outputs(workdir)
  log = _server_log(workdir)
  settings_lib.use_compilation_cache(os.path.join(workdir, "jax_cache"))
  roster = Roster(grid, config_json(fed), fed.runtime.layout.num_clients,
                  settings.startup_timeout, log)
  roster.discover(0)  # the SuperNodes compile their rounds while the server compiles
  node = fed_lib.ServerNode(fed, workdir)
  metrics_lib.write_json(os.path.join(workdir, "config.json"), fed.config.to_dict())
  for line in node.repairs:
    log(f"server: {line}")
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
