r"""The claims ledger's rows: the papers' claims, each with the groups of runs that test it.

  python experiments/claims_page.py --results=results --out=docs/claims.md

A ledger (``experiments/claims/ledger.py``) is a list of ``Claim``: the paper's
statement and number, the setting we ran, and two groups of runs (``Group``: a sweep
directory under ``--results``, a method and a setting, and optionally cells of other
sweeps holding the same runs at more seeds) compared seed by seed, at the
same partition, at one or more rounds (``Claim.rounds``). Groups of different sweeps
pair when their runs share the seed and the partition (the claims sweeps hold the same
public set out of every pool); a comparison read at several budgets (T and 3 T) is one
row per budget with a shared ``Claim.headline``.

A claim's difference is the mean over seeds of the per-seed difference, with its standard
error; ``verdicts`` decides its verdict, ``claim_runs`` reads the runs and
``claims_page`` writes the page.

Tests: ``'paired'`` (A minus B in accuracy points, protocol (a)), ``'clients'`` (the
share of clients on which A beats B at the run's final round, minus 50%, in points: the
papers' "76% of clients") and ``'target'`` (what A saves against B to first reach
``Claim.target`` mean test accuracy, in % of B's cost, per seed: rounds, communication =
the parameters sent both ways until then, or computation = those rounds times the
round's FLOPs from the sweep's ``costs.json``, as the papers count them; a seed in which
either never reaches the target leaves the claim without a verdict) and ``'gates'``
(FedMoE's gate weights on the test samples, from ``gates.json`` beside a run,
``gates.write_gates``: how much more of their variance the clients explain
(``measure='clients'``), or within each client its classes (``'classes'``), than chance
would, in points; a one-sided claim that they differ) and ``'fidelity'`` (Moss: the
Spearman rank correlation, per seed, between each client's final test accuracy and the
FILE fidelity of its device type at the final round, ``fidelity_correlation``).
"""
from __future__ import annotations

import dataclasses

TESTS = ("paired", "clients", "target", "gates", "fidelity")
MEASURES = {"target": ("rounds", "communication", "computation"),
            "gates": ("clients", "classes")}


@dataclasses.dataclass(frozen=True)
class Group:
  """Runs of one method in one setting of one sweep (``sweep``: its directory under the
  ledger's results root), joined by the runs of the groups in ``more``: the same runs
  (same config but the seed) that other sweeps made at further seeds, so that a claim
  can read 5 seeds where the first sweep ran 3."""
  sweep: str
  method: str
  setting: str
  more: tuple = ()

  def __post_init__(self):
    if any(not isinstance(g, Group) or g.more for g in self.more):
      raise ValueError(f"{self.method} ({self.sweep}: {self.setting}): 'more' takes "
                       "groups without a 'more' of their own")

  @property
  def cells(self) -> tuple:
    """``(sweep, method, setting)`` of every cell the group reads, its own first."""
    return tuple((g.sweep, g.method, g.setting) for g in (self, *self.more))

  @property
  def sweeps(self) -> tuple:
    """Every sweep directory the group reads, its own first."""
    return tuple(dict.fromkeys(sweep for sweep, _, _ in self.cells))

  def __str__(self) -> str:
    more = "".join(f" + {g.sweep}" + (f" ({g.setting})" if g.setting != self.setting else "")
                   for g in self.more)
    return f"{self.method} ({self.sweep}{more}: {self.setting})"


@dataclasses.dataclass(frozen=True)
class Claim:
  """One row of the ledger.

  Attributes:
    id: short name (``'P1 8/10'``); also the figure's file name.
    paper: the paper's statement, with where it is (table, figure, section).
    paper_points: the paper's difference in points; its sign is the claim's direction.
      None for a claim without a number (then ``direction`` gives the sign).
    ran: the setting we ran and how it is cut from the paper's.
    a, b: the groups compared (A minus B).
    rounds: the rounds read (the last of them no later than the runs' last round).
    sweep_files: the sweep files that make the runs (commands on the page).
    test: ``'paired'``, ``'clients'`` or ``'target'`` (module docstring).
    direction: +1 or -1, the claim's sign when ``paper_points`` is None; 0 for a claim
      of no difference (robustness): ``reproduced`` when within two standard errors of
      zero, else ``differs``.
    headline: the name shared by one comparison's rows at several budgets (the page
      says where their verdicts differ), or "".
    target: a ``'target'`` claim's accuracy (a fraction in (0, 1]).
    measure: a ``'target'`` claim's cost, or what a ``'gates'`` claim's weights differ
      across (``MEASURES``).
    floor: an accuracy (a fraction in [0, 1)) every side of the row must end above for
      a verdict, where it is higher than the side's own floor (``verdicts``: per client
      the better of guessing from its label shares and always answering its commonest
      class, on its test set); None: that floor alone.
  """
  id: str
  paper: str
  paper_points: float | None
  ran: str
  a: Group
  b: Group
  rounds: tuple
  sweep_files: tuple
  test: str = "paired"
  direction: int = 1
  headline: str = ""
  target: float | None = None
  measure: str = ""
  floor: float | None = None

  def __post_init__(self):
    if self.floor is not None and not 0 <= self.floor < 1:
      raise ValueError(f"claim {self.id}: floor must be a fraction in [0, 1); "
                       f"got {self.floor!r}")
    if self.test not in TESTS:
      raise ValueError(f"claim {self.id}: test={self.test!r} is not one of {TESTS}")
    if self.test == "target":
      if self.target is None or not 0 < self.target <= 1:
        raise ValueError(f"claim {self.id}: a 'target' claim needs target in (0, 1]; "
                         f"got {self.target!r}")
    if self.test in MEASURES and self.measure not in MEASURES[self.test]:
      raise ValueError(f"claim {self.id}: measure={self.measure!r} is not one of "
                       f"{MEASURES[self.test]}")
    if not self.rounds:
      raise ValueError(f"claim {self.id}: no rounds to read")
