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
figures for ``experiments/results_page.py``. Figures are ``FIGSIZE`` inches at ``DPI``
(640x480 pixels; the target figure 1280x480).
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import struct
import sys
from typing import Callable, Sequence

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedjax_het.sweeps import paired as paired_lib  # noqa: E402
from fedjax_het.sweeps.plan import slug  # noqa: E402
from fedjax_het.sweeps.rundirs import RunData  # noqa: E402
from fedjax_het.sweeps.rundirs import load_runs  # noqa: E402
from fedjax_het.sweeps.rundirs import read_json  # noqa: E402
from fedjax_het.training import metrics as metrics_lib  # noqa: E402

DPI = 100
FIGSIZE = (6.4, 4.8)  # 640 x 480 pixels
WIDE_FIGSIZE = (12.8, 4.8)  # 1280 x 480 pixels
SCALARS = ("mean_test_acc", "train_loss", "uplink_params", "downlink_params", "wall_s")


@dataclasses.dataclass(frozen=True)
class Curve:
  """A method's seed-averaged curves at the rounds every seed evaluated.

  Attributes: ``rounds`` [T]; ``acc``, ``acc_std`` [T] (fractions); ``comm`` [T] (uplink
  + downlink parameters per participating client, cumulative); ``wall`` [T] seconds;
  ``num_seeds``.
  """
  rounds: np.ndarray
  acc: np.ndarray
  acc_std: np.ndarray
  comm: np.ndarray
  wall: np.ndarray
  num_seeds: int


def _in_order(values):
  """Distinct values in first-seen order."""
  return list(dict.fromkeys(values))


# ----------------------------------------------------------------------------- pure maths


def mean_curve(runs: Sequence[RunData]) -> Curve:
  """Seed average of the runs' metrics at the rounds all of them evaluated."""
  common = sorted(set.intersection(*[{r["round"] for r in run.rows} for run in runs]))
  if not common:
    raise ValueError(f"runs {[r.name for r in runs]} share no evaluated round")

  def stack(fn):
    return np.array([[fn(row) for row in run.rows if row["round"] in common]
                     for run in runs], dtype=np.float64)

  acc = stack(lambda row: row["mean_test_acc"])
  comm = stack(lambda row: row["uplink_params"] + row["downlink_params"])
  wall = stack(lambda row: row["wall_s"])
  return Curve(np.array(common), acc.mean(0), acc.std(0, ddof=1) if len(runs) > 1 else
               np.zeros(len(common)), comm.mean(0), wall.mean(0), len(runs))


def default_target(curves: dict) -> float:
  """The lowest final accuracy among the methods' curves (every method reaches it)."""
  return min(float(c.acc[-1]) for c in curves.values())


def target_costs(curves: dict, target: float) -> dict:
  """``{method: {'round', 'comm', 'wall'} or None}`` at the first round reaching target."""
  out = {}
  for method, c in curves.items():
    i = paired_lib.first_reach(c.acc, target)
    out[method] = None if i is None else {"round": int(c.rounds[i]),
                                          "comm": float(c.comm[i]),
                                          "wall": float(c.wall[i])}
  return out


def client_diff(runs_a: Sequence[RunData], runs_b: Sequence[RunData]) -> np.ndarray:
  """Per-client accuracy A - B [N], averaged over the seeds both methods ran.

  Same seed means the same partition, so client k is the same client in both runs.
  """
  a = {r.seed: r.per_client for r in runs_a if r.per_client is not None}
  b = {r.seed: r.per_client for r in runs_b if r.per_client is not None}
  seeds = sorted(set(a) & set(b))
  if not seeds:
    raise ValueError("the two methods share no finished seed")
  if len({len(a[s]) for s in seeds} | {len(b[s]) for s in seeds}) != 1:
    raise ValueError("the two methods' runs have different numbers of clients")
  return np.mean([np.subtract(a[s], b[s]) for s in seeds], axis=0)


