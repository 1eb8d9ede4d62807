r"""Paired differences of a sweep's groups as Markdown: the table of the differences at the
end of the runs, then where each is going (``paired`` pairs the runs).

  python experiments/paired.py --sweep_dir=results/bf16_fedmrl_cpu --baseline=float32
  python experiments/paired.py --sweep_dir=results/paper_cpu --baseline=standalone \
      [--last_k=5] [--per_seed] [--per_round]

``cli`` is the command line of ``experiments/paired.py``; ``paired``'s docstring says what
is compared and how.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from fedjax_het.sweeps import paired
from fedjax_het.sweeps.rundirs import load_runs
from fedjax_het.sweeps.stats import mean_se
from fedjax_het.sweeps.stats import mean_se_text


def _cell(diffs: np.ndarray) -> str:
  return mean_se_text(*mean_se(diffs))


def markdown(comparisons: Sequence[paired.Comparison], *, last_k: int,
             per_seed: bool = False) -> str:
  """The table of mean differences (± standard error) and, if asked, per-seed values."""
  if not comparisons:
    return "No pair of groups shares a finished seed.\n"
  titles = [t for t, _, _ in paired.METRICS if any(t in c.diffs for c in comparisons)]
  shown = [t.replace("last k", f"last {last_k}") for t in titles]
  first = comparisons[0]
  minus = (f"the same method in setting {first.base_setting!r}"
           if first.base_method == first.method
           else f"{first.base_method} in the same setting")
  lines = [
      f"Each row: the method in the setting minus {minus}, in accuracy points, mean ± "
      "standard error over the seeds both finished (n); `last "
      f"{last_k}`: the mean of the evaluations in the last {last_k} rounds.", "",
      "| method | setting | n | " + " | ".join(shown) + " |",
      "|---|---|---:|" + "---:|" * len(titles)]
  for c in comparisons:
    cells = [_cell(c.diffs[t]) if t in c.diffs else "–" for t in titles]
    lines.append(f"| {c.method} | {c.setting} | {len(c.seeds)} | " + " | ".join(cells)
                 + " |")
  if per_seed:
    for c in comparisons:
      lines += ["", f"{c.method} / {c.setting} minus {c.base_method} / "
                f"{c.base_setting}, per seed ({', '.join(map(str, c.seeds))}):", ""]
      for t, name in zip(titles, shown):
        if t in c.diffs:
          lines.append(f"- {name}: " + " / ".join(f"{d:+.2f}" for d in c.diffs[t])
                       + f" (baseline {' / '.join(f'{b:.2f}' for b in c.base[t])})")
  return "\n".join(lines) + "\n"


def trend_markdown(comparisons: Sequence[paired.RoundComparison], *,
                   per_round: bool = False) -> str:
  """Where each difference is going: its value at the last round both evaluated, its
  mean over the last third of the run and its slope there (``trend``); with
  ``per_round`` also the difference at every evaluated round."""
  if not comparisons:
    return ""
  protocol = {"mean_test_acc": "(a)", "sampled_test_acc": "(b)"}
  lines = ["Where each difference is going: at the last round every seed evaluated, its "
           "mean over the last third of the run (which one noisy evaluation cannot move) "
           "and its slope there (each seed's mean and least-squares slope, mean ± "
           "standard error over the seeds, points and points per 10 rounds; `rising` or "
           "`falling` beyond two standard errors, else `flat`).", "",
           "| method | setting | protocol | n | last round | difference | last third "
           "| slope / 10 rounds | going |", "|---|---|---|---:|---:|---:|---:|---:|---|"]
  for c in comparisons:
    try:
      t = c.trend()
    except ValueError:  # too few evaluated rounds in the last third
      t = None
    level, slope = ("–", "–") if t is None else (mean_se_text(t.level, t.level_se),
                                                 mean_se_text(t.slope, t.se))
    lines.append(f"| {c.method} | {c.setting} | {protocol.get(c.key, c.key)} | "
                 f"{len(c.seeds)} | {int(c.rounds[-1])} | {_cell(c.diffs[:, -1])} | "
                 f"{level} | {slope} | {'–' if t is None else t.direction} |")
  if per_round:
    for c in comparisons:
      lines += ["", f"{c.method} / {c.setting} minus {c.base_method} / {c.base_setting}, "
                f"{protocol.get(c.key, c.key)}, by round (mean ± s.e. over seeds "
                f"{', '.join(map(str, c.seeds))}):", "", "| round | difference |",
                "|---:|---:|"]
      lines += [f"| {int(r)} | {_cell(c.diffs[:, i])} |" for i, r in enumerate(c.rounds)]
  return "\n".join(lines) + "\n"


def report(sweep_dir: str, baseline: str, *, last_k: int = 5,
                  per_seed: bool = False, per_round: bool = False) -> str:
  """The Markdown report of ``sweep_dir``'s groups against ``baseline``: the table of
  differences, then where each is going (``trend_markdown``)."""
  if last_k < 1:
    raise ValueError(f"--last_k must be >= 1, got {last_k}")
  runs = load_runs(sweep_dir)
  if not runs:
    raise FileNotFoundError(f"no run directories with metrics under {sweep_dir!r}")
  table = markdown(paired.compare(paired.group_values(runs, last_k), baseline), last_k=last_k,
                   per_seed=per_seed)
  rounds = [c for key in ("mean_test_acc", "sampled_test_acc")
            for c in paired.compare_rounds(runs, baseline, key)]
  trends = trend_markdown(rounds, per_round=per_round)
  return table + ("\n" + trends if trends else "")


def cli() -> None:
  """The command line: ``--sweep_dir``, ``--baseline``, ``--last_k``, ``--per_seed``,
  ``--per_round``."""
  from absl import flags  # noqa: PLC0415

  from fedjax_het import cli as cli_lib  # noqa: PLC0415

  sweep_dir = flags.DEFINE_string("sweep_dir", None, "A sweep directory (or of runs).")
  baseline = flags.DEFINE_string("baseline", None, "A setting or a method to subtract.")
  last_k = flags.DEFINE_integer("last_k", 5, "Rounds averaged by the `last k` columns.")
  per_seed = flags.DEFINE_bool("per_seed", False, "Also list every seed's difference.")
  per_round = flags.DEFINE_bool("per_round", False,
                                "Also list the difference at every evaluated round.")
  flags.mark_flags_as_required(["sweep_dir", "baseline"])

  def main(argv):
    del argv
    try:
      print(report(sweep_dir.value, baseline.value, last_k=last_k.value,
                          per_seed=per_seed.value, per_round=per_round.value),
            end="", flush=True)
    except (ValueError, FileNotFoundError) as err:
      cli_lib.fail(err)

  cli_lib.run(main, flag=None)


if __name__ == "__main__":
  cli()
