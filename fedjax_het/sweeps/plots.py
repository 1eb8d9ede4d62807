r"""Figures (PNG, matplotlib Agg) and TensorBoard logs (tensorboardX) from run workdirs.

  python experiments/plots.py --runs=runs/paper_table --out=runs/paper_table/plots \
      --compare=fedmrl,standalone
  python experiments/plots.py --runs=runs --out=runs/plots --target=0.6 --nogates

``--runs`` is a sweep directory (``<algorithm>/<setting slug>/seed<k>/`` workdirs, see
``experiments/sweep.py``) or any directory holding workdirs (each directory with a
``metrics.jsonl`` is one run; its path names the method). For every setting it writes

- ``accuracy_<setting>.png``: mean test accuracy vs rounds, one line per method (mean
  over seeds, band = +-1 std);
- ``client_diff_<setting>.png`` (with ``--compare=A,B``): per-client test accuracy of A
  minus B, averaged over the seeds both have, sorted (FedMRL paper Fig. 3/4, right);
- ``target_<setting>.png``: communication (uplink + downlink parameters per
  participating client), rounds and wall seconds each method needs before its
  seed-averaged accuracy curve first reaches ``--target`` (default: the lowest final
  accuracy among the methods, which every method reaches);

with ``--paired=METHOD`` ``paired_rounds_<setting>.png`` and ``paired_dots_<setting>.png``
(every other method minus METHOD at the same seed, by round with a ± 2 s.e. band, and
at the final round), and for every FedMoE workdir ``gates_<run>.png``: per client, the histogram of the
global expert's gate weight alpha_G over its test samples (restored from the final
checkpoint; needs the run's data and the same device count). ``tb/<run>/`` holds a
TensorBoard event log of each run's ``metrics.jsonl`` scalars; ``plots.json`` lists the
figures for ``experiments/results_page.py``. Figures are 640x480 pixels (the target
figure 1280x480).

The figures are drawn by ``figures``, the gate weights restored by ``gates``, the logs
written by ``tensorboard_logs``; this module picks them per setting and run.
"""
from __future__ import annotations

import os
import shlex
import sys
from typing import Callable, Sequence

from fedjax_het.sweeps import paired as paired_lib
from fedjax_het.sweeps.figures import client_diff
from fedjax_het.sweeps.figures import default_target
from fedjax_het.sweeps.figures import mean_curve
from fedjax_het.sweeps.figures import plot_accuracy
from fedjax_het.sweeps.figures import plot_client_diff
from fedjax_het.sweeps.figures import plot_gates
from fedjax_het.sweeps.figures import plot_paired_dots
from fedjax_het.sweeps.figures import plot_paired_rounds
from fedjax_het.sweeps.figures import plot_target
from fedjax_het.sweeps.figures import target_costs
from fedjax_het.sweeps.gates import gate_weights_by_client
from fedjax_het.sweeps.plan import slug
from fedjax_het.sweeps.rundirs import RunData
from fedjax_het.sweeps.rundirs import load_runs
from fedjax_het.sweeps.tensorboard_logs import write_tensorboard
from fedjax_het.training import metrics as metrics_lib


def _in_order(values):
  """Distinct values in first-seen order."""
  return list(dict.fromkeys(values))


def fig_name(kind: str, setting: str) -> str:
  """``'<kind>_<setting slug>.png'``, or ``'<kind>.png'`` outside a sweep."""
  return f"{kind}_{slug(setting)}.png" if setting else f"{kind}.png"


def figure(kind: str, setting: str, path: str, out: str, caption: str) -> dict:
  """A ``plots.json`` entry (``path`` relative to ``out``)."""
  return {"kind": kind, "setting": setting, "path": os.path.relpath(path, out),
          "caption": caption}


def setting_figures(setting: str, runs: Sequence[RunData], out: str, *,
                    compare: Sequence[str] | None, target: float | None,
                    log: Callable[[str], None]) -> list[dict]:
  """The accuracy, per-client difference and cost-to-target figures of one setting."""
  methods = _in_order(r.method for r in runs)
  by_method = {m: [r for r in runs if r.method == m] for m in methods}
  curves = {m: mean_curve(rs) for m, rs in by_method.items()}
  path = os.path.join(out, fig_name("accuracy", setting))
  figs = [figure("accuracy", setting, plot_accuracy(curves, setting, path), out,
                 "One line per method: the mean over seeds, the band ± 1 std.")]
  if compare and all(m in by_method for m in compare):
    a, b = compare
    path = os.path.join(out, fig_name("client_diff", setting))
    diff = client_diff(by_method[a], by_method[b])
    figs.append(figure("client_diff", setting, plot_client_diff(diff, a, b, setting, path),
                       out, f"Per-client test accuracy of {a} minus {b} (percentage "
                       "points), sorted; mean over the seeds both ran."))
  elif compare:
    log(f"warning: --compare={','.join(compare)}: setting {setting!r} has methods "
        f"{list(by_method)}; no difference figure")
  t = target if target is not None else default_target(curves)
  path = os.path.join(out, fig_name("target", setting))
  figs.append(figure("target", setting, plot_target(target_costs(curves, t), t, setting,
                                                    path), out,
                     "Communication, rounds and wall time until the seed-mean accuracy "
                     f"first reaches {100 * t:.2f}%."))
  return figs


