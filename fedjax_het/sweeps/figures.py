"""Figures of runs as PNG files (matplotlib's Agg backend, no pyplot): the seed-averaged
curves and per-client differences they draw, and one function per kind of figure.

Figures are ``FIGSIZE`` inches at ``DPI`` (640x480 pixels; the target figure 1280x480).
``plots`` draws a sweep's figures with them, ``claims_page`` the ledger's.
"""
from __future__ import annotations

import dataclasses
from typing import Sequence

import matplotlib

matplotlib.use("Agg")
import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fedjax_het.sweeps.rundirs import RunData  # noqa: E402
from fedjax_het.sweeps.stats import first_reach  # noqa: E402

DPI = 100
FIGSIZE = (6.4, 4.8)  # 640 x 480 pixels
WIDE_FIGSIZE = (12.8, 4.8)  # 1280 x 480 pixels


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
    i = first_reach(c.acc, target)
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