def gate_histograms(weights: Sequence[np.ndarray], bins: int = 20) -> np.ndarray:
  """[bins, N]: per client, the fraction of its test samples in each weight bin of [0, 1]."""
  edges = np.linspace(0.0, 1.0, bins + 1)
  cols = [np.histogram(np.clip(w, 0, 1), edges)[0] / max(len(w), 1) for w in weights]
  return np.stack(cols, axis=1)


# ----------------------------------------------------------------------------- figures


def new_figure(size=FIGSIZE) -> Figure:
  """A pyplot-free figure of a fixed pixel size (``size`` * ``DPI``)."""
  return Figure(figsize=size, dpi=DPI)


def save(fig: Figure, path: str) -> str:
  """Saves at ``DPI`` without tight cropping, so the pixel size is exactly known."""
  fig.tight_layout()
  fig.savefig(path, dpi=DPI)
  return path


def title_of(kind: str, setting: str) -> str:
  """``'kind (setting)'``, or ``kind`` outside a sweep."""
  return f"{kind} ({setting})" if setting else kind


def plot_accuracy(curves: dict, setting: str, path: str, *,
                  target: float | None = None) -> str:
  """Mean test accuracy (%) vs rounds, one line per method, +-1 std band over seeds;
  ``target`` (a fraction): a dashed line at it."""
  fig = new_figure()
  ax = fig.add_subplot()
  for method, c in curves.items():
    (line,) = ax.plot(c.rounds, 100 * c.acc, marker="o", markersize=3,
                      label=f"{method} ({c.num_seeds} seed{'s' * (c.num_seeds > 1)})")
    if c.num_seeds > 1:
      ax.fill_between(c.rounds, 100 * (c.acc - c.acc_std), 100 * (c.acc + c.acc_std),
                      color=line.get_color(), alpha=0.2)
  if target is not None:
    ax.axhline(100 * target, color="black", linestyle="--", linewidth=1,
               label=f"target {100 * target:.1f}%")
  ax.set(xlabel="round", ylabel="mean test accuracy over clients (%)",
         title=title_of("Mean test accuracy", setting))
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.grid(alpha=0.3)
  ax.legend(fontsize="small")
  return save(fig, path)


def plot_client_diff(diff: np.ndarray, a: str, b: str, setting: str, path: str) -> str:
  """Bars of per-client accuracy A - B (percentage points), sorted descending."""
  fig = new_figure()
  ax = fig.add_subplot()
  d = 100 * np.sort(np.asarray(diff))[::-1]
  ax.bar(np.arange(len(d)), d, color=np.where(d >= 0, "tab:green", "tab:red"), width=0.8)
  ax.axhline(0, color="black", linewidth=0.8)
  ax.set(xlabel="client (sorted by difference)", ylabel=f"test accuracy {a} - {b} (pp)",
         title=title_of(f"{a} - {b}: better on {int((d > 0).sum())}/{len(d)} clients",
                        setting))
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  return save(fig, path)


def plot_target(costs: dict, target: float, setting: str, path: str) -> str:
  """Three bar charts: communication, rounds and wall seconds to reach ``target``."""
  fig = new_figure(WIDE_FIGSIZE)
  methods = list(costs)
  panels = (("comm", "uplink + downlink params per client"), ("round", "rounds"),
            ("wall", "wall seconds"))
  for k, (key, label) in enumerate(panels):
    ax = fig.add_subplot(1, 3, k + 1)
    values = [costs[m][key] if costs[m] else 0.0 for m in methods]
    ax.bar(methods, values, color=[f"C{i}" for i in range(len(methods))])
    for i, m in enumerate(methods):
      if costs[m] is None:
        ax.text(i, 0, "not reached", rotation=90, ha="center", va="bottom", fontsize=8)
    ax.set(ylabel=label)
    if key == "round":
      ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.tick_params(axis="x", labelrotation=45, labelsize=8)
  fig.suptitle(title_of(f"Cost to reach {100 * target:.2f}% mean test accuracy", setting))
  return save(fig, path)


