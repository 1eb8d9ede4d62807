r"""One client of a Flower deployment (see docs/deploy.md).

  python experiments/flower_client.py --config=experiments/fedmrl.py:smoke \
      --client_id=0 --workdir=/tmp/flower/client0 --address=127.0.0.1:8080 \
      --config.num_clients=3

The client reads its own partition of the config's data (the simulator's), keeps its
private model in ``--workdir`` and retries until the server is up.
"""
from absl import flags
from ml_collections import config_flags

from fedjax_het import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (the "
                                          "server's).", lock_config=True)
_CLIENT_ID = flags.DEFINE_integer("client_id", None, "This client's id.")
_WORKDIR = flags.DEFINE_string("workdir", None, "Where this client checkpoints its state "
                               "(unset: nothing kept).")
_ADDRESS = flags.DEFINE_string("address", "127.0.0.1:8080", "The server's host:port.")
_KILL = flags.DEFINE_integer("kill_at_round", 0, "Fault drill: SIGKILL this process when "
                             "asked to train this round (0: never).")
flags.mark_flags_as_required(["config", "client_id"])


def main(argv):
  del argv
  from fedjax_het.deploy import flower  # after flag parsing: Flower is an optional extra
  try:
    flower.start_client(_CONFIG.value, _CLIENT_ID.value, _WORKDIR.value,
                        address=_ADDRESS.value, kill_at_round=_KILL.value,
                        log=lambda s: print(s, flush=True))
  except (ValueError, FileNotFoundError) as err:
    cli.fail(err)


if __name__ == "__main__":
  cli.run(main)
