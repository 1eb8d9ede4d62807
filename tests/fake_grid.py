"""Flower's ``Grid`` in one process, for the tests that run the deployment's ServerApp
(``FlowerServer``) without Flower's processes (tests/test_flower_app.py,
tests/test_deploy_moss.py). Import it after ``pytest.importorskip`` of
``fedjax_het.deploy.flower``: it needs Flower.
"""
import types

from flwr.app import Error
from flwr.app import Message
from flwr.app import RecordDict

from fedjax_het.deploy import flower


class FakeGrid:
  """Each message goes to ``flower.client_app`` with its SuperNode's node config (an
  exception becomes an error reply, as Flower makes it); a node listed in ``silent``
  never answers a train message (a hung client).

  Args:
    nodes: {node id: (name, node config)}.
    silent: node ids that never answer a train message.
  """

  def __init__(self, nodes, silent=()):
    self.nodes, self.silent = nodes, set(silent)
    self.replies, self.sent, self.run = {}, [], types.SimpleNamespace(run_id=7)

  def get_nodes(self):
    return [types.SimpleNamespace(node_id=n, name=name)
            for n, (name, _) in self.nodes.items()]

  def push_messages(self, messages):
    ids = []
    for m in messages:
      mid = f"m{len(self.sent)}"
      m.metadata.__dict__["_message_id"] = mid
      self.sent.append(m)
      ids.append(mid)
      n = m.metadata.dst_node_id
      if n in self.silent and m.metadata.message_type == "train":
        continue
      context = flower.Context(run_id=7, node_id=n, node_config=self.nodes[n][1],
                               state=RecordDict(), run_config={})
      try:
        self.replies[mid] = flower.client_app(message=m, context=context)
      except Exception as err:  # noqa: BLE001 - what flwr-clientapp does
        self.replies[mid] = Message(Error(code=0, reason=str(err)), reply_to=m)
    return ids

  def pull_messages(self, ids):
    return [self.replies.pop(i) for i in list(ids) if i in self.replies]


def run_deployed(config, root, *, faults=None, silent=(), names=None, workdir="server",
                 **settings):
  """Runs the ServerApp (``FlowerServer``) of ``config`` over a ``FakeGrid`` whose
  SuperNodes keep their state under ``root``.

  Args:
    faults: {client: node config ``fault``}.
    silent: clients that never answer a train message.
    names: {client: registered name} (default ``client-<k>``).
    workdir: the server's folder under ``root`` (clients' are ``<workdir>-client<k>``).
    settings: ``ServerSettings`` fields (short timeouts by default).

  Returns:
    (server, grid, log lines).
  """
  from fedjax_het.deploy import federation as fed_lib
  nodes = {100 + k: ((names or {}).get(k, f"client-{k}"),
                     {"client-id": k, "workdir": str(root / f"{workdir}-client{k}"),
                      "fault": (faults or {}).get(k, "")})
           for k in range(config.num_clients)}
  grid = FakeGrid(nodes, silent=[100 + k for k in silent])
  settings = flower.ServerSettings(**dict(
      dict(config="unused", workdir=str(root / workdir), round_timeout=0.5,
           startup_timeout=0.5), **settings))
  node = fed_lib.ServerNode(fed_lib.prepare_federation(config), settings.workdir)
  logs = list(f"server: {line}" for line in node.repairs)
  server = flower.FlowerServer(grid, node, settings, log=logs.append)
  try:
    server.run()
  finally:
    node.close()
  return server, grid, logs
