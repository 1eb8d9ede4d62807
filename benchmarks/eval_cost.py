r"""What evaluating every round costs: seconds per round with both evaluations, one, none.

  python benchmarks/eval_cost.py --config=experiments/fedmrl.py:cpu
  python benchmarks/eval_cost.py --config=experiments/fedmrl.py --set=num_clients=100 \
      --set=participation=0.1

Each way is the run's own compiled dispatch (``fedjax_het.training.estimate``), timed
after its compilation: both evaluations every round (the papers' protocol), only the
sampled clients after training (protocol (b)), and none. Prints one line per way and the
share of a round the evaluations take.
"""
import argparse
import ast

from fedjax_het import cli as cli_lib
from fedjax_het import config as config_lib
from fedjax_het import config_files
from fedjax_het import validation
from fedjax_het.training import estimate


def parse_value(text: str):
  """``'0.1'`` -> 0.1, ``'True'`` -> True, anything else stays a string."""
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


def apply_sets(config, items) -> None:
  """Applies ``--set KEY=VALUE`` items to ``config`` (ValueError on an unknown key)."""
  for item in items:
    key, _, value = item.partition("=")
    cli_lib.check_key(config, key)
    config_lib.override(config, {key: parse_value(value)})


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--config", required=True, help="experiments/<algorithm>.py[:variant]")
  p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                 help="a dotted config override (repeatable)")
  args = p.parse_args(argv)
  cli_lib.quiet([""])
  try:
    config = config_files.load_config_file(args.config)
    apply_sets(config, args.set)
    validation.validate(config)
    cost = estimate.evaluation_cost(config)
  except (ValueError, FileNotFoundError) as err:
    cli_lib.fail(err)
  print(f"{config.algorithm} N={config.num_clients} C={config.participation:.0%} "
        f"E={config.local_epochs} B={config.batch_size}: s/round with both evaluations "
        f"{cost['both_s']:.3f}, sampled clients only {cost['sampled_only_s']:.3f}, none "
        f"{cost['none_s']:.3f}; evaluation share of a round: both "
        f"{100 * cost['share_both']:.1f} %, sampled only {100 * cost['share_sampled']:.1f} %")


if __name__ == "__main__":
  main()
