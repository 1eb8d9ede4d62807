"""The claims ledger's Markdown page (docs/claims.md) and its figures.

The opening: the papers' headline claims at T and 3 T with the budget read against the
papers' (``opening_lines``), the counts, each claim once at its longest budget and its
rows at T apart (``counted``, ``counts_lines``), and at most five sentences
(``summary_lines``). Then how the rows were run, each cell's budget (``budget_lines``),
a row per claim and round read with its verdict and each side against its floor
(``verdicts``), tables of the rows at their floor, of the claims against each reading
of a comparator (``reading_lines``), of the verdicts that change with the budget or
over the last third of the rounds, of the rows still moving, a figure per claim and the
commands that make the runs.

  python experiments/claims_page.py --results=results --out=docs/claims.md
"""
from __future__ import annotations

import math
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


PENDING = "runs not finished"


def _pct(x: float, of: float) -> str:
  """``x`` as a percentage of ``of``: ``'4%'``, ``'12.5%'``."""
  v = 100.0 * x / of
  return f"{v:.0f}%" if abs(v - round(v)) < 0.05 else f"{v:.1f}%"


def _side_text(name: str, s) -> str:
  """A side against its floor: ``'fedproto 22.5% (floor 53.5%: guess 50.3%, commonest
  53.5%)'``."""
  if math.isnan(s.floor):
    return f"{name} {s.accuracy:.1f}% (no floor: no partition.json)"
  return (f"{name} {s.accuracy:.1f}% (floor {s.floor:.1f}%: guess {s.guess:.1f}%, "
          f"commonest {s.commonest:.1f}%)")


def sides_text(c: Claim, r: Reading) -> str:
  """Each side's accuracy against its floor and the two rates, at the reading's round."""
  names = (c.a.method,) if len(r.sides) == 1 else side_labels(c)
  return "; ".join(_side_text(n, s) for n, s in zip(names, r.sides)) or "–"


def _verdict_text(r: Reading) -> str:
  if math.isnan(r.mean):
    return r.verdict
  return f"{r.verdict} ({mean_se_text(r.mean, r.se)})"


def comparisons(rows: Sequence[tuple[Claim, list[Reading]]]) -> dict:
  """``{name: [(claim, readings)]}``: the rows of one comparison (one claim) at its
  budgets, grouped by ``Claim.headline`` (a row without one is a claim of its own),
  shortest budget first."""
  out: dict = {}
  for c, rs in rows:
    out.setdefault(c.headline or c.id, []).append((c, rs))
  return {name: sorted(found, key=lambda cr: max(cr[0].rounds))
          for name, found in out.items()}


def counted(rows: Sequence[tuple[Claim, list[Reading]]]) -> tuple[list, list]:
  """``(longest, shorter)``: per claim (``comparisons``) its row at its longest budget,
  and the rows of the same claims at shorter budgets ("at T"), as ``(claim, reading or
  None)`` (None: the row's runs are not finished); a row is read at its last round."""
  longest, shorter = [], []
  for found in comparisons(rows).values():
    last = [(c, rs[-1] if rs else None) for c, rs in found]
    longest.append(last[-1])
    shorter += last[:-1]
  return longest, shorter


def _verdict_of(r: Reading | None) -> str:
  return PENDING if r is None else r.verdict


def counts_lines(rows: Sequence[tuple[Claim, list[Reading]]]) -> list[str]:
  """The table of counts: each verdict's claims at their longest budget, and the rows
  at a shorter budget counted apart; a total that is the number of claims."""
  longest, shorter = counted(rows)
  got = [_verdict_of(r) for _, r in longest]
  at_t = [_verdict_of(r) for _, r in shorter]
  order = dict.fromkeys((*VERDICTS, UNINFORMATIVE, NOT_REACHED, ONE_SEED, PENDING,
                         *got, *at_t))
  lines = ["| verdict | claims, at their longest budget | their rows at T (apart) |",
           "|---|---:|---:|"]
  lines += [f"| {v} | {got.count(v)} | {at_t.count(v)} |" for v in order
            if got.count(v) or at_t.count(v)]
  lines.append(f"| **all** | **{len(got)}** | **{len(at_t)}** |")
  return lines


