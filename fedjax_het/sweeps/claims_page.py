"""The claims ledger's Markdown page (docs/claims.md) and its figures: a row per claim and
round read with its verdict (``verdicts``), the opening sentences that sum the verdicts
up, a figure per claim and the commands that make the runs.

  python experiments/claims_page.py --results=results --out=docs/claims.md
"""
from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from fedjax_het.sweeps.claim_runs import client_fidelity
from fedjax_het.sweeps.claim_runs import failed_runs
from fedjax_het.sweeps.claim_runs import group_runs
from fedjax_het.sweeps.claim_runs import round_comparison
from fedjax_het.sweeps.claims import Claim
from fedjax_het.sweeps.figures import client_diff
from fedjax_het.sweeps.figures import mean_curve
from fedjax_het.sweeps.figures import plot_accuracy
from fedjax_het.sweeps.figures import plot_client_diff
from fedjax_het.sweeps.figures import plot_gates
from fedjax_het.sweeps.figures import plot_paired_rounds
from fedjax_het.sweeps.figures import plot_scatter
from fedjax_het.sweeps.gates import read_gates
from fedjax_het.sweeps.plan import slug
from fedjax_het.sweeps.stats import mean_se_text
from fedjax_het.sweeps.verdicts import NOT_REACHED
from fedjax_het.sweeps.verdicts import ONE_SEED
from fedjax_het.sweeps.verdicts import UNINFORMATIVE
from fedjax_het.sweeps.verdicts import VERDICTS
from fedjax_het.sweeps.verdicts import Reading
from fedjax_het.sweeps.verdicts import read


def side_labels(claim: Claim) -> tuple[str, str]:
  """What a figure's legend calls A and B: their methods, with their settings when both
  sides are one method (an ablation)."""
  a, b = claim.a, claim.b
  if a.method == b.method:
    return f"{a.method}, {a.setting}", f"{b.method}, {b.setting}"
  return a.method, b.method


def figure_title(claim: Claim) -> str:
  """The figure's title: the claim, then what is subtracted from what (a method's two
  settings when both sides are one method, e.g. an ablation)."""
  a, b = claim.a, claim.b
  if claim.test in ("gates", "fidelity"):
    return f"{claim.id}: {a.method}"
  if a.method == b.method:
    return f"{claim.id}: {a.method}\n{a.setting} minus {b.setting}"
  return f"{claim.id}: {a.method} minus {b.method}\n{a.setting}"


def figure_for(claim: Claim, runs_by_sweep: dict, out_dir: str) -> str | None:
  """The claim's figure (difference by round, or per-client differences), or None."""
  os.makedirs(out_dir, exist_ok=True)
  path = os.path.join(out_dir, f"{slug(claim.id)}.png")
  title = figure_title(claim)
  if claim.test == "fidelity":
    found = group_runs(runs_by_sweep, claim.a)
    if not found:
      return None
    return plot_scatter([client_fidelity(r) for r in found],
                              [f"seed {r.seed}" for r in found],
                              "FILE fidelity of the client's type (final round)",
                              "client's final test accuracy", title, path)
  if claim.test == "gates":
    found = [read_gates(r) for r in group_runs(runs_by_sweep, claim.a)]
    found = [g for g in found if g is not None]
    if not found:
      return None
    return plot_gates([a for a, _ in found[0]], f"{claim.a.method}, "
                            f"{claim.a.setting}, first seed", path)
  if claim.test == "target":
    a, b = group_runs(runs_by_sweep, claim.a), group_runs(runs_by_sweep, claim.b)
    if not a or not b:
      return None
    curves = dict(zip(side_labels(claim), (mean_curve(a), mean_curve(b))))
    return plot_accuracy(curves, claim.a.setting, path, target=claim.target)
  if claim.test == "clients":
    a, b = group_runs(runs_by_sweep, claim.a), group_runs(runs_by_sweep, claim.b)
    if not a or not b:
      return None
    return plot_client_diff(client_diff(a, b), claim.a.method,
                                  claim.b.method, claim.a.setting, path)
  c = round_comparison(claim, runs_by_sweep)
  if c is None:
    return None
  return plot_paired_rounds([c], title, path,
                                  marks=[t for t in claim.rounds if t <= c.rounds[-1]])


def _cell(r: Reading, claim: Claim) -> str:
  if claim.test == "target" and r.verdict == NOT_REACHED:
    return f"{int(np.isnan(r.diffs).sum())} of {len(r.diffs)} seeds did not reach it"
  unit = {"target": f"% of B's {claim.measure} saved",
          "gates": " points above chance", "fidelity": " (Spearman)"}.get(claim.test, "")
  return f"{mean_se_text(r.mean, r.se)}{unit} (n={len(r.diffs)})"


def _trend(r: Reading) -> str:
  if r.trend is None:
    return "–"
  return (f"{r.trend.direction} ({mean_se_text(r.trend.slope, r.trend.se)} "
          "/ 10 rounds)")


