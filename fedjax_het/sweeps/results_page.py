r"""Generates the results page (``docs/results.md``) from a sweep and its figures.

  python experiments/results_page.py --sweep_dir=runs/paper_table \
      --plots_dir=runs/paper_table/plots --out=docs/results.md

Everything on the page is read from the sweep's ``sweep.json`` and ``results.csv`` and
the figures' ``plots.json`` (written by ``experiments/sweep.py`` and
``experiments/plots.py``): the exact commands, the environment, the tables (rows methods,
columns settings, mean ± std over seeds) and the figures (linked relative to the page).
Nothing is typed by hand; rerun the commands to refresh it.
"""
from __future__ import annotations

import math
import os
import shlex
import sys
from typing import Sequence

from fedjax_het import config_files
from fedjax_het.sweeps import paired as paired_lib
from fedjax_het.sweeps import paired_report
from fedjax_het.sweeps import tables
from fedjax_het.sweeps.rundirs import load_runs
from fedjax_het.sweeps.rundirs import read_json
from fedjax_het.sweeps.stats import mean_se

KIND_TITLES = {"accuracy": "Mean test accuracy vs rounds",
               "client_diff": "Per-client accuracy difference",
               "target": "Cost to reach a target accuracy",
               "gates": "FedMoE gate weights",
               "paired_rounds": "Paired difference by round",
               "paired_dots": "Paired difference at the final round"}


def figure_section(figures: Sequence[dict], plots_dir: str, page_dir: str,
                   settings: Sequence[str], heading: str = "##") -> list[str]:
  """Markdown lines: per setting (in table order), each figure with its caption."""
  lines = []
  order = list(settings) + [s for s in dict.fromkeys(f["setting"] for f in figures)
                            if s not in settings]
  for setting in order:
    mine = [f for f in figures if f["setting"] == setting]
    if not mine:
      continue
    lines += [f"{heading} Figures: {setting or 'all runs'}", ""]
    for f in mine:
      rel = os.path.relpath(os.path.join(plots_dir, f["path"]), page_dir)
      title = KIND_TITLES.get(f["kind"], f["kind"])
      lines += [f"**{title}.** {f['caption']}", "", f"![{title}]({rel})", ""]
  return lines


def answer_lines(comparisons: Sequence[paired_lib.Comparison], rows: Sequence[dict],
                 paper: dict | None, metric: str = "best (a)") -> list[str]:
  """The page's opening sentences, from its numbers: which methods differ from the
  paired baseline beyond two standard errors, and how far the table's cells are from
  the papers' (``paper``: ``{'cell': what the numbers are, 'values': {method: %}}``)."""
  lines = []
  if comparisons:
    base = comparisons[0].base_method
    groups = {"above": [], "below": [], "within": []}
    for c in comparisons:
      if metric not in c.diffs:
        continue
      mean, se = mean_se(c.diffs[metric])
      key = ("within" if math.isnan(se) or abs(mean) <= 2 * se
             else "above" if mean > 0 else "below")
      groups[key].append(f"{c.method} ({mean:+.2f} ± {se:.2f})" if key != "within"
                         else c.method)
    said = [f"{', '.join(v)} {'is' if len(v) == 1 else 'are'} {k} {base}"
            for k, v in groups.items() if v and k != "within"]
    lines.append(f"Against {base} at the same seeds ({metric}, points, mean ± standard "
                 "error): " + ("; ".join(said) if said else "no method differs")
                 + " beyond two standard errors" + (
                     f"; {', '.join(groups['within'])} within them." if groups["within"]
                     else "."))
  if paper:
    stats = tables.cell_stats(rows, "best_mean_test_acc")
    gaps = []
    for method, value in paper["values"].items():
      cells = [m for (a, _), (m, _, _) in stats.items() if a == method]
      if cells:
        gaps.append((method, 100 * cells[0] - value))
    if gaps:
      lines.append(
          f"Against {paper['cell']} (best round): ours minus the paper's, "
          + ", ".join(f"{m} {g:+.2f}" for m, g in gaps) + " points.")
  return lines