def opening_lines(rows: Sequence[tuple[Claim, list[Reading]]], opening: Sequence[tuple],
                  budgets: dict) -> list[str]:
  """The table of the papers' headline claims: each comparison's verdict at T and at
  3 T, and the budget of each read against the papers'."""
  found = comparisons(rows)
  lines = ["| the papers' claim | comparison | at T | at 3T | budget read (of the papers') |",
           "|---|---|---|---|---|"]
  for claim, names in opening:
    for i, name in enumerate(names):
      got = found.get(name, [])
      cells, spent = [], []
      for k in (0, 1):
        if k < len(got) and got[k][1]:
          c, rs = got[k]
          cells.append(f"{rs[-1].verdict} ({mean_se_text(rs[-1].mean, rs[-1].se)})"
                       if not math.isnan(rs[-1].mean) else rs[-1].verdict)
          spent.append(budgets.get(c.id))
        else:
          cells.append("not run" if k >= len(got) else PENDING)
      spent = [b for b in spent if b]
      rounds = " / ".join(_pct(b[1][0], b[2][0]) for b in spent)
      text = (f"rounds {rounds}, examples {_pct(spent[0][1][1], spent[0][2][1])}, "
              f"epochs {_pct(spent[0][1][2], spent[0][2][2])}") if spent else "–"
      lines.append(f"| {claim if i == 0 else ''} | {name} | {cells[0]} | {cells[1]} | "
                   f"{text} |")
  return lines


def budget_lines(budgets: dict) -> list[str]:
  """Each cell's budget (rounds, training examples per client, local epochs) against
  the papers', as a fraction, with how many rows read it."""
  cells: dict = {}
  for cell, ours, papers in budgets.values():
    cells.setdefault(cell, [ours, papers, 0])[2] += 1
  lines = ["| cell | rows | rounds | examples per client | local epochs |",
           "|---|---:|---|---|---|"]
  for cell, (ours, papers, n) in cells.items():
    lines.append(f"| {cell} | {n} | " + " | ".join(
        f"{o:,} of {p:,} ({_pct(o, p)})" for o, p in zip(ours, papers)) + " |")
  return lines


def _rows_read(rows):
  return [(c, rs) for c, rs in rows if rs]


def uninformative_lines(rows: Sequence[tuple[Claim, list[Reading]]]) -> list[str]:
  """A table row per row read ``uninformative``: its sides against their floors."""
  lines = ["| row | round | side | accuracy | floor | guess | commonest | above the floor |",
           "|---|---:|---|---:|---:|---:|---:|---|"]
  n = 0
  for c, rs in _rows_read(rows):
    for r in rs:
      if r.verdict != UNINFORMATIVE:
        continue
      n += 1
      names = (c.a.method,) if len(r.sides) == 1 else side_labels(c)
      for i, (name, s) in enumerate(zip(names, r.sides)):
        mark = "**at the floor**" if s.at_floor else "above"
        lines.append(f"| {c.id if i == 0 else ''} | {r.round if i == 0 else ''} | {name} | "
                     f"{s.accuracy:.1f}% | {s.floor:.1f}% | {s.guess:.1f}% | "
                     f"{s.commonest:.1f}% | {mean_se_text(s.margin, s.margin_se)} ({mark}) |")
  return lines if n else []


def reading_lines(rows: Sequence[tuple[Claim, list[Reading]]], readings: Sequence[tuple],
                  names: Sequence[str]) -> tuple[list[str], list[str]]:
  """The table of claims against each reading of a comparator (``readings``: ``(claim,
  (row id or None per name))``), the verdicts against its informative readings, and
  the claims whose every reading run is uninformative."""
  last = {c.id: rs[-1] for c, rs in rows if rs}
  lines = ["| claim | " + " | ".join(names) + " | against the informative readings |",
           "|---|" + "---|" * len(names) + "---|"]
  floored = []
  for claim, ids in readings:
    cells, good = [], []
    for name, rid in zip(names, ids):
      r = last.get(rid) if rid else None
      cells.append("not run" if r is None else _verdict_text(r))
      if r is not None and r.verdict != UNINFORMATIVE:
        good.append(f"{r.verdict} ({name.split(' (')[0]})")
    if not good:
      floored.append(claim)
    lines.append(f"| {claim} | " + " | ".join(cells) + " | "
                 + ("; ".join(good) or "none: every reading run is uninformative") + " |")
  return lines, floored


def flip_lines(rows: Sequence[tuple[Claim, list[Reading]]]) -> list[str]:
  """A table row per claim whose verdict differs between its budgets."""
  lines = ["| claim | " + "verdict by round read |", "|---|---|"]
  n = 0
  for name, found in comparisons(_rows_read(rows)).items():
    rs = [r for _, got in found for r in got]
    if len(rs) > 1 and len({r.verdict for r in rs}) > 1:
      n += 1
      lines.append(f"| {name} | " + "; ".join(
          f"round {r.round}: {_verdict_text(r)}" for r in rs) + " |")
  return lines if n else []


