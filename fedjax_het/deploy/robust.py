"""A deployment's defences against poisoned uploads and failing clients (server side).

Each of them is a run-config key of the Flower App (``settings.ServerSettings``):

- **Norm bound** (``upload-norm-bound`` B > 0, ``upload-norm-action`` ``reject`` or
  ``clip``): an upload whose L2 norm (over all its floating-point values) exceeds B
  times the round's reference norm, the lower median of the norms of the uploads that
  passed every other check (for n uploads, the ``(n - 1) // 2``-th smallest, so one
  outlier among two cannot raise it), is rejected, or scaled down to B times it.
  Fewer than two uploads: no reference, nothing is bounded.
- **Robust aggregation** (``aggregation`` ``mean``, ``median`` or ``trimmed-mean``,
  ``trim-fraction`` f): for the algorithms whose server averages one parameter set
  over every client (``AVERAGING``), the coordinate-wise median, or the mean of each
  coordinate without its ``floor(f n)`` smallest and largest values, of all the uploads
  replaces every upload before the algorithm's own ``aggregate`` runs: a weighted mean
  of equal rows is that row, so the server's state becomes the robust statistic
  (unweighted: robust rules ignore example counts). Other algorithms (FD and FedProto
  average per-class tables by class counts, FedKD sends SVD factors, Moss maps type
  models through proxies) are refused any rule but ``mean``.
- **Bench** (``bench-after`` k, ``bench-rounds`` m): a client whose upload is rejected
  (not merely missing) k rounds running is not drawn for the next m rounds; the server
  logs both.

``robust_mean`` and ``norm_bound`` are plain numpy functions of lists of arrays.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

AGGREGATIONS = ("mean", "median", "trimmed-mean")
NORM_ACTIONS = ("reject", "clip")
# the algorithms whose Protocol.aggregate is the (weighted) average of one parameter
# set uploaded alike by every group (shared.weighted_average, cl.weighted_mean)
AVERAGING = frozenset({"fedavg", "fedmrl", "fedmoe", "lg_fedavg", "fml", "fedapen"})


def check_rule(aggregation: str, algorithm: str) -> None:
  """Raises ValueError unless ``aggregation`` applies to ``algorithm``."""
  if aggregation not in AGGREGATIONS:
    raise ValueError(f"aggregation={aggregation!r}; valid: {list(AGGREGATIONS)}")
  if aggregation != "mean" and algorithm not in AVERAGING:
    raise ValueError(f"aggregation={aggregation!r} applies to the algorithms whose server "
                     f"averages parameters, {sorted(AVERAGING)}; {algorithm!r} takes "
                     "only 'mean'")


def upload_norm(arrays: Sequence[np.ndarray]) -> float:
  """L2 norm of all floating-point values of an upload (float64 sums: no overflow)."""
  total = 0.0
  for a in arrays:
    a = np.asarray(a)
    if np.issubdtype(a.dtype, np.inexact):
      total += float(np.sum(np.square(a, dtype=np.float64)))
  return float(np.sqrt(total))


def reference_norm(norms: Sequence[float]) -> float | None:
  """The lower median of ``norms``; None for fewer than two."""
  if len(norms) < 2:
    return None
  return float(sorted(norms)[(len(norms) - 1) // 2])


def norm_bound(uploads: dict[int, list[np.ndarray]], bound: float, action: str
               ) -> tuple[dict[int, list[np.ndarray]], dict[int, str]]:
  """Applies the norm bound to ``{client: arrays}``.

  Returns:
    (the uploads kept, clipped where ``action == 'clip'``; {client: why} of those
    rejected or clipped).

  >>> kept, why = norm_bound({0: [np.ones(4)], 1: [np.ones(4)], 2: [np.full(4, 1e30)]},
  ...                        10.0, "reject")
  >>> sorted(kept), why[2]
  ([0, 1], 'upload norm 2e+30 exceeds upload-norm-bound 10 x the round's reference 2')
  """
  if action not in NORM_ACTIONS:
    raise ValueError(f"upload-norm-action={action!r}; valid: {list(NORM_ACTIONS)}")
  norms = {c: upload_norm(a) for c, a in uploads.items()}
  ref = reference_norm([norms[c] for c in sorted(norms)])
  if not bound > 0 or ref is None:
    return dict(uploads), {}
  kept, notes = {}, {}
  for c in sorted(uploads):
    if norms[c] <= bound * ref:
      kept[c] = uploads[c]
      continue
    why = (f"upload norm {norms[c]:.3g} exceeds upload-norm-bound {bound:g} x the round's "
           f"reference {ref:.3g}")
    notes[c] = why
    if action == "clip":
      scale = bound * ref / norms[c]
      kept[c] = [(np.asarray(a) * scale).astype(np.asarray(a).dtype)
                 if np.issubdtype(np.asarray(a).dtype, np.inexact) else a
                 for a in uploads[c]]
  return kept, notes


def robust_mean(rows: Sequence[np.ndarray], aggregation: str,
                trim_fraction: float = 0.0) -> np.ndarray:
  """Coordinate-wise robust statistic of ``rows`` (same shape each) over the rows.

  >>> robust_mean([np.array([1., 10.]), np.array([2., 20.]), np.array([100., 0.])],
  ...             "median")
  array([ 2., 10.])
  >>> robust_mean([np.array([1.]), np.array([2.]), np.array([3.]), np.array([1e9])],
  ...             "trimmed-mean", 0.25)
  array([2.5])
  """
  stacked = np.stack([np.asarray(r) for r in rows])
  dtype = stacked.dtype
  if not np.issubdtype(dtype, np.inexact) or aggregation == "mean":
    return np.mean(stacked, axis=0).astype(dtype) if np.issubdtype(dtype, np.inexact) \
        else stacked[0]
  if aggregation == "median":
    return np.median(stacked.astype(np.float64), axis=0).astype(dtype)
  if aggregation == "trimmed-mean":
    n = len(rows)
    k = int(np.floor(trim_fraction * n))
    k = min(k, (n - 1) // 2)  # at least one row stays
    ordered = np.sort(stacked.astype(np.float64), axis=0)
    return np.mean(ordered[k:n - k], axis=0).astype(dtype)
  raise ValueError(f"aggregation={aggregation!r}; valid: {list(AGGREGATIONS)}")


def robust_uploads(uploads: dict[int, list[np.ndarray]], aggregation: str,
                   trim_fraction: float = 0.0) -> dict[int, list[np.ndarray]]:
  """Every upload replaced by the coordinate-wise robust statistic of all of them (for
  ``AVERAGING`` algorithms: their weighted mean of equal rows is that statistic);
  ``mean`` returns them unchanged."""
  if aggregation == "mean" or not uploads:
    return uploads
  ids = sorted(uploads)
  combined = [robust_mean([uploads[c][k] for c in ids], aggregation, trim_fraction)
              for k in range(len(uploads[ids[0]]))]
  return {c: [a.copy() for a in combined] for c in ids}


class Bench:
  """Which clients sit out rounds after rejected uploads (``bench-after`` k rejected
  rounds running: not drawn for ``bench-rounds`` m rounds; k = 0: never)."""

  def __init__(self, after: int, rounds: int):
    self.after, self.rounds = after, rounds
    self.streak: dict[int, int] = {}  # client -> rejected rounds running
    self.until: dict[int, int] = {}  # client -> last round it sits out

  def benched(self, round_: int) -> list[int]:
    """Clients not drawn in ``round_``."""
    return sorted(c for c, last in self.until.items() if round_ <= last)

  def record(self, round_: int, rejected: Sequence[int], accepted: Sequence[int]
             ) -> dict[int, int]:
    """Updates the streaks after ``round_``; returns {client: last round benched} of the
    clients benched now."""
    for c in accepted:
      self.streak.pop(c, None)
    now = {}
    for c in rejected:
      self.streak[c] = self.streak.get(c, 0) + 1
      if self.after and self.streak[c] >= self.after and self.rounds:
        self.until[c] = now[c] = round_ + self.rounds
        self.streak[c] = 0
    return now
