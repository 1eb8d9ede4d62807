r"""Runs one federated experiment.

  python experiments/main.py --config=experiments/fedavg.py --workdir=/tmp/fedavg
  python experiments/main.py --config=experiments/fedmrl.py:smoke --workdir=/tmp/s \
      --config.num_rounds=5

Rerunning the same command resumes from the newest checkpoint in ``--workdir``.
"""
import sys

from absl import app, flags, logging
from ml_collections import config_flags

from fedjax_het.training import loop

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file.",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Output directory (resumed if it exists).")
_FRESH = flags.DEFINE_bool("fresh_start", False,
                           "Discard the checkpoints and metrics already in --workdir.")
flags.mark_flags_as_required(["config", "workdir"])


def main(argv):
  del argv
  try:
    summary = loop.run(_CONFIG.value, _WORKDIR.value, fresh_start=_FRESH.value,
                       log=lambda s: print(s, flush=True))
  except (ValueError, FileNotFoundError, FloatingPointError) as err:
    logging.error("%s", err)
    print(f"error: {err}", file=sys.stderr, flush=True)
    sys.exit(2)
  print(f"final mean test acc {summary['final_mean_test_acc']:.4f} "
        f"(best {summary['best_mean_test_acc']:.4f}) after "
        f"{summary['rounds_completed']} rounds; summary in {_WORKDIR.value}/summary.json")


if __name__ == "__main__":
  app.run(main)