def plot_scatter(points: Sequence[tuple[np.ndarray, np.ndarray]], labels: Sequence[str],
                 xlabel: str, ylabel: str, title: str, path: str) -> str:
  """One scatter of ``(x, y)`` per label (a seed), in one axes."""
  fig = new_figure()
  ax = fig.add_subplot()
  for (x, y), label in zip(points, labels):
    ax.scatter(x, y, s=18, alpha=0.8, label=label)
  ax.set(xlabel=xlabel, ylabel=ylabel, title=title)
  ax.grid(alpha=0.3)
  ax.legend(fontsize="small")
  return save(fig, path)


def plot_gates(weights: Sequence[np.ndarray], name: str, path: str) -> str:
  """Per-client histogram of alpha_G (columns), with each client's mean as a dot."""
  fig = new_figure()
  ax = fig.add_subplot()
  hist = gate_histograms(weights)
  n = len(weights)
  image = ax.imshow(hist, origin="lower", aspect="auto", cmap="viridis",
                    extent=(-0.5, n - 0.5, 0.0, 1.0))
  ax.plot(np.arange(n), [float(np.mean(w)) if len(w) else np.nan for w in weights],
          "o", color="white", markeredgecolor="black", markersize=4, label="client mean")
  fig.colorbar(image, ax=ax, label="fraction of the client's test samples")
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.set(xlabel="client", ylabel=r"gate weight of the global expert $\alpha_G$",
         title=f"FedMoE gate weights per client ({name})")
  ax.legend(fontsize="small", loc="upper right")
  return save(fig, path)


def plot_paired_rounds(comparisons: Sequence, title: str, path: str,
                       marks: Sequence[int] = ()) -> str:
  """Paired differences against round, one line per ``paired.RoundComparison``: the
  mean over seeds with a band of ± 2 standard errors, a zero line, and dashed lines at
  the rounds ``marks`` (where verdicts are read)."""
  fig = new_figure()
  ax = fig.add_subplot()
  for c in comparisons:
    mean, se = c.mean_se()
    label = c.method if c.base_method != c.method else c.setting
    (line,) = ax.plot(c.rounds, mean, label=f"{label} (n={len(c.seeds)})")
    if len(c.seeds) > 1:
      ax.fill_between(c.rounds, mean - 2 * se, mean + 2 * se, color=line.get_color(),
                      alpha=0.2)
  ax.axhline(0, color="black", linewidth=0.8)
  for mark in marks:
    ax.axvline(mark, color="grey", linestyle="--", linewidth=0.8)
  first = comparisons[0]
  base = (first.base_method if first.base_method != first.method
          else f"{first.method} / {first.base_setting}")
  ax.set(xlabel="round", ylabel=f"test accuracy minus {base} (points)")
  ax.set_title(title, fontsize=10)
  ax.xaxis.set_major_locator(MaxNLocator(integer=True))
  ax.grid(alpha=0.3)
  ax.legend(fontsize="small")
  return save(fig, path)


def plot_paired_dots(labels: Sequence[str], diffs: Sequence[np.ndarray], title: str,
                     xlabel: str, path: str) -> str:
  """One row per label: the per-seed differences (small dots), their mean (large dot)
  and ± 2 standard errors (bar), against a zero line."""
  fig = new_figure((6.4, max(2.4, 0.45 * len(labels) + 1.2)))
  ax = fig.add_subplot()
  for i, d in enumerate(diffs):
    d = np.asarray(d, dtype=np.float64)
    mean = d.mean()
    se = d.std(ddof=1) / np.sqrt(len(d)) if len(d) > 1 else 0.0
    ax.errorbar(mean, i, xerr=2 * se, fmt="o", color=f"C{i % 10}", capsize=3)
    ax.plot(d, np.full(len(d), i), ".", color=f"C{i % 10}", alpha=0.5)
  ax.axvline(0, color="black", linewidth=0.8)
  ax.set_yticks(range(len(labels)), labels, fontsize="small")
  ax.invert_yaxis()
  ax.set(xlabel=xlabel)
  ax.set_title(title, fontsize=10)
  ax.grid(alpha=0.3, axis="x")
  return save(fig, path)


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


# ----------------------------------------------------------------------------- FedMoE gates


