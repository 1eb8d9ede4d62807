"""Grids of runs and their reports, as library code research scripts can import.

- ``plan``: a sweep's grid (algorithms x settings x seeds) as runs, and which finished;
- ``runner``: a sweep run or resumed, and tabulated (``results.csv``, ``results.md``);
  ``experiments/sweep.py`` is its command;
- ``tables``: the CSV rows and Markdown tables of a sweep's results;
- ``eta``: the sweep's ETA, projected from the training loop's progress callback;
- ``budget`` and ``campaign``: FLOPs and time before a sweep starts; the campaign
  (``benchmarks/campaign.py``).
- ``plots``: figures and TensorBoard logs of run directories (needs the ``plots`` extra,
  matplotlib and tensorboardX); ``experiments/plots.py``.
- ``results_page``: ``docs/results.md`` from a sweep and its figures;
  ``experiments/results_page.py``.
- ``paired``: seed-matched differences between a sweep's methods or settings (mean and
  standard error), at the end and at every evaluated round with the trend over the
  last third of the run; ``experiments/paired.py``.
- ``claims``: the claims ledger, the papers' claims judged on committed runs
  (``docs/claims.md``); ``experiments/claims_page.py``, rows in
  ``experiments/claims/ledger.py``.
- ``rundirs``: reading run directories (metrics, summary, place in the grid), shared by
  ``plots`` and ``paired``.

Nothing is imported here, so ``fedjax_het.sweeps.runner`` works without matplotlib.
"""
