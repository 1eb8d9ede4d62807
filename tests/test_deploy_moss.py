"""Moss through the deployment's server (``FlowerServer`` around a ``ServerNode``, over a
fake Flower ``Grid`` that hands every message to the ClientApp in this process) equals
the simulator: the server's public-set path (``Protocol.server_data``), WIRE's
meta-networks, their Adam state and regressors, FILE and the type models after 2 rounds.
"""
import jax
import numpy as np
import pytest
from by_hand import assert_close

from fedjax_het.deploy import federation as fed_lib

flower = pytest.importorskip("fedjax_het.deploy.flower")
from fake_grid import FakeGrid  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from fedjax_het.training import experiment  # noqa: E402
from fedjax_het.training import program  # noqa: E402

pytestmark = pytest.mark.usefixtures("compile_bound")

# tests/test_protocol.py's Moss: WIRE's look-ahead step at 1.0 keeps its meta-gradient
# well above Adam's eps, so two programs' rounding differences stay rounding differences
# Two clients, one per device type; WIRE matches one layer: the cheapest federation
# whose server still runs FILE over two proxies and both WIRE directions.
MOSS = {"num_clients": 2, "num_rounds": 2, "eval_every": 2, "data.public": 16,
        "algo.public_size": 16, "algo.public_batch": 8, "algo.wire_steps": 1,
        "algo.wire_lr": 1.0, "algo.wire_layers": "rep"}


@pytest.fixture
def threefry_identity(monkeypatch):
  """Threefry keys (a ClientNode's draws one key at a time equal the simulator's batched
  ones) and what a ServerApp process knows about itself."""
  for k in ("_run_id", "_node_id", "_task_id"):
    monkeypatch.setattr(TaskIdentity, k, 7)
  previous = jax.config.jax_default_prng_impl
  jax.config.update("jax_default_prng_impl", "threefry2x32")
  yield
  jax.config.update("jax_default_prng_impl", previous)


def test_moss_through_the_deployed_server_equals_the_simulator(tiny_config, tmp_path,
                                                              threefry_identity):
  c = tiny_config("moss", "tiny,tiny2", MOSS)
  nodes = {100 + k: (f"client-{k}", {"client-id": k, "workdir": str(tmp_path / f"c{k}"),
                                     "fault": ""}) for k in range(c.num_clients)}
  settings = flower.ServerSettings(config="unused", workdir=str(tmp_path / "server"),
                                   round_timeout=600, startup_timeout=60)
  node = fed_lib.ServerNode(fed_lib.prepare_federation(c), settings.workdir)
  server = flower.FlowerServer(FakeGrid(nodes), node, settings, log=lambda s: None)
  try:
    server.run()
  finally:
    node.close()
  deployed = node.state.server
  assert int(node.state.round) == 2
  assert [(r["round"], r["clients_trained"], r["clients_failed"]) for r in server.rows.rows
          ] == [(2, 2, 0)]  # evaluated once, after round 2

  exp = experiment.prepare(c)
  state = program.compile_fns(exp).init(jax.random.PRNGKey(c.seed))
  round_fn = jax.jit(exp.algorithm.round)
  for _ in range(2):
    state, metrics = round_fn(state, exp.data)
  simulated = jax.device_get(state.server)
  assert len(simulated["wire"]) == 2 and simulated["wire"][0]["up"]["meta_opt"]
  assert_close(deployed, simulated, rtol=1e-5, atol=1e-6)
  # the server did move: its types are not the initial ones
  first = jax.jit(exp.algorithm.protocol.init_server)(jax.random.PRNGKey(c.seed))
  assert not np.allclose(jax.tree.leaves(first["types"])[0], jax.tree.leaves(deployed["types"])[0])
  row = server.rows.rows[-1]
  if "file_weights" in row:
    np.testing.assert_allclose(row["file_weights"], metrics["file_weights"], rtol=1e-5)