def render_page(sweep_info: dict, rows: Sequence[dict], plots_info: dict | None, *,
                sweep_dir: str, plots_dir: str, page_path: str,
                page_command: str | None, about: str = "", paired: str = "",
                answers: Sequence[str] = ()) -> str:
  """The page's Markdown text.

  Args:
    sweep_info: ``sweep.json`` (command, sweep config, environment, runs).
    rows: ``results.csv`` rows.
    sweep_dir: the sweep directory (named on the page).
    plots_info: ``plots.json``, or None when no figures were made.
    plots_dir: where ``plots.json``'s figure paths are relative to.
    page_path: where the page will be written (figure links are relative to it).
    page_command: the command that generated the page.
    about: the sweep file's docstring (what the sweep is, and is not), or "".
    paired: a section of seed-matched differences (``paired_section``), or "".
    answers: the opening sentences (``answer_lines``).
  """
  runs = sweep_info["runs"]
  methods = list(dict.fromkeys(r["algorithm"] for r in runs))
  settings = list(dict.fromkeys(r["setting"] for r in runs))
  seeds = list(sweep_info["sweep"]["seeds"])
  env = sweep_info.get("environment", {})
  commands = [c for c in (sweep_info.get("command"), (plots_info or {}).get("command"),
                          page_command) if c]
  rounds = sorted({r["rounds_completed"] for r in rows if r["rounds_completed"]})
  page_dir = os.path.dirname(os.path.abspath(page_path))
  csv_link = os.path.relpath(os.path.join(sweep_dir, "results.csv"), page_dir)
  lines = ["# Results", "",
           "<!-- Generated by experiments/results_page.py from the sweep's sweep.json, "
           "results.csv and plots.json; do not edit by hand. -->", "",
           f"{len(rows)} of {len(runs)} runs of the sweep; {len(methods)} methods x "
           f"{len(settings)} settings x {len(seeds)} seeds; rounds per run: "
           f"{', '.join(map(str, rounds)) or '–'}.", "", *[f"{a}\n" for a in answers],
           tables.results_markdown(rows, methods=methods, settings=settings,
                                      seeds=seeds),
           f"Per-run numbers: [results.csv]({csv_link}).", "",
           *([paired] if paired else [])]
  if plots_info:
    lines += figure_section(plots_info["figures"], plots_dir, page_dir, settings)
    lines += [f"TensorBoard logs of every run: `tensorboard --logdir "
              f"{os.path.join(plots_dir, 'tb')}`.", ""]
  lines += [*(["## About this sweep", "", "```", about.strip(), "```", ""] if about else []),
            "Produced by:", "", "```sh", *commands, "```", "",
            environment_line(env), ""]
  return "\n".join(lines)


def environment_line(env: dict) -> str:
  """``'Environment: backend gpu, devices 1 x NVIDIA H200, ...'`` from ``sweep.json``."""
  return "Environment: " + ", ".join(f"{k} {v}" for k, v in env.items() if v) + "."


def sweep_file(command: str) -> str | None:
  """The sweep file named by ``--sweep=`` in ``command`` (None if absent or missing)."""
  for arg in command.split():
    if arg.startswith("--sweep="):
      path = arg.split("=", 1)[1].split(":")[0]
      if os.path.exists(path):
        return path
  return None


def sweep_docstring(command: str) -> str:
  """The module docstring of the sweep file named by ``--sweep=`` in ``command``."""
  import ast
  path = sweep_file(command)
  if path is None:
    return ""
  with open(path) as f:
    return ast.get_docstring(ast.parse(f.read())) or ""


def paper_cells(command: str) -> dict | None:
  """The sweep file's ``PAPER_CELLS`` (``{'cell', 'values': {method: %}}``), if any."""
  path = sweep_file(command)
  return getattr(config_files.load_module(path), "PAPER_CELLS", None) if path else None


def earlier_section(sweep_dir: str, page_path: str) -> str:
  """Another sweep's tables for comparison (an earlier protocol, another machine): what
  it is, its command and environment, how far its cells are from the paper's (its sweep
  file's ``PAPER_CELLS``), and its figures where ``<sweep_dir>/plots`` has them."""
  info = read_json(os.path.join(sweep_dir, "sweep.json"))
  with open(os.path.join(sweep_dir, "results.csv")) as f:
    rows = tables.parse_csv(f.read())
  methods = list(dict.fromkeys(r["algorithm"] for r in info["runs"]))
  settings = list(dict.fromkeys(r["setting"] for r in info["runs"]))
  command = info.get("command", "")
  about = sweep_docstring(command).strip().split("\n\n")[0]
  page_dir = os.path.dirname(os.path.abspath(page_path))
  csv_link = os.path.relpath(os.path.join(sweep_dir, "results.csv"), page_dir)
  plots_dir = os.path.join(sweep_dir, "plots")
  plots_json = os.path.join(plots_dir, "plots.json")
  figures = (figure_section(read_json(plots_json)["figures"], plots_dir,
                            page_dir, settings, heading="###")
             if os.path.exists(plots_json) else [])
  return "\n".join([
      f"## Another sweep: {sweep_dir}", "", about, "", "```sh", command, "```", "",
      environment_line(info.get("environment", {})), "",
      *[f"{a}\n" for a in answer_lines([], rows, paper_cells(command))],
      tables.results_markdown(rows, methods=methods, settings=settings,
                                 seeds=list(info["sweep"]["seeds"]), heading="###"),
      f"Per-run numbers: [results.csv]({csv_link}).", "", *figures])