def window_table(rows: Sequence[tuple[Claim, list[Reading]]]) -> list[str]:
  """A table row per reading whose verdict differs read over the last third."""
  lines = ["| row | at the round read | over the last third of the rounds |",
           "|---|---|---|"]
  found = [f"| {c.id} | round {r.round}: {_verdict_text(r)} | rounds {r.trend.first}-"
           f"{r.trend.last}: {r.window} ({mean_se_text(r.trend.level, r.trend.level_se)}) |"
           for c, rs in _rows_read(rows) for r in rs if r.window and r.window != r.verdict]
  return lines + found if found else []


def moving_lines(rows: Sequence[tuple[Claim, list[Reading]]]) -> list[str]:
  """A table row per row whose difference still moves at its last round read."""
  lines = ["| row | round | going (slope / 10 rounds) | verdict |", "|---|---:|---|---|"]
  found = [f"| {c.id} | {rs[-1].round} | {_trend(rs[-1])} | {rs[-1].verdict} |"
           for c, rs in _rows_read(rows)
           if rs[-1].trend is not None and rs[-1].trend.direction != "flat"]
  return lines + found if found else []


def summary_lines(rows: Sequence[tuple[Claim, list[Reading]]], budgets: dict | None = None,
                  readings: Sequence[tuple] = (), note: str = "",
                  comparator: str = "FedProto", names: Sequence[str] = ()) -> list[str]:
  """The opening's sentences (at most five, each about 40 words or fewer): the count of
  claims, the uninformative ones, the budget against the papers', the comparator's
  rows uninformative under its first and last reading (``readings``, ``names``), and
  the ledger's ``note``."""
  longest, shorter = counted(rows)
  floored = sum(1 for _, r in longest if r is not None and r.verdict == UNINFORMATIVE)
  done = sum(1 for _, r in longest if r is not None)
  out = [f"{len(longest)} claims, each counted once at its longest budget ({done} with "
         f"finished runs); their {len(shorter)} rows at a shorter budget are counted "
         "apart, as at T."]
  out.append(f"{floored} of the {len(longest)} are {UNINFORMATIVE}: a side ended at or "
             "within a standard error of its floor, the better of guessing from its "
             "clients' label shares and always answering their commonest class.")
  if budgets:
    fr = [[o / p for o, p in zip(ours, papers)] for _, ours, papers in budgets.values()]
    lo, hi = np.min(fr, axis=0), np.max(fr, axis=0)

    def span(i):
      return (_pct(lo[i], 1) if lo[i] == hi[i] else
              f"{_pct(lo[i], 1).rstrip('%')}-{_pct(hi[i], 1)}")
    out.append(f"Every row reads under the papers' budget: {span(0)} of their rounds, "
               f"{span(1)} of their examples per client and {span(2)} of their local "
               "epochs (table below).")
  if readings:
    last = {c.id: rs[-1] for c, rs in rows if rs}

    def floored(k):
      found = [last.get(ids[k]) for _, ids in readings if ids[k]]
      n = sum(1 for r in found if r and r.verdict == UNINFORMATIVE)
      return f"{names[k].split(' (')[0]}, {n} of {len(found)}"
    out.append(f"Rows against {comparator} that are {UNINFORMATIVE}, by its reading: "
               f"{floored(0)}; {floored(-1)} (section 'Against each reading of "
               f"{comparator}').")
  if note:
    out.append(note)
  return out


LEGEND = (
    "A claim: one comparison, its rows at several budgets (T, 3 T) sharing its name; "
    "counted once, at its longest budget. Rows against FedProto's several inference "
    "readings are comparisons of their own. "
    "A − B: the mean over seeds of the per-seed difference (same seed: same "
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
    "them. `uninformative`: no verdict, a side (both of a comparison, the one of a "
    "`gates` or `fidelity` row) ended at the round read at or within one standard error "
    "of its floor. Sides: each side's accuracy at the round read and its floor, the "
    "better of two rates computed per client on the client's own test set from the "
    "run's partition.json (guess: answering each label with the client's training "
    "share of it; commonest: always answering the client's commonest training class), "
    "averaged over clients as the accuracy is and over the paired seeds (or a floor the "
    "ledger states, where higher); the standard error is that of accuracy minus floor, "
    "seed by seed.")


