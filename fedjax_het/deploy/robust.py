"""A deployment's defences against poisoned uploads and failing clients (server side).

Each of them is a run-config key of the Flower App (``settings.ServerSettings``); the
defaults bound what one hostile client can do with nothing to tune:

- **Update bound** (``upload-norm-bound`` B, default ``DEFAULT_BOUND`` = 10;
  ``upload-norm-action`` ``clip`` (default) or ``reject``), ``bound_updates``: an
  upload's *update* u_k is its distance from what the client was sent (the payload,
  where the upload has the payload's leaves; else the upload itself, FedKD's update).
  First every coordinate is clipped: in each leaf, to B times the lower median over
  the round's uploads of their largest |u| in that leaf (one coordinate cannot carry
  the whole budget). Then the whole update: its L2 norm to B times the round's
  reference, the lower median of the uploads' root-mean-square updates (for n uploads
  the ``(n - 1) // 2``-th smallest, so one outlier among two cannot raise it), times
  the square root of its size. Fewer than two uploads: no reference, nothing bounded.
  An honest round is not touched (its updates are within a few times of each other);
  one client's clipped update moves the example-weighted mean by at most
  ``w_k / W x (B + 1) x M`` (M the round's largest honest update norm) from where the
  round would have gone with that client honest: ``influence_bound``.
- **Class tables** (FD's logits, FedProto's prototypes: uploads ``{'counts' [C],
  'means' [C, D]}``), ``bound_tables``: counts above the client's known examples of
  the class (from the server's partition; else its weight) are cut to them, and the
  rows it sent are clipped as above: every value to B times the lower median over
  clients of their largest |value|, every row's norm to B times the lower median over
  clients of their median row norm (always clipped, whatever ``upload-norm-action``).
- **Unbounded mean** only by asking for it: ``upload-norm-bound=0`` with
  ``aggregation=mean``; the run's first lines say so (``unbounded_warning``).
- **Robust aggregation** (``aggregation`` ``mean``, ``median`` or ``trimmed-mean``,
  ``trim-fraction`` f): for the algorithms whose server averages one parameter set
  over every client (``Spec.averages``), the coordinate-wise median, or the mean of each
  coordinate without its k smallest and largest values, of all the uploads replaces
  every upload before the algorithm's own ``aggregate`` runs: a weighted mean of equal
  rows is that row, so the server's state becomes the robust statistic (unweighted:
  robust rules ignore example counts). k = ``floor(f n)``, at least 1 with 3 or more
  uploads (``trim_count``); a run whose ``floor(f n)`` is 0 for the round's full draw is
  refused at start (``check_trim``). Other algorithms (FD and FedProto average
  per-class tables by class counts, FedKD sends SVD factors, Moss maps type models
  through proxies) are refused any rule but ``mean``.
- **Bench** (``bench-after`` k, ``bench-rounds`` m): a client whose upload is rejected
  (not merely missing) k rounds running is not drawn for the next m rounds; the server
  logs both.

``robust_mean``, ``bound_updates`` and ``bound_tables`` are plain numpy functions of
lists of arrays.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

AGGREGATIONS = ("mean", "median", "trimmed-mean")
NORM_ACTIONS = ("reject", "clip")
def averaging_algorithms() -> list[str]:
  """The built-in algorithms whose ``Spec.averages`` is true: their ``Protocol.aggregate``
  is the (weighted) average of one parameter set uploaded alike by every group."""
  from fedjax_het import algorithms  # noqa: PLC0415 - the checks below need no jax
  return sorted(name for name, spec in algorithms.SPECS.items() if spec.averages)


def check_rule(aggregation: str, algorithm: str) -> None:
  """Raises ValueError unless ``aggregation`` applies to ``algorithm``: 'mean' to every
  algorithm, the robust rules to those whose ``Spec.averages`` says so (built-in,
  registered or referenced as ``module:attribute``, as ``config.algorithm``)."""
  from fedjax_het import algorithms  # noqa: PLC0415
  if aggregation not in AGGREGATIONS:
    raise ValueError(f"aggregation={aggregation!r}; valid: {list(AGGREGATIONS)}")
  if aggregation != "mean" and not algorithms.averages(algorithm):
    raise ValueError(f"aggregation={aggregation!r} applies to the algorithms whose server "
                     f"averages parameters (Spec.averages: {averaging_algorithms()} built "
                     f"in); {algorithm!r} takes only 'mean'")


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


DEFAULT_BOUND = 10.0
# a server state holding a value beyond this is out of bound: never adopted or resumed
# (no model or table of this library comes within orders of magnitude of it)
STATE_BOUND = 1e10


def _inexact(a: np.ndarray) -> bool:
  return np.issubdtype(np.asarray(a).dtype, np.inexact)


def _same_leaves(upload: Sequence[np.ndarray], reference: Sequence[np.ndarray] | None
                 ) -> bool:
  return reference is not None and len(upload) == len(reference) and all(
      np.shape(u) == np.shape(r) and np.asarray(u).dtype == np.asarray(r).dtype
      for u, r in zip(upload, reference))


def updates_of(upload: Sequence[np.ndarray], reference: Sequence[np.ndarray] | None
               ) -> list[np.ndarray | None]:
  """The float64 update of every floating-point leaf (None for the others): the upload
  minus ``reference`` (what the client was sent) where it has the upload's leaves,
  else the upload itself."""
  ref = reference if _same_leaves(upload, reference) else None
  return [None if not _inexact(u) else
          np.asarray(u, np.float64) - (0.0 if ref is None else np.asarray(ref[k], np.float64))
          for k, u in enumerate(upload)]


def _signature(upload: Sequence[np.ndarray]) -> tuple:
  return tuple((np.shape(a), str(np.asarray(a).dtype)) for a in upload)


def bound_updates(uploads: dict[int, list[np.ndarray]],
                  references: dict[int, Sequence[np.ndarray] | None], bound: float,
                  action: str = "clip"
                  ) -> tuple[dict[int, list[np.ndarray]], dict[int, str], dict[int, float]]:
  """Bounds every upload's update (module docstring): coordinates, then the norm.

  Args:
    uploads: {client: arrays} that passed ``wire.read_upload``.
    references: {client: what it was sent (the payload), or None}.
    bound: B; 0 bounds nothing.
    action: over the norm bound, ``clip`` (scaled to it) or ``reject``.

  Returns:
    (the uploads kept, those clipped rebuilt as reference + clipped update and cast to
    their dtypes, the others unchanged; {client: why} of those clipped or rejected;
    {client: the L2 norm of its update as received}).

  >>> ups = {k: [np.full(4, v)] for k, v in enumerate([1., 2., 3., 1e30])}
  >>> kept, why, _ = bound_updates(ups, {}, 10.0)
  >>> kept[3][0], sorted(why)
  (array([20., 20., 20., 20.]), [3])
  """
  if action not in NORM_ACTIONS:
    raise ValueError(f"upload-norm-action={action!r}; valid: {list(NORM_ACTIONS)}")
  ids = sorted(uploads)
  deltas = {c: updates_of(uploads[c], references.get(c)) for c in ids}
  norms = {c: upload_norm([d for d in deltas[c] if d is not None]) for c in ids}
  if not bound > 0 or len(ids) < 2:
    return dict(uploads), {}, norms
  notes: dict[int, list[str]] = {c: [] for c in ids}
  # 1. every coordinate: B x the lower median (over uploads of the same leaves, else all
  #    of them) of each upload's largest |update| in that leaf
  peaks = {c: [None if d is None else float(np.max(np.abs(d), initial=0.0))
               for d in deltas[c]] for c in ids}
  overall = reference_norm([max([p for p in peaks[c] if p is not None], default=0.0)
                            for c in ids])
  sigs = {c: _signature(uploads[c]) for c in ids}
  for c in ids:
    alike = [o for o in ids if sigs[o] == sigs[c]]
    cut = []
    for k, d in enumerate(deltas[c]):
      if d is None:
        continue
      ref = reference_norm([peaks[o][k] for o in alike]) if len(alike) > 1 else overall
      if peaks[c][k] > bound * ref:
        deltas[c][k] = np.clip(d, -bound * ref, bound * ref)
        cut.append(k)
    if cut:
      notes[c].append(f"coordinates of {len(cut)} of {len(deltas[c])} arrays clipped to "
                      f"{bound:g} x the round's reference of their array (largest update "
                      f"{max(peaks[c][k] for k in cut):.3g})")
  # 2. the whole update: B x the lower median RMS update x sqrt(its size)
  size = {c: sum(d.size for d in deltas[c] if d is not None) for c in ids}
  clipped = {c: upload_norm([d for d in deltas[c] if d is not None]) for c in ids}
  rms = reference_norm([clipped[c] / np.sqrt(max(size[c], 1)) for c in ids])
  kept, why = {}, {}
  for c in ids:
    limit = bound * rms * np.sqrt(max(size[c], 1))
    if clipped[c] > limit:
      text = (f"update norm {clipped[c]:.3g} exceeds upload-norm-bound {bound:g} x the "
              f"round's reference {limit / bound:.3g}")
      if action == "reject":
        why[c] = text
        continue
      scale = limit / clipped[c]
      deltas[c] = [None if d is None else d * scale for d in deltas[c]]
      notes[c].append(text)
    kept[c] = uploads[c]
    if notes[c]:
      why[c] = "; ".join(notes[c])
      ref = references.get(c) if _same_leaves(uploads[c], references.get(c)) else None
      kept[c] = [a if d is None else
                 ((0.0 if ref is None else np.asarray(ref[k], np.float64)) + d
                  ).astype(np.asarray(a).dtype)
                 for k, (a, d) in enumerate(zip(uploads[c], deltas[c]))]
  return kept, why, norms


TABLE_KEYS = ("counts", "means")  # the leaves of a class-table upload, in order


def is_table(like) -> bool:
  """Whether an upload shaped ``like`` is a class table (FD, FedProto)."""
  return isinstance(like, dict) and tuple(sorted(like)) == TABLE_KEYS


def bound_tables(uploads: dict[int, list[np.ndarray]],
                 known: dict[int, np.ndarray | float | None], bound: float
                 ) -> tuple[dict[int, list[np.ndarray]], dict[int, str]]:
  """Bounds class-table uploads ``{client: [counts [C], means [C, D]]}``.

  Counts above ``known[client]`` (its examples per class, or its total) are cut to it;
  with ``bound`` B > 0 and two or more clients, the values of the rows it sent (count
  > 0) are clipped to B times the lower median over clients of their largest |value|,
  and each row's norm to B times the lower median over clients of their median row
  norm. Returns (the uploads, changed ones copied; {client: why} of those changed).

  >>> ups = {k: [np.array([2.], np.float32), np.full((1, 2), v, np.float32)]
  ...        for k, v in enumerate([1., 2., 3.])}
  >>> ups[3] = [np.array([1e20], np.float32), np.full((1, 2), 1e20, np.float32)]
  >>> kept, why = bound_tables(ups, {k: np.array([2.]) for k in range(4)}, 10.0)
  >>> kept[3][0], kept[3][1]
  (array([2.], dtype=float32), array([[20., 20.]], dtype=float32))
  """
  ids = sorted(uploads)
  out, notes = {}, {c: [] for c in ids}
  for c in ids:
    counts = np.asarray(uploads[c][0], np.float64)
    means = np.asarray(uploads[c][1], np.float64)
    cap = known.get(c)
    if cap is not None:
      total_only = np.ndim(cap) == 0
      cap = np.broadcast_to(np.asarray(cap, np.float64), counts.shape)
      over = counts > cap * (1 + 1e-6)
      if np.any(over):
        j = int(np.argmax(np.where(over, counts - cap, -np.inf)))
        notes[c].append(f"class counts cut to its known examples ({int(np.sum(over))} "
                        f"classes; class {j}: {counts[j]:.3g} claimed, {cap[j]:g} held)")
        counts = np.where(over, cap, counts)
      if total_only and np.sum(counts) > cap[0] * (1 + 1e-6):
        notes[c].append(f"class counts summing to {np.sum(counts):.3g} scaled to its "
                        f"{cap[0]:g} examples")
        counts = counts * (cap[0] / np.sum(counts))
    out[c] = [counts, means]
  sent = {c: out[c][0] > 0 for c in ids}
  if bound > 0 and len(ids) >= 2:
    peak = {c: float(np.max(np.abs(out[c][1][sent[c]]), initial=0.0)) for c in ids}
    ref = reference_norm([peak[c] for c in ids])
    for c in ids:
      if peak[c] > bound * ref:
        out[c][1] = np.clip(out[c][1], -bound * ref, bound * ref)
        notes[c].append(f"values up to {peak[c]:.3g} clipped to {bound:g} x the round's "
                        f"reference {ref:.3g}")
    rows = {c: np.sqrt(np.sum(np.square(out[c][1]), axis=-1)) for c in ids}
    typical = reference_norm([float(np.median(rows[c][sent[c]])) if np.any(sent[c])
                              else 0.0 for c in ids])
    for c in ids:
      over = sent[c] & (rows[c] > bound * typical)
      if np.any(over):
        scale = np.where(over, bound * typical / np.maximum(rows[c], 1e-300), 1.0)
        out[c][1] = out[c][1] * scale[:, None]
        notes[c].append(f"{int(np.sum(over))} rows of norm up to "
                        f"{float(np.max(rows[c][over])):.3g} clipped to {bound:g} x the "
                        f"round's reference {typical:.3g}")
  kept, why = {}, {}
  for c in ids:
    if notes[c]:
      why[c] = "; ".join(notes[c])
      kept[c] = [out[c][k].astype(np.asarray(uploads[c][k]).dtype) for k in range(2)]
    else:
      kept[c] = uploads[c]
  return kept, why


def influence_bound(weight: float, total_weight: float, bound: float,
                    largest_honest_norm: float) -> float:
  """How far one client's bounded update can move a round's example-weighted mean from
  where it would have gone had that client been honest: ``w / W x (B + 1) x M``.

  Its clipped update has norm at most B x the reference <= B x M (the lower median of
  the round's norms is at most the largest honest one), its honest update at most M.
  """
  return weight / total_weight * (bound + 1.0) * largest_honest_norm


def trim_count(n: int, trim_fraction: float) -> int:
  """Values cut at each end of a coordinate by ``trimmed-mean`` over n uploads:
  ``floor(f n)``, at least 1 when n >= 3, and at most ``(n - 1) // 2`` (one stays)."""
  k = int(np.floor(trim_fraction * n))
  if n >= 3:
    k = max(k, 1)
  return min(k, (n - 1) // 2)


def check_trim(aggregation: str, trim_fraction: float, uploads: int) -> None:
  """Raises ValueError (one line) when ``trimmed-mean`` would trim nothing from a round
  of ``uploads`` uploads by its fraction: ``floor(f n) = 0``."""
  if aggregation == "trimmed-mean" and int(np.floor(trim_fraction * uploads)) < 1:
    raise ValueError(
        f"aggregation=trimmed-mean with trim-fraction {trim_fraction:g} trims nothing "
        f"from a round of {uploads} uploads (floor({trim_fraction:g} x {uploads}) = 0); "
        f"set trim-fraction >= {1 / max(uploads, 1):.3g} or aggregation=median")


def unbounded_warning(aggregation: str, bound: float) -> str | None:
  """The line a run states first when nothing bounds one client's influence."""
  if aggregation == "mean" and not bound > 0:
    return ("server: WARNING: UNBOUNDED MEAN (aggregation=mean, upload-norm-bound=0): "
            "one client's upload moves the model as far as it likes; only for trusted "
            "clients")
  return None


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
    k = trim_count(n, trim_fraction)
    ordered = np.sort(stacked.astype(np.float64), axis=0)
    return np.mean(ordered[k:n - k], axis=0).astype(dtype)
  raise ValueError(f"aggregation={aggregation!r}; valid: {list(AGGREGATIONS)}")


def robust_uploads(uploads: dict[int, list[np.ndarray]], aggregation: str,
                   trim_fraction: float = 0.0) -> dict[int, list[np.ndarray]]:
  """Every upload replaced by the coordinate-wise robust statistic of all of them (for
  averaging algorithms (``Spec.averages``): their weighted mean of equal rows is that statistic);
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
