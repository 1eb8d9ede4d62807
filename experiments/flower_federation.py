r"""A Flower federation on this machine: a SuperLink, one SuperNode per client, one run.

  python experiments/flower_federation.py --config=experiments/fedmrl.py:smoke \
      --config.num_clients=3 --workdir=$HOME/flower

Starts ``flower-superlink`` on 127.0.0.1 (TLS with a throwaway CA made under
``<workdir>/tls``: for testing only; SuperNode authentication on), registers one key
per client under the name ``client-<k>``, starts one ``flower-supernode`` per client
(node config: its client id, workdir and data), submits the Flower App with ``flwr run``
(run config: this config file and its ``--config.*`` overrides), prints the server's
lines until the run ends, then stops every process. Exit status 0 iff the run finished
all its rounds. Rerunning the same command resumes from the newest checkpoint in
``<workdir>/server`` (docs/deploy.md; ``fedjax_het/deploy/loopback.py`` is the library).
"""
import os
import shlex
import signal
import sys

from absl import flags
from ml_collections import config_flags

from fedjax_het import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Root of everything the federation "
                               "writes (resumed when it exists).")
_PORT = flags.DEFINE_integer("port", 9093, "The SuperLink's port on 127.0.0.1.")
_INSECURE = flags.DEFINE_bool("insecure", False, "Plaintext, unauthenticated SuperNodes: "
                              "for debugging on a trusted machine only.")
_ROUND_TIMEOUT = flags.DEFINE_float("round_timeout", 600, "Seconds a round waits for "
                                    "its replies.")
_STARTUP_TIMEOUT = flags.DEFINE_float("startup_timeout", 600, "Seconds to wait for all "
                                      "clients before round 1.")
_MIN_FIT = flags.DEFINE_integer("min_fit_clients", 0, "Uploads needed to aggregate a "
                                "round (0: half the clients sent the round's message, "
                                "rounded up; -1: all of them).")
_MIN_AVAILABLE = flags.DEFINE_integer("min_available_clients", 0, "Connected clients "
                                      "needed to start a round after the first (0: "
                                      "min_fit_clients).")
_STRAGGLER = flags.DEFINE_float("straggler_timeout", 0, "Once min_fit_clients uploads "
                                 "are in, seconds a round still waits for the others "
                                 "(0: until round_timeout).")
_NORM = flags.DEFINE_float("upload_norm_bound", 10.0, "Bound every upload's update (its "
                           "coordinates and L2 norm; class tables: counts and rows) by "
                           "this times the round's lower-median reference (0: no bound).")
_NORM_ACTION = flags.DEFINE_enum("upload_norm_action", "clip", ["reject", "clip"],
                                 "What happens to an upload over the norm bound.")
_AGGREGATION = flags.DEFINE_enum("aggregation", "mean", ["mean", "median", "trimmed-mean"],
                                 "The server's rule, for the algorithms that average "
                                 "parameters (fedavg, fedmrl, fedmoe, lg_fedavg, fml, "
                                 "fedapen).")
_TRIM = flags.DEFINE_float("trim_fraction", 0.1, "Fraction cut at each end by "
                           "trimmed-mean.")
_BENCH_AFTER = flags.DEFINE_integer("bench_after", 3, "Rejected rounds running after which "
                                    "a client is not drawn for --bench_rounds rounds (0: "
                                    "never).")
_BENCH_ROUNDS = flags.DEFINE_integer("bench_rounds", 3, "Rounds a benched client sits out.")
_FRESH = flags.DEFINE_bool("fresh_start", False, "Discard a previous run's checkpoints "
                           "and metrics in <workdir>/server.")
_FAULTS = flags.DEFINE_multi_string("fault", [], "Fault drill 'client:kind@round' (kinds: "
                                    "kill, hang, impersonate; malformed uploads: nan, "
                                    "oversize, shape, torch, zip, overlong, huge, "
                                    "truncated, dtype, scaled).")
_TIMEOUT = flags.DEFINE_float("timeout", 24 * 3600, "Seconds to wait for the run.")
flags.mark_flags_as_required(["config", "workdir"])
PATH_KEYS = ("data.path", "partition.path")  # = fedjax_het.deploy.settings.PATH_KEYS


def config_spec(argv) -> str:
  """The ``--config`` file spec of ``argv`` with its path made absolute."""
  spec, _ = cli.overrides(argv)
  path, sep, variant = spec.partition(":")
  return os.path.abspath(path) + sep + variant