def render(claims: Sequence[Claim], runs_by_sweep: dict, *, page_path: str,
           figures_dir: str, results: str, command: str | None = None,
           notes: Sequence[tuple[str, str]] = (), about: Sequence[str] = (),
           failures: dict | None = None, opening: Sequence[tuple] = (),
           budgets: dict | None = None, readings: Sequence[tuple] = (),
           reading_names: Sequence[str] = (), papers_reading: str = "",
           note: str = "") -> str:
  """The ledger's Markdown page (figures written into ``figures_dir``).

  ``notes``: ``(claim, why it has no row yet)`` for claims the ledger does not test;
  ``about``: how the runs were made, a bullet each; ``failures``: ``load_failures``'s
  rows, named under the opening and under the claims that lack them; ``opening``:
  ``(the papers' claim, [comparison names])`` of the opening's table; ``budgets``:
  ``{claim id: (cell, (rounds, examples, epochs), the papers' three)}``; ``readings``:
  ``(claim, (row id or None per reading))`` with the readings' ``reading_names`` and
  ``papers_reading`` (which of them the papers used); ``note``: one more opening
  sentence.
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
           f"{results}; do not edit by hand. -->", ""]
  if opening:
    lines += opening_lines(rows, opening, budgets or {}) + [""]
  lines += counts_lines(rows) + [""]
  lines += [" ".join(summary_lines(rows, budgets, readings, note,
                                   names=reading_names)), ""]
  if failed_text:
    lines += ["Runs that failed are left out of their claims' pairs: " + "; ".join(
        f"{cid}: {'; '.join(failed[cid])}" for cid in failed_text) + ".", ""]
  if about:
    lines += ["## How the rows were run", ""] + [f"- {a}" for a in about] + [""]
  if budgets:
    lines += ["## The cells and their budgets", "",
              "Rounds, training examples per client and local epochs of each cell "
              "against the papers' (500 rounds of 10 epochs; 4,000 examples a client at "
              "N=10, 400 at N=100).", "", *budget_lines(budgets), ""]
  lines += ["## Every row", "",
            "| claim | paper | we ran | round | A − B, points | going | verdict | sides: "
            "accuracy, floor (guess, commonest) |",
            "|---|---|---|---:|---:|---|---|---|"]
  figures = []
  for c, found in rows:
    fig = figure_for(c, runs_by_sweep, figures_dir) if found else None
    name = f"[{c.id}](#{plots_anchor(c.id)})" if fig else c.id
    paper = c.paper + ("" if c.paper_points is None else f" ({c.paper_points:+.2f})")
    what = (f"{c.a.method}, {c.ran}" if c.test in ("gates", "fidelity")
            else f"{c.a.method} − {c.b.method}, {c.ran}")
    if not found:
      lines.append(f"| {c.id} | {paper} | {what} | – | {PENDING} | – | pending | – |")
      continue
    for i, r in enumerate(found):
      lines.append(f"| {name if i == 0 else ''} | {paper if i == 0 else ''} | "
                   f"{what if i == 0 else ''} | {r.round} | {_cell(r, c)} | {_trend(r)} | "
                   f"{r.verdict} | {sides_text(c, r)} |")
    if fig:
      figures.append((c, os.path.relpath(fig, page_dir),
                      window_lines(found) + ([failed_text[c.id]] if c.id in failed_text
                                             else [])))
  lines += ["", LEGEND, ""]
  floored = uninformative_lines(rows)
  if floored:
    lines += [f"## Rows at their floor ({UNINFORMATIVE})", "",
              "Each side of every row read uninformative, against its floor; a side at "
              "or within one standard error of it did not learn, and the row has no "
              "verdict.", "", *floored, ""]
  if readings:
    table, none = reading_lines(rows, readings, reading_names)
    lines += ["## Against each reading of FedProto", "",
              "Each claim against FedProto's inference readings at the N=100 cut; the "
              f"papers' reading: {papers_reading}. The last column gives the verdict "
              "against every reading that is informative.", "", *table, ""]
    if none:
      lines += [f"Every reading run of FedProto is {UNINFORMATIVE} for "
                + ", ".join(none) + ".", ""]
  flips = flip_lines(rows)
  if flips:
    lines += ["## Verdicts that change with the budget", "", *flips, ""]
  windows = window_table(rows)
  if windows:
    lines += ["## Verdicts that change read over the last third", "",
              "Read as the mean difference over the last third of the rounds rather than "
              "at the round read.", "", *windows, ""]
  moving = moving_lines(rows)
  if moving:
    lines += ["## Rows still moving", "",
              "The slope of the per-round difference over the last third of the rounds "
              "read, beyond two standard errors, at the last round read.", "", *moving, ""]
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
