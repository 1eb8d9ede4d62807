r"""Any fedjax-het algorithm as a Flower App on Flower's Deployment Runtime.

This module is the App itself: ``server_app`` (a ``flwr.serverapp.ServerApp``) runs
``server.run_server`` around a ``federation.ServerNode``, ``client_app`` (a
``flwr.clientapp.ClientApp``) runs the handlers of ``client.py`` around a
``federation.ClientNode``; both only call the algorithm's ``Protocol``, the pure
functions the simulator's round is built from, so no algorithm is written twice.
Flower runs them in its own processes: ``flower-superlink`` starts the ServerApp (one
process for the whole run) when ``flwr run`` submits the app
(``fedjax_het/deploy/flower_app``), every ``flower-supernode`` starts a ClientApp
process for each message it receives.

The pieces, one job each:

- ``settings``: the run config (``ServerSettings``), each SuperNode's node config
  (``NodeSettings``), the experiment config and its overrides (``load_config``);
- ``wire``: the message records and the defensive decoding of every reply
  (``read_upload``: ``.npy`` headers checked before any allocation, any exception one
  client's rejection);
- ``roster``: which SuperNode is which client (``admission``, ``Roster``) and the
  exchange of a round's messages (``exchange``);
- ``server``: the rounds (``FlowerServer``, ``run_server``);
- ``robust``: the default bounds on uploads, robust aggregation and the bench;
- ``client``: the ClientApp's handlers and fault drills.

What crosses the wire (message types of ``flwr.app.MessageType``):

- ``query`` (once per SuperNode): the config down; the node's client id up.
- ``train`` (round r): the payload ``downlink(server, g)`` of the client's group, the
  round, a fresh nonce, the client's PRNG key (the simulator's) and its id down; the
  upload, the round and nonce echoed, the client's train example count and its
  training metrics up.
- ``evaluate`` (evaluation rounds): the payload down; ``(correct, total)`` of the
  client's personalized model on its test split up.

docs/deploy.md has the commands and the trust model; ``fedjax_het/deploy/loopback.py``
starts a loopback federation. The names below stay importable from here.
"""
from __future__ import annotations

import os

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # no phoning home from a lab cluster

from flwr.app import Context  # noqa: E402
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp import Grid  # noqa: E402
from flwr.serverapp import ServerApp  # noqa: E402

from fedjax_het.deploy import client as client_lib  # noqa: E402
from fedjax_het.deploy.client import client_workdir  # noqa: E402,F401
from fedjax_het.deploy.client import open_client  # noqa: E402,F401
from fedjax_het.deploy.roster import NODE_NAME  # noqa: E402,F401
from fedjax_het.deploy.roster import Roster  # noqa: E402,F401
from fedjax_het.deploy.roster import admission  # noqa: E402,F401
from fedjax_het.deploy.roster import exchange  # noqa: E402,F401
from fedjax_het.deploy.server import FlowerServer  # noqa: E402,F401
from fedjax_het.deploy.server import config_json  # noqa: E402,F401
from fedjax_het.deploy.server import run_server  # noqa: E402
from fedjax_het.deploy.settings import FAULTS  # noqa: E402,F401
from fedjax_het.deploy.settings import NodeSettings  # noqa: E402,F401
from fedjax_het.deploy.settings import ServerSettings  # noqa: E402
from fedjax_het.deploy.settings import load_config  # noqa: E402,F401
from fedjax_het.deploy.settings import overrides_of  # noqa: E402,F401
from fedjax_het.deploy.settings import parse_faults  # noqa: E402,F401
from fedjax_het.deploy.settings import parse_overrides  # noqa: E402,F401
from fedjax_het.deploy.settings import use_compilation_cache  # noqa: E402,F401
from fedjax_het.deploy.wire import AUX  # noqa: E402,F401
from fedjax_het.deploy.wire import PAYLOAD  # noqa: E402,F401
from fedjax_het.deploy.wire import RECORD  # noqa: E402,F401
from fedjax_het.deploy.wire import UPLOAD  # noqa: E402,F401
from fedjax_het.deploy.wire import read_evaluation  # noqa: E402,F401
from fedjax_het.deploy.wire import read_upload  # noqa: E402,F401
from fedjax_het.deploy.wire import unanswered  # noqa: E402,F401

server_app = ServerApp()


@server_app.main()
def _server_main(grid: Grid, context: Context) -> None:
  run_server(grid, ServerSettings.from_run_config(context.run_config))


client_app = ClientApp()
client_app.query()(client_lib.query)
client_app.train()(client_lib.train)
client_app.evaluate()(client_lib.evaluate)
