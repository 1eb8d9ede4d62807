"""Any fedjax-het algorithm over Flower: one process per client, one server process.

``FlowerClient`` (a ``flwr.client.NumPyClient``) wraps a ``ClientNode`` and
``HetStrategy`` (a ``flwr.server.strategy.Strategy``) wraps a ``ServerNode``; both only
call the algorithm's ``Protocol`` (``fedjax_het.algorithms.base``), the pure functions
the simulator's round is built from, so no algorithm is written twice. What crosses the
wire is what the protocol sends: the payload ``downlink(server, g)`` for the client's
architecture group down (FedMRL: the small model theta; FedMoE: the global expert; FD:
the global logit table; FedProto: the prototypes), the client's ``upload`` up, plus the
round number and the client's PRNG key (so a deployment draws what the simulator draws).

Round r on the server (``HetStrategy``):

1. ``configure_fit``: waits for clients (all ``num_clients`` before round 1, at most
   ``startup_timeout`` s; ``min_available_clients`` later), learns each connection's
   client id once (``get_properties``), draws the round's clients as the simulator does
   and sends each connected drawn client its group's payload.
2. ``aggregate_fit``: with at least ``min_fit_clients`` uploads it aggregates them
   (clients that failed or disconnected are left out: the strategy's minimum decides),
   advances the round and checkpoints (orbax) before anything else; with fewer the
   round is not aggregated and is tried again by the next Flower round.
3. On evaluation rounds (``eval_every``, and the last) every connected client evaluates
   its personalized model on its own test split; the server writes the same
   ``metrics.jsonl`` row as the simulator (plus ``clients_*`` counts).

Interrupted runs: rerun the server command with the same ``--workdir`` and it resumes
from its newest checkpoint; restarted clients restore their own checkpoints (see
``federation.ClientNode``).

Flower's gRPC transport is started with ``flwr.server.start_server`` and
``flwr.client.start_client`` (marked deprecated in Flower in favour of SuperLink /
SuperNode processes, and still shipped): it keeps the strategy and the clients in our
processes, which a resumable, checkpointed server needs. docs/deploy.md has the
commands.
"""
from __future__ import annotations

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # no phoning home from a lab cluster

import math  # noqa: E402
import signal  # noqa: E402
import time  # noqa: E402
from typing import Callable  # noqa: E402

import flwr  # noqa: E402
import numpy as np  # noqa: E402
from flwr.common import (Code, EvaluateIns, FitIns, GetPropertiesIns,  # noqa: E402
                         ndarrays_to_parameters, parameters_to_ndarrays)
from flwr.server.strategy import Strategy  # noqa: E402

from fedjax_het.algorithms import base  # noqa: E402
from fedjax_het.deploy import federation as fed_lib  # noqa: E402
from fedjax_het.training import loop  # noqa: E402
from fedjax_het.training import metrics as metrics_lib  # noqa: E402


class FlowerClient(flwr.client.NumPyClient):
  """A Flower client around one ``ClientNode``.

  Args:
    node: the client's state, data and checkpoints.
    log: where progress lines go.
    kill_at_round: fault injection for tests and drills: the process SIGKILLs itself
      when asked to train this round (0: never).
  """

  def __init__(self, node: fed_lib.ClientNode, *, log: Callable[[str], None] = print,
               kill_at_round: int = 0):
    self.node, self.log, self.kill_at_round = node, log, kill_at_round

  def get_properties(self, config):
    return {"client_id": self.node.client_id, "group": self.node.group}

  def get_parameters(self, config):
    return []  # the server never asks: it holds its own state

  def fit(self, parameters, config):
    round_ = int(config["round"])
    if round_ == self.kill_at_round:
      self.log(f"client {self.node.client_id}: killing myself in round {round_} "
               "(--kill_at_round)")
      os.kill(os.getpid(), signal.SIGKILL)
    t0 = time.perf_counter()
    upload, weight, aux = self.node.fit(round_, parameters,
                                        fed_lib.key_from_bytes(config["key"]))
    self.log(f"client {self.node.client_id}: round {round_} trained on {weight} examples "
             f"| loss {aux.get('loss', math.nan):.4f} | {time.perf_counter() - t0:.1f}s")
    return upload, weight, dict(aux, client_id=self.node.client_id)

  def evaluate(self, parameters, config):
    correct, total = self.node.evaluate(parameters)
    return 0.0, total, {"correct": correct, "total": total,
                        "client_id": self.node.client_id}


