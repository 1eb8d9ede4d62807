r"""Runs one federated experiment.

  python experiments/main.py --config=experiments/fedavg.py --workdir=/tmp/fedavg
  python experiments/main.py --config=experiments/fedmrl.py:smoke --workdir=/tmp/s \
      --config.num_rounds=5

Rerunning the same command resumes from the newest checkpoint in ``--workdir``.

One run over several processes (the client axis sharded over all their devices; see
docs/distributed.md): start the same command once per process, adding

  --coordinator_address=HOST:PORT --num_processes=N --process_id=I   # explicit, or
  --distributed                                # SLURM / Open MPI: JAX detects all three
"""
from absl import flags
from ml_collections import config_flags

from fedjax_het import cli
from fedjax_het import distributed
from fedjax_het.training import checkpoint
from fedjax_het.training import compile_cache
from fedjax_het.training import loop

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Experiment config file, path[:variant] (experiments/fedmrl.py:cpu)",
    lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (a run in it resumes).")
_FRESH = flags.DEFINE_bool("fresh_start", False,
                           "Discard the checkpoints and metrics already in --workdir.")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "Multi-process run: HOST:PORT of process 0's coordinator.")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None,
                                      "Multi-process run: number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None,
                                   "Multi-process run: this process, in [0, num_processes).")
_DISTRIBUTED = flags.DEFINE_bool(
    "distributed", False, "Multi-process run on a cluster JAX detects (SLURM, Open MPI): "
    "jax.distributed.initialize() with no arguments.")
_CACHE = flags.DEFINE_string(
    "compile_cache", compile_cache.DEFAULT, "Persistent compilation cache: a directory, "
    "'default' ($FEDJAX_HET_CACHE or ~/.cache/fedjax_het/xla) or 'off'.")
flags.mark_flags_as_required(["config", "workdir"])
fail = cli.fail


def main(argv):
  del argv
  try:  # before any other JAX call: the flags, then joining the run
    distributed.initialize(distributed.validate_flags(
        _COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value,
        auto=_DISTRIBUTED.value))
  except ValueError as err:
    fail(err)
  compile_cache.enable(_CACHE.value)
  try:
    summary = loop.run(_CONFIG.value, _WORKDIR.value, fresh_start=_FRESH.value,
                       log=lambda s: print(s, flush=True))
  except (ValueError, FileNotFoundError, FloatingPointError, checkpoint.DiskFull) as err:
    fail(err)
  if distributed.is_primary():
    sampled = ("" if "best_sampled_test_acc" not in summary else
               f"; sampled clients after training {summary['final_sampled_test_acc']:.4f} "
               f"(best {summary['best_sampled_test_acc']:.4f})")
    print(f"final mean test acc {summary['final_mean_test_acc']:.4f} "
          f"(best {summary['best_mean_test_acc']:.4f}){sampled} after "
          f"{summary['rounds_completed']} rounds; summary in {_WORKDIR.value}/summary.json")


if __name__ == "__main__":
  cli.run(main)