def gate_weights_by_client(workdir: str) -> list[np.ndarray]:
  """alpha_G of every test sample of every client, from the run's final checkpoint."""
  return [w for w, _ in gate_samples_by_client(workdir)]


def gate_samples_by_client(workdir: str) -> list[tuple[np.ndarray, np.ndarray]]:
  """Per client, ``(alpha_G, label)`` of every test sample, from the final checkpoint.

  Rebuilds the experiment from ``config.json`` (the data must be where the run read it,
  with as many devices), restores the newest checkpoint and runs
  ``fedmoe.test_gate_weights``.
  """
  import ml_collections  # noqa: PLC0415 - needed only for FedMoE workdirs

  from fedjax_het.algorithms import fedmoe  # noqa: PLC0415
  from fedjax_het.training import checkpoint as ckpt_lib  # noqa: PLC0415
  from fedjax_het.training import experiment  # noqa: PLC0415
  from fedjax_het.training import program  # noqa: PLC0415
  from fedjax_het.training import runfiles  # noqa: PLC0415

  ckpt_dir = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(ckpt_dir):
    raise FileNotFoundError(f"{workdir} has no checkpoints/")
  config = ml_collections.ConfigDict(read_json(os.path.join(workdir, "config.json")))
  exp = experiment.prepare(config)
  abstract = program.compile_fns(exp).abstract
  ckpt = ckpt_lib.Checkpointer(ckpt_dir, max_to_keep=config.keep_checkpoints,
                               fingerprint=runfiles.fingerprint(exp))
  try:
    restored = ckpt.restore_latest(abstract)
  finally:
    ckpt.close()
  if restored is None:
    raise FileNotFoundError(f"{ckpt_dir} holds no readable checkpoint")
  groups = fedmoe.test_gate_weights(exp.runtime, restored[0], exp.data,
                                    gating_hidden=exp.config.algo.gating_hidden,
                                    global_arch=exp.config.algo.global_arch)
  out = [None] * exp.runtime.layout.num_clients
  for ids, (w, labels, mask) in zip(exp.runtime.layout.client_ids, groups):
    w, labels, mask = np.asarray(w), np.asarray(labels), np.asarray(mask)
    for pos, client in enumerate(ids):  # weight index 0: the global expert G
      out[client] = (w[pos, mask[pos], 0], labels[pos, mask[pos]])
  return out


# ----------------------------------------------------------------------------- TensorBoard


def write_tensorboard(run: RunData, tb_dir: str) -> str:
  """``tb_dir/<run name>/``: ``SCALARS`` (and their sum ``comm_params``) per round.

  Written with tensorboardX's ``SummaryWriter`` (no TensorFlow); an earlier log of the
  run is replaced, so reruns do not duplicate points.
  """
  from tensorboardX import SummaryWriter  # noqa: PLC0415

  logdir = os.path.join(tb_dir, run.name)
  shutil.rmtree(logdir, ignore_errors=True)
  writer = SummaryWriter(logdir=logdir)
  try:
    for row in run.rows:
      for key in SCALARS:
        writer.add_scalar(key, row[key], global_step=row["round"])
      writer.add_scalar("comm_params", row["uplink_params"] + row["downlink_params"],
                        global_step=row["round"])
  finally:
    writer.close()
  return logdir


def read_scalars(logdir: str) -> dict:
  """``{tag: [(step, value)]}`` from the event files in ``logdir`` (TFRecord framing:
  uint64 length, uint32 crc, payload, uint32 crc; payload an ``Event`` proto)."""
  from tensorboardX.proto import event_pb2  # noqa: PLC0415

  out: dict = {}
  for name in sorted(os.listdir(logdir)):
    if "tfevents" not in name:
      continue
    with open(os.path.join(logdir, name), "rb") as f:
      data = f.read()
    pos = 0
    while pos + 12 <= len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      event = event_pb2.Event.FromString(data[pos + 12:pos + 12 + length])
      pos += 12 + length + 4
      for v in event.summary.value:
        out.setdefault(v.tag, []).append((event.step, v.simple_value))
  return out


# ----------------------------------------------------------------------------- driver


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