class HetStrategy(Strategy):
  """The server side of any algorithm as a Flower strategy (see module docstring).

  Args:
    node: the server's state and checkpoints.
    min_fit_clients: uploads needed to aggregate a round (0: every drawn client).
    min_available_clients: connected clients needed to start a round after the first
      (0: ``min_fit_clients``).
    startup_timeout: seconds to wait for all clients before round 1.
    log: where progress lines go.
  """

  def __init__(self, node: fed_lib.ServerNode, *, min_fit_clients: int = 0,
               min_available_clients: int = 0, startup_timeout: float = 600,
               log: Callable[[str], None] = print):
    super().__init__()
    self.node, self.log = node, log
    config = node.fed.config
    drawn = len(node.draw())
    self.min_fit = min_fit_clients or drawn
    self.min_available = min_available_clients or self.min_fit
    self.startup_timeout = startup_timeout
    self.ids: dict[str, int] = {}  # Flower connection id -> our client id
    self.pending_row: dict | None = None
    meta = node.meta
    self.up, self.down = meta.get("uplink_params", 0.0), meta.get("downlink_params", 0.0)
    self.wall0, self.t0 = meta.get("wall_s", 0.0), time.perf_counter()
    self.rows = metrics_lib.MetricsLog(os.path.join(node.workdir, "metrics.jsonl"),
                                       node.round)
    self.progress = metrics_lib.Progress(config.num_rounds, node.round, log)
    self.last_accuracy: dict[int, float] = {}
    self.started = False
    # what a client of each group receives: static shapes, counted once
    self.payload_size = [base.count_params(fed_lib.abstract_payload(node.fed, g))
                         for g in node.groups]

  # ---- helpers
  def _connected(self, client_manager, wait_for: int, timeout: float) -> dict:
    """{client id: proxy} of the connected clients, after waiting for ``wait_for``."""
    client_manager.wait_for(wait_for, timeout=int(timeout))
    out = {}
    for cid, proxy in client_manager.all().items():
      if cid not in self.ids:
        try:
          props = proxy.get_properties(GetPropertiesIns({}), timeout=60, group_id=None)
          self.ids[cid] = int(props.properties["client_id"])
        except Exception as err:  # noqa: BLE001 - a client that vanished is skipped
          self.log(f"server: connection {cid} did not say its client id ({err})")
          continue
      client_id = self.ids[cid]
      if client_id in out:
        self.log(f"server: client {client_id} is connected twice; using one connection")
      out[client_id] = proxy
    return out

  def _payloads(self) -> dict:
    """The server's current payload of every group, as Flower parameters."""
    return {g: ndarrays_to_parameters(self.node.payload(g)) for g in self.node.groups}

  def _wall(self) -> float:
    return self.wall0 + time.perf_counter() - self.t0

  def _save(self) -> None:
    self.node.save({"uplink_params": self.up, "downlink_params": self.down,
                    "wall_s": self._wall()})

  def _is_eval_round(self, round_: int) -> bool:
    config = self.node.fed.config
    return round_ % config.eval_every == 0 or round_ == config.num_rounds

  # ---- Flower's Strategy interface
  def initialize_parameters(self, client_manager):
    return ndarrays_to_parameters([])  # the state lives in self.node, not in Flower

  def configure_fit(self, server_round, parameters, client_manager):
    layout = self.node.fed.runtime.layout
    wait = self.min_available if self.started else layout.num_clients  # all at round 1
    self.started = True
    connected = self._connected(client_manager, wait, self.startup_timeout)
    round_ = self.node.round + 1
    draw = self.node.draw()
    payloads = self._payloads()
    out = []
    for client_id, (_, key) in sorted(draw.items(), key=lambda kv: kv[1][0]):
      if client_id in connected:
        g = layout.group_of(client_id)[0]
        config = {"round": round_, "key": fed_lib.key_to_bytes(key)}
        out.append((connected[client_id], FitIns(payloads[g], config)))
    missing = sorted(set(draw) - set(connected))
    self.log(f"server: round {round_}: training {len(out)} of {len(draw)} drawn clients"
             + (f" (not connected: {missing})" if missing else ""))
    return out

  def aggregate_fit(self, server_round, results, failures):
    round_ = self.node.round + 1
    received, failures = {}, list(failures)
    for proxy, res in results:
      client_id = self.ids.get(proxy.cid)
      if client_id is not None and res.status.code == Code.OK:
        try:  # a misbehaving client's upload is its failure, not the server's
          arrays = parameters_to_ndarrays(res.parameters)
          self.node.check_upload(client_id, arrays)
        except Exception as err:  # pylint: disable=broad-except
          self.log(f"server: round {round_}: client {client_id}'s upload does not decode "
                   f"({type(err).__name__}: {err}); counted as its failure")
          failures.append((proxy, res))
          continue
        received[client_id] = (arrays, res.num_examples, res.metrics)
    if len(received) < self.min_fit:
      self.log(f"server: round {round_}: {len(received)} uploads, {len(failures)} "
               f"failures; fewer than min_fit_clients={self.min_fit}: not aggregated")
      return None, {}
    extra = self.node.aggregate({c: (a, w) for c, (a, w, _) in received.items()})
    ids = sorted(received)  # replies arrive in any order; sums go in client order
    layout = self.node.fed.runtime.layout
    self.up += float(np.mean([fed_lib.num_scalars(received[c][0]) for c in ids]))
    self.down += float(np.mean([self.payload_size[layout.group_of(c)[0]] for c in ids]))
    losses = [received[c][2].get("loss", math.nan) for c in ids]
    self.pending_row = {"round": round_, "train_loss": float(np.mean(losses)),
                        "clients_trained": len(received), "clients_failed": len(failures),
                        **extra}
    self.log(f"server: round {round_}: aggregated {len(received)} uploads "
             f"({len(failures)} failed)")
    if not self._is_eval_round(round_):
      self._save()
    return None, {}

  def configure_evaluate(self, server_round, parameters, client_manager):
    round_ = self.node.round
    if self.pending_row is None or not self._is_eval_round(round_):
      return []
    connected = self._connected(client_manager, 0, 0)
    if not connected:
      self._finish_row({})
      return []
    layout = self.node.fed.runtime.layout
    payloads = self._payloads()
    return [(proxy, EvaluateIns(payloads[layout.group_of(c)[0]], {"round": round_}))
            for c, proxy in sorted(connected.items())]

  def aggregate_evaluate(self, server_round, results, failures):
    accuracy = {}
    for proxy, res in results:
      m = res.metrics
      accuracy[int(m["client_id"])] = m["correct"] / max(m["total"], 1)
    self._finish_row(accuracy)
    return None, {}

  def _finish_row(self, accuracy: dict[int, float]) -> None:
    """Writes the evaluation round's metrics row, then checkpoints the round."""
    row = self.pending_row
    self.pending_row = None
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

  def evaluate(self, server_round, parameters):
    return None  # no centralized evaluation: every client evaluates its own model