def window_lines(readings: Sequence[Reading]) -> list[str]:
  """A figure's text: each reading at its round and over the last third of its rounds."""
  return [f"Round {r.round}: {mean_se_text(r.mean, r.se)}, {r.verdict}; over rounds "
          f"{r.trend.first}-{r.trend.last} (the last third), the mean difference "
          f"{mean_se_text(r.trend.level, r.trend.level_se)}: {r.window}."
          for r in readings if r.window]


def _sides_text(c: Claim, r: Reading) -> str:
  """Each side's accuracy against its floor, at the reading's round."""
  (a, fa), (b, fb) = r.sides
  return (f"{c.a.method} {a:.1f}% (floor {fa:.1f}%), {c.b.method} {b:.1f}% "
          f"(floor {fb:.1f}%)")


def _verdict_text(r: Reading) -> str:
  return f"{r.verdict} ({mean_se_text(r.mean, r.se)})"


def side_by_side_lines(rows: Sequence[tuple[Claim, list[Reading]]],
                       side_by_side: Sequence[tuple]) -> list[str]:
  """One sentence per ``(name, claim, [(against what, [claim ids])])``: the verdicts at
  the longest budget of each list of rows, beside each other."""
  last = {c.id: rs[-1] for c, rs in rows if rs}
  out = []
  for name, claim, against in side_by_side:
    parts = []
    for what, ids in against:
      found = [(cid, last[cid]) for cid in ids if cid in last]
      parts.append(f"against {what}, " + (", ".join(
          f"{cid}: {_verdict_text(r)}" for cid, r in found) if found else "no runs"))
    out.append(f"{name} ({claim}): " + "; ".join(parts) + ".")
  return out


def summary_lines(rows: Sequence[tuple[Claim, list[Reading]]],
                  side_by_side: Sequence[tuple] = ()) -> list[str]:
  """The page's opening sentences, from the readings: the verdicts at the longest budget
  of the comparisons where both sides learned, the uninformative rows apart, then
  ``side_by_side_lines``."""
  read_rows = [(c, rs) for c, rs in rows if rs]
  last = [rs[-1].verdict for _, rs in read_rows if rs[-1].verdict != UNINFORMATIVE]
  order = dict.fromkeys((*VERDICTS, NOT_REACHED, ONE_SEED, *last))  # any other one last
  counts = ", ".join(f"{last.count(v)} {v}" for v in order if last.count(v))
  floored = [(c, rs[-1]) for c, rs in read_rows if rs[-1].verdict == UNINFORMATIVE]
  apart = (f", leaving out the {len(floored)} {UNINFORMATIVE} rows where a side did not "
           "learn (below)" if floored else "")
  lines = [f"{len(read_rows)} of {len(rows)} claims have finished runs"
           + (f"; at the longest budget read{apart}: {counts}." if counts else ".")]
  if floored:
    lines.append(f"{len(floored)} {UNINFORMATIVE}, no verdict (a side ended at or below "
                 "its floor: the chance level of its clients' own label sets, the mean "
                 "over clients of 1 / classes held, or the ledger's floor): " + "; ".join(
                     f"{c.id} ({_sides_text(c, r)})" for c, r in floored) + ".")
  lines += side_by_side_lines(rows, side_by_side)
  budgets: dict = {}  # one comparison's readings over its rows (its budgets)
  for c, rs in read_rows:
    budgets.setdefault(c.headline or c.id, []).extend(rs)
  for name, rs in budgets.items():
    if len(rs) > 1 and len({r.verdict for r in rs}) > 1:
      lines.append(f"{name}: the verdict changes with the budget: " + ", then ".join(
          f"{r.verdict} at round {r.round} ({mean_se_text(r.mean, r.se)})"
          for r in rs) + ".")
  changed = [f"{c.id} at round {r.round}: {r.verdict} "
             f"({mean_se_text(r.mean, r.se)}), over "
             f"rounds {r.trend.first}-{r.trend.last}: {r.window} "
             f"({mean_se_text(r.trend.level, r.trend.level_se)})"
             for c, rs in read_rows for r in rs if r.window and r.window != r.verdict]
  if changed:
    lines.append("Read as the mean difference over the last third of the rounds rather "
                 "than at the round read, the verdict differs: " + "; ".join(changed) + ".")
  moving = [f"{c.id} ({rs[-1].trend.direction})" for c, rs in read_rows
            if rs[-1].trend is not None and rs[-1].trend.direction != "flat"]
  if moving:
    lines.append("Still moving at the last round read (slope beyond two standard "
                 "errors): " + ", ".join(moving) + ".")
  return lines