def paired_section(sweep_dir: str, baseline: str, last_k: int = 5) -> str:
  """Every other method (or setting) minus ``baseline``, seed by seed (``paired``)."""
  table = paired_report.report(sweep_dir, baseline, last_k=last_k)
  return "\n".join([
      f"## Paired against {baseline}", "",
      "Runs of one cell at the same seed share the partition, so a method's difference "
      f"from {baseline} at each seed, averaged over the seeds, says more than the "
      "difference of the means above, whose spread is mostly the partition's (`python "
      f"experiments/paired.py --sweep_dir={sweep_dir} --baseline={baseline} "
      "--per_seed` lists every seed). A single seed has no standard error.", "",
      table])


def write_page(sweep_dir: str, plots_dir: str | None, out: str,
               command: str | None = None, earlier: tuple[str, ...] = (),
               paired: str | None = None) -> str:
  """Reads the sweep's and the plots' records and writes the page to ``out``.

  ``earlier``: other sweep directories whose tables follow, for comparison (e.g. the
  same methods under an earlier protocol). ``paired``: a method or setting to subtract
  seed by seed in a section after the tables (``paired_section``).
  """
  sweep_info = read_json(os.path.join(sweep_dir, "sweep.json"))
  with open(os.path.join(sweep_dir, "results.csv")) as f:
    rows = tables.parse_csv(f.read())
  plots_json = os.path.join(plots_dir, "plots.json") if plots_dir else None
  plots_info = (read_json(plots_json)
                if plots_json and os.path.exists(plots_json) else None)
  sweep_command = sweep_info.get("command", "")
  comparisons = (paired_lib.compare(paired_lib.group_values(
      load_runs(sweep_dir), 5), paired) if paired else [])
  text = render_page(sweep_info, rows, plots_info, sweep_dir=sweep_dir,
                     plots_dir=plots_dir or "", page_path=out, page_command=command,
                     about=sweep_docstring(sweep_command),
                     paired=paired_section(sweep_dir, paired) if paired else "",
                     answers=answer_lines(comparisons, rows, paper_cells(sweep_command)))
  for other in earlier:
    text += "\n" + earlier_section(other, out)
  os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
  tables.write_text(out, text)
  return text


def cli() -> None:
  """The command line: ``--sweep_dir``, ``--plots_dir``, ``--out``, ``--earlier``,
  ``--paired``."""
  from absl import flags  # noqa: PLC0415

  from fedjax_het import cli as cli_lib  # noqa: PLC0415

  sweep_flag = flags.DEFINE_string("sweep_dir", None, "The sweep directory.")
  plots_flag = flags.DEFINE_string("plots_dir", None,
                                   "experiments/plots.py --out directory (optional).")
  out_flag = flags.DEFINE_string("out", None, "The Markdown file to write.")
  earlier_flag = flags.DEFINE_list("earlier", [], "Other sweep directories whose tables "
                                   "follow the main one's, for comparison.")
  paired_flag = flags.DEFINE_string("paired", None, "A method (or setting) every other "
                                    "is compared with seed by seed (experiments/paired.py).")
  flags.mark_flags_as_required(["sweep_dir", "out"])

  def main(argv):
    del argv
    try:
      write_page(sweep_flag.value, plots_flag.value, out_flag.value,
                 command=" ".join(shlex.quote(a) for a in ["python", *sys.argv]),
                 earlier=tuple(earlier_flag.value), paired=paired_flag.value)
    except (FileNotFoundError, ValueError) as err:
      cli_lib.fail(err)
    print(f"wrote {out_flag.value}", flush=True)

  cli_lib.run(main, flag=None)


if __name__ == "__main__":
  cli()