def start_server(config, workdir: str, *, address: str = "127.0.0.1:8080",
                 min_fit_clients: int = 0, min_available_clients: int = 0,
                 round_timeout: float = 600, startup_timeout: float = 600,
                 fresh_start: bool = False, log: Callable[[str], None] = print) -> dict:
  """Runs (or resumes) the server of a deployment until ``config.num_rounds``.

  Args:
    config: the experiment config (as for ``experiments/main.py``).
    workdir: ``metrics.jsonl``, ``summary.json``, ``config.json``, ``checkpoints/``.
    address: host:port the server listens on.
    min_fit_clients, min_available_clients, startup_timeout: see ``HetStrategy``.
    round_timeout: seconds a round waits for its clients' replies.
    fresh_start: discard a previous run's checkpoints and metrics in ``workdir``.
    log: where progress lines go.

  Returns:
    the summary also written to ``summary.json``.
  """
  fed = fed_lib.prepare_federation(config)  # every config and data error happens here
  if fresh_start:
    loop.clear_outputs(os.path.abspath(workdir))
  node = fed_lib.ServerNode(fed, workdir)
  metrics_lib.write_json(os.path.join(node.workdir, "config.json"), fed.config.to_dict())
  remaining = fed.config.num_rounds - node.round
  strategy = HetStrategy(node, min_fit_clients=min_fit_clients,
                         min_available_clients=min_available_clients,
                         startup_timeout=startup_timeout, log=log)
  if node.round:
    log(f"server: resumed from round {node.round} in {node.workdir}")
  if remaining > 0:
    log(f"server: listening on {address} for {fed.runtime.layout.num_clients} clients, "
        f"{remaining} rounds of {fed.config.algorithm}")
    flwr.server.start_server(server_address=address, strategy=strategy,
                             config=flwr.server.ServerConfig(num_rounds=remaining,
                                                             round_timeout=round_timeout))
  node.close()
  rows = strategy.rows.rows
  summary = {
      "final_mean_test_acc": rows[-1]["mean_test_acc"] if rows else math.nan,
      "best_mean_test_acc": max((r["mean_test_acc"] for r in rows), default=math.nan),
      "per_client_test_acc": {str(k): v for k, v in sorted(strategy.last_accuracy.items())},
      "rounds_completed": node.round,
      "uplink_params": strategy.up, "downlink_params": strategy.down,
      "config": fed.config.to_dict(),
  }
  metrics_lib.write_json(os.path.join(node.workdir, "summary.json"), summary)
  return summary