def render(claims: Sequence[Claim], runs_by_sweep: dict, *, page_path: str,
           figures_dir: str, results: str, command: str | None = None,
           notes: Sequence[tuple[str, str]] = (), about: str = "",
           failures: dict | None = None, side_by_side: Sequence[tuple] = ()) -> str:
  """The ledger's Markdown page (figures written into ``figures_dir``).

  ``notes``: ``(claim, why it has no row yet)`` for claims the ledger does not test;
  ``about``: the runs' common setting, said once under the summary; ``failures``:
  ``load_failures``'s rows, named in the summary and under the claims that lack them.
  """
  page_dir = os.path.dirname(os.path.abspath(page_path))
  rows = [(c, read(c, runs_by_sweep)) for c in claims]
  failed = {c.id: [t for g in (c.a, c.b) for t in failed_runs(g, failures or {},
                                                               runs_by_sweep)]
            for c in claims}
  failed_text = {cid: "Failed, so not read: " + "; ".join(ts) + "."
                 for cid, ts in failed.items() if ts}
  lines = ["# Claims ledger", "",
           "<!-- Generated by experiments/claims_page.py from the runs under "
           f"{results}; do not edit by hand. -->", "", *summary_lines(rows, side_by_side),
           *(["Runs that failed are left out of their claims' pairs: "
              + "; ".join(f"{cid}: {'; '.join(failed[cid])}" for cid in failed_text) + "."]
             if failed_text else []), "",
           *([about, ""] if about else []),
           "| claim | paper | we ran | round | A − B, points | going | verdict |",
           "|---|---|---|---:|---:|---|---|"]
  figures = []
  for c, readings in rows:
    fig = figure_for(c, runs_by_sweep, figures_dir) if readings else None
    name = f"[{c.id}](#{plots_anchor(c.id)})" if fig else c.id
    paper = c.paper + ("" if c.paper_points is None else f" ({c.paper_points:+.2f})")
    what = (f"{c.a.method}, {c.ran}" if c.test in ("gates", "fidelity")
            else f"{c.a.method} − {c.b.method}, {c.ran}")
    if not readings:
      lines.append(f"| {c.id} | {paper} | {what} | – | runs not finished | – | pending |")
      continue
    for i, r in enumerate(readings):
      lines.append(f"| {name if i == 0 else ''} | {paper if i == 0 else ''} | "
                   f"{what if i == 0 else ''} | {r.round} | {_cell(r, c)} | {_trend(r)} | "
                   f"{r.verdict} |")
    if fig:
      figures.append((c, os.path.relpath(fig, page_dir),
                      window_lines(readings) + ([failed_text[c.id]] if c.id in failed_text
                                                else [])))
  lines += ["", "A − B: the mean over seeds of the per-seed difference (same seed: same "
            "partition), ± its standard error; `clients`: the share of clients on which A "
            "beats B at the final round, minus 50%; `to target`: what A saves, in % of "
            "B's cost, to first reach the target accuracy (the round shown is the runs' "
            "last); `gates`: the share of the gate weights' variance that the clients "
            "(or a client's classes) explain, minus the share chance would; "
            "`fidelity`: Spearman's correlation of clients' accuracy with their type's "
            "fidelity. Going: the slope of the per-round "
            "difference over the last third of the rounds read, beyond two standard "
            "errors; each figure's text also gives the mean difference over that last "
            "third and its verdict. Verdicts: `reproduced`, the paper's sign beyond two "
            "standard errors and at least half its size (for a claim of no difference: within two "
            "standard errors of zero); `same direction, smaller`, under half; `not "
            "seen`, within two standard errors of zero; `opposite`, the other sign "
            "beyond them; `differs`, a claim of no difference with a difference beyond "
            "them. `uninformative`: no verdict, A or B ended (mean over the paired seeds, "
            "at the round read) at or below its floor, the chance level of its clients' "
            "own label sets (the mean over clients of 1 / classes held) or a floor the "
            "ledger states.", ""]
  if notes:
    lines += ["## Not tested yet", ""] + [f"- **{cid}**: {why}" for cid, why in notes]
    lines.append("")
  lines += ["## Figures", ""]
  for c, rel, windows in figures:
    lines += [f"### {c.id}", "", f"{c.paper}. We ran: {c.ran}.", "",
              *([" ".join(windows), ""] if windows else []), f"![{c.id}]({rel})", ""]
  sweeps = list(dict.fromkeys(f for c in claims for f in c.sweep_files))
  lines += ["## Commands", "",
            "`--seed_batch=3` runs a cell's three seeds as one program, which fills an "
            "accelerator. On a CPU leave it out: the seeds then run one after another "
            "in about the same time and less memory (FedMRL's N=100 cell on the "
            "2-core machine, 24 rounds: two seeds together peaked at 11.3 GiB, one seed "
            "alone at 5.2 GiB; docs/performance.md).", "", "```sh"]
  lines += [f"python experiments/sweep.py --sweep={f} --sweep_dir=" + os.path.join(
      results, *(["claims"] if "/claims/" in f else []),
      os.path.splitext(os.path.basename(f))[0]) + " --seed_batch=3 --budget_min=60"
      for f in sweeps]
  if command:
    lines.append(command)
  lines += ["```", ""]
  return "\n".join(lines)


def plots_anchor(claim_id: str) -> str:
  """The Markdown anchor of a claim's figure heading (GitHub's rule)."""
  return "".join(ch for ch in claim_id.lower().replace(" ", "-")
                 if ch.isalnum() or ch in "-_")
