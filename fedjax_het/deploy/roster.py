"""Which SuperNode is which client: admission by registered name and query reply.

The server learns which client a SuperNode is from its ``query`` reply; when the
SuperNode's key was registered with a name (``flwr supernode register --name
client-<k>``, what the loopback launcher does), the claimed id must match that name,
which only the operator sets, so a node cannot pose as another client. With SuperNode
authentication off (``--insecure``) nothing binds a node to an id, and the server says
so. ``exchange`` sends a round's messages and collects their replies within a deadline.
"""
from __future__ import annotations

import re
import time
from typing import Any, Callable, Mapping

from flwr.app import Message
from flwr.app import MessageType
from flwr.app import RecordDict
from flwr.serverapp import Grid

from fedjax_het.deploy.wire import RECORD
from fedjax_het.deploy.wire import record
from fedjax_het.deploy.wire import unanswered

NODE_NAME = "client-{}"  # the name a SuperNode's key is registered under


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
        messages = [Message(RecordDict({RECORD: record(config=self.config_json)}),
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