def start_client(config, client_id: int, workdir: str | None = None, *,
                 address: str = "127.0.0.1:8080", kill_at_round: int = 0,
                 log: Callable[[str], None] = print) -> None:
  """Runs client ``client_id`` of a deployment until the server ends the run.

  The client reads its own partition of ``config``'s data (the one the simulator gives
  it), compiles its local round, then connects (retrying until the server is up).

  Args:
    config: the experiment config (the server's).
    client_id: which client this process is, in [0, config.num_clients).
    workdir: where the client checkpoints its private state (None: nothing on disk, so
      a restarted client starts from its initial state).
    address: the server's host:port.
    kill_at_round: fault injection (see ``FlowerClient``).
    log: where progress lines go.
  """
  if not 0 <= client_id < config.num_clients:
    raise ValueError(f"client_id={client_id} must be in [0, config.num_clients="
                     f"{config.num_clients})")
  fed = fed_lib.prepare_federation(config)
  node = fed_lib.ClientNode(fed, client_id, fed.client_data(client_id), workdir)
  t0 = time.perf_counter()
  node.warmup()
  log(f"client {client_id} ({fed.client_archs[client_id]}): state from round "
      f"{node.state_round}, compiled in {time.perf_counter() - t0:.1f}s; connecting to "
      f"{address}")
  client = FlowerClient(node, log=log, kill_at_round=kill_at_round)
  flwr.client.start_client(server_address=address, client=client.to_client(),
                           insecure=True)
  node.close()
  log(f"client {client_id}: the server ended the run")