def absolute_paths(config, environ=os.environ) -> None:
  """Makes ``FEDJAX_HET_DATA``, ``FEDJAX_HET_DATA_CACHE`` and the config's file paths
  absolute (against the working directory): the SuperLink, the SuperNodes and their
  apps run in ``--workdir``, not here."""
  for name in ("FEDJAX_HET_DATA", "FEDJAX_HET_DATA_CACHE"):
    if environ.get(name):
      environ[name] = os.path.abspath(environ[name])
  with config.unlocked():
    for key in PATH_KEYS:
      section, leaf = key.split(".")
      value = config[section].get(leaf, "")
      if value and not os.path.isabs(value):
        config[section][leaf] = os.path.abspath(value)


def main(argv):
  del argv
  from fedjax_het.deploy import federation  # Flower: an optional extra
  from fedjax_het.deploy import flower  # Flower: an optional extra
  from fedjax_het.deploy import loopback  # Flower: an optional extra
  config = _CONFIG.value
  absolute_paths(config)
  faults = {}
  try:
    for item in _FAULTS.value:
      client, _, fault = item.partition(":")
      if not client.isdigit() or int(client) >= config.num_clients:
        raise ValueError(f"--fault={item}: not client:kind@round with a client id in "
                         f"[0, {config.num_clients})")
      flower.parse_faults(fault)
      faults[int(client)] = fault
    federation.prepare_federation(config)  # every config and data error before starting
    from fedjax_het.deploy import robust  # Flower: an optional extra
    robust.check_rule(_AGGREGATION.value, config.algorithm)
  except (ValueError, FileNotFoundError) as err:
    cli.fail(err)
  workdir = os.path.abspath(_WORKDIR.value)
  paths = [f"{k}={config[k.split('.')[0]][k.split('.')[1]]}" for k in PATH_KEYS
           if config[k.split(".")[0]].get(k.split(".")[1], "")]  # absolute by now
  overrides = " ".join([flower.overrides_of(sys.argv), *map(shlex.quote, paths)]).strip()
  run_config = {"config": config_spec(sys.argv), "overrides": overrides,
                "workdir": os.path.join(workdir, "server"),
                "round-timeout": _ROUND_TIMEOUT.value,
                "startup-timeout": _STARTUP_TIMEOUT.value,
                "min-fit-clients": _MIN_FIT.value,
                "min-available-clients": _MIN_AVAILABLE.value,
                "straggler-timeout": _STRAGGLER.value,
                "fresh-start": _FRESH.value,
                "upload-norm-bound": _NORM.value,
                "upload-norm-action": _NORM_ACTION.value,
                "aggregation": _AGGREGATION.value, "trim-fraction": _TRIM.value,
                "bench-after": _BENCH_AFTER.value, "bench-rounds": _BENCH_ROUNDS.value}
  log = lambda s: print(s, flush=True)
  # SIGTERM (Ctrl-C too) unwinds through Loopback's exit, which stops every process
  signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
  try:
    fed = loopback.Loopback(workdir, port=_PORT.value, insecure=_INSECURE.value, log=log)
  except OSError as err:  # a folder another user could control (private.InsecurePath)
    cli.fail(err)
  with fed:
    fed.start_superlink()
    fed.start_clients(range(config.num_clients), faults=faults)
    log(f"federation: SuperLink on 127.0.0.1:{_PORT.value} "
        f"({'INSECURE' if _INSECURE.value else 'TLS, SuperNode authentication'}), "
        f"{config.num_clients} SuperNodes; logs in {fed.path('logs')}")
    run_id = fed.submit(run_config)
    log(f"federation: submitted run {run_id} (flwr run {loopback.APP_DIR} "
        f"{loopback.CONNECTION})")
    status = fed.wait(run_id, _TIMEOUT.value,
                      follow=os.path.join(run_config["workdir"], "server.log"))
    failure = fed.failure(run_id) if status != "finished:completed" else None
    if failure:
      log(f"federation: the run failed: {failure} (whole log: "
          f"{fed.path('logs', f'run-{run_id}.log')})")
    log(f"federation: run {run_id} {status}; stopping the SuperNodes and the SuperLink")
  if status != "finished:completed":
    sys.exit(1)


if __name__ == "__main__":
  cli.run(main)
