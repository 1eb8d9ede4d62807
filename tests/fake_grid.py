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
