r"""The server of a Flower deployment (see docs/deploy.md).

  python experiments/flower_server.py --config=experiments/fedmrl.py:smoke \
      --workdir=/tmp/flower/server --address=127.0.0.1:8080 --config.num_clients=3
  # then one client process per client id (experiments/flower_client.py)

Rerunning the same command resumes from the newest checkpoint in ``--workdir``.
"""
from absl import flags
from ml_collections import config_flags

from fedjax_het import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Server output directory (resumed).")
_ADDRESS = flags.DEFINE_string("address", "127.0.0.1:8080", "host:port to listen on.")
_MIN_FIT = flags.DEFINE_integer("min_fit_clients", 0,
                                "Uploads needed to aggregate a round (0: every drawn "
                                "client).")
_MIN_AVAILABLE = flags.DEFINE_integer("min_available_clients", 0,
                                      "Connected clients needed to start a round after "
                                      "the first (0: min_fit_clients).")
_ROUND_TIMEOUT = flags.DEFINE_float("round_timeout", 600, "Seconds a round waits for "
                                    "its clients.")
_STARTUP_TIMEOUT = flags.DEFINE_float("startup_timeout", 600, "Seconds to wait for all "
                                      "clients before round 1.")
_FRESH = flags.DEFINE_bool("fresh_start", False, "Discard a previous run in --workdir.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  from fedjax_het.deploy import flower  # after flag parsing: Flower is an optional extra
  for name, value in (("min_fit_clients", _MIN_FIT.value),
                      ("min_available_clients", _MIN_AVAILABLE.value)):
    if value < 0:
      cli.fail(f"--{name}={value} must be >= 0")
  try:
    summary = flower.start_server(
        _CONFIG.value, _WORKDIR.value, address=_ADDRESS.value,
        min_fit_clients=_MIN_FIT.value, min_available_clients=_MIN_AVAILABLE.value,
        round_timeout=_ROUND_TIMEOUT.value, startup_timeout=_STARTUP_TIMEOUT.value,
        fresh_start=_FRESH.value, log=lambda s: print(s, flush=True))
  except (ValueError, FileNotFoundError) as err:
    cli.fail(err)
  print(f"final mean test acc {summary['final_mean_test_acc']:.4f} after "
        f"{summary['rounds_completed']} rounds; summary in {_WORKDIR.value}/summary.json",
        flush=True)


if __name__ == "__main__":
  cli.run(main)