def paired_figures(setting: str, runs: Sequence[RunData], baseline: str,
                   out: str) -> list[dict]:
  """Every method of a setting minus ``baseline`` seed by seed: the difference against
  round (``plot_paired_rounds``) and at the final round (``plot_paired_dots``)."""
  comparisons = paired_lib.compare_rounds(runs, baseline)
  if not comparisons:
    return []
  name = f"{setting} minus {baseline}" if setting else f"minus {baseline}"
  rounds_path = os.path.join(out, fig_name("paired_rounds", setting))
  dots_path = os.path.join(out, fig_name("paired_dots", setting))
  return [
      figure("paired_rounds", setting,
             plot_paired_rounds(comparisons, f"Paired difference by round\n{name}",
                                rounds_path), out,
             f"Each method minus {baseline} at the same seed (same partition), every "
             "evaluated round: mean over seeds, band ± 2 standard errors."),
      figure("paired_dots", setting,
             plot_paired_dots([c.method for c in comparisons],
                              [c.diffs[:, -1] for c in comparisons],
                              f"At the final round\n{name}",
                              f"test accuracy minus {baseline} (points)", dots_path), out,
             f"Each method minus {baseline} at the final round: the seeds (small dots), "
             "their mean and ± 2 standard errors.")]


def gate_figures(runs: Sequence[RunData], out: str,
                 log: Callable[[str], None]) -> list[dict]:
  """A gate-weight figure per FedMoE run (a run that cannot be restored is skipped)."""
  figs = []
  for run in runs:
    if run.algorithm != "fedmoe":
      continue
    try:
      weights = gate_weights_by_client(run.workdir)
    except (ValueError, FileNotFoundError) as err:
      log(f"warning: no gate figure for {run.workdir}: {err}")
      continue
    path = os.path.join(out, f"gates_{slug(run.name)}.png")
    figs.append(figure("gates", run.setting, plot_gates(weights, run.name, path), out,
                       "Gate weight of the global expert per client over its test "
                       f"samples ({run.name})."))
  return figs


def make_plots(root: str, out: str, *, compare: Sequence[str] | None = None,
               target: float | None = None, gates: bool = True,
               paired: str | None = None,
               log: Callable[[str], None] = print, command: str | None = None) -> dict:
  """Writes every figure and TensorBoard log of the runs under ``root`` into ``out``.

  Args:
    root: a sweep directory or a directory of workdirs.
    out: output directory.
    compare: ``(A, B)`` method names for the per-client difference figure.
    target: accuracy (fraction) for the cost-to-target figure; default per setting the
      lowest final accuracy among the methods.
    gates: draw the FedMoE gate figures (restores checkpoints, compiles the gate).
    paired: a method every other is compared with seed by seed (``paired_figures``).
    log: where warnings and progress go.
    command: the command line, recorded in ``plots.json``.

  Returns:
    The ``plots.json`` manifest: ``{'command', 'runs', 'figures': [{'kind', 'setting',
    'path' (relative to out), 'caption'}], 'tensorboard'}``.
  """
  runs = load_runs(root)
  if not runs:
    raise FileNotFoundError(f"no workdir with a metrics.jsonl under {root}")
  if target is not None and not 0 < target <= 1:
    raise ValueError(f"--target={target} must be an accuracy fraction in (0, 1]")
  os.makedirs(out, exist_ok=True)
  figures = []
  for setting in _in_order(r.setting for r in runs):
    mine = [r for r in runs if r.setting == setting]
    figures += setting_figures(setting, mine, out, compare=compare, target=target, log=log)
    if paired:
      figures += paired_figures(setting, mine, paired, out)
  if gates:
    figures += gate_figures(runs, out, log)
  for f in figures:
    log(f"wrote {os.path.join(out, f['path'])}")
  tb = [os.path.relpath(write_tensorboard(r, os.path.join(out, "tb")), out) for r in runs]
  manifest = {"command": command, "runs": os.path.abspath(root), "figures": figures,
              "tensorboard": tb}
  metrics_lib.write_json(os.path.join(out, "plots.json"), manifest)
  return manifest


def cli() -> None:
  """The command line: ``--runs``, ``--out``, ``--compare``, ``--target``, ``--gates``."""
  from absl import flags  # noqa: PLC0415

  from fedjax_het import cli as cli_lib  # noqa: PLC0415

  runs_flag = flags.DEFINE_string("runs", None, "A sweep directory or a directory of runs.")
  out_flag = flags.DEFINE_string("out", None, "Output directory for PNGs, tb/, plots.json.")
  compare_flag = flags.DEFINE_list("compare", None, "Two methods A,B: per-client A - B.")
  target_flag = flags.DEFINE_float("target", None, "Target accuracy (fraction in (0, 1]).")
  gates_flag = flags.DEFINE_bool("gates", True, "FedMoE gate figures (restore checkpoints).")
  paired_flag = flags.DEFINE_string("paired", None, "A method every other is compared "
                                    "with seed by seed: difference by round and at the end.")
  flags.mark_flags_as_required(["runs", "out"])

  def main(argv):
    del argv
    if compare_flag.value and len(compare_flag.value) != 2:
      cli_lib.fail(f"--compare takes two methods A,B; got {compare_flag.value}")
    try:
      manifest = make_plots(runs_flag.value, out_flag.value, compare=compare_flag.value,
                            target=target_flag.value, gates=gates_flag.value,
                            paired=paired_flag.value,
                            command=" ".join(shlex.quote(a) for a in ["python", *sys.argv]))
    except (ValueError, FileNotFoundError) as err:
      cli_lib.fail(err)
    print(f"{len(manifest['figures'])} figures and {len(manifest['tensorboard'])} "
          f"TensorBoard logs in {out_flag.value}", flush=True)

  cli_lib.run(main, flag=None)


if __name__ == "__main__":
  cli()
