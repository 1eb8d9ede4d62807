"""Grids of runs and their reports, as library code research scripts can import.

- ``plan``: a sweep's grid (algorithms x settings x seeds) as runs, and which finished;
- ``runner``: a sweep run or resumed, and tabulated (``results.csv``, ``results.md``);
  ``experiments/sweep.py`` is its command;
- ``tables``: the CSV rows and Markdown tables of a sweep's results;
- ``eta``: the sweep's ETA, projected from the training loop's progress callback;
- ``budget`` and ``campaign``: FLOPs and time before a sweep starts; the campaign
  (``benchmarks/campaign.py``).
- ``plots``: a directory of runs' figures per setting and run, TensorBoard logs and
  ``plots.json`` (needs the ``plots`` extra, matplotlib and tensorboardX);
  ``experiments/plots.py``. ``figures`` draws the figures, ``tensorboard_logs`` writes
  and reads the logs, ``gates`` restores FedMoE's gate weights from a checkpoint and
  keeps them in ``gates.json``.
- ``results_page``: ``docs/results.md`` from a sweep and its figures;
  ``experiments/results_page.py``.
- ``paired``: seed-matched differences between a sweep's methods or settings, at the
  end and at every evaluated round; ``paired_report`` writes them as Markdown with the
  trend over the last third of the run (``experiments/paired.py``).
- ``stats``: the statistics these share (mean and standard error, trend, Spearman, eta
  squared), functions of arrays.
- the claims ledger, the papers' claims judged on committed runs (``docs/claims.md``;
  rows in ``experiments/claims/ledger.py``, command ``experiments/claims_page.py``):
  ``claims`` its rows (``Claim``, ``Group``), ``claim_runs`` the runs a claim reads and
  their per-seed values, ``verdicts`` the verdict at each round read, ``claims_page``
  the page and its figures.
- ``rundirs``: reading run directories (metrics, summary, place in the grid), shared by
  the figures, the comparisons and the ledger.

Nothing is imported here, so ``fedjax_het.sweeps.runner`` works without matplotlib.
"""
