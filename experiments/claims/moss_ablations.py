r"""Moss S1-S3: fidelity-guided aggregation (FILE) against plain averaging of the proxies
(``algo.aggregation='uniform'``, Sec. 4.8.3), the weight mapping WIRE against its
ablation (``algo.mapping='naive'``), a public set of 25% of the ledger's 200
examples (S3) and one from another domain (S4: ``algo.public_domain='synthetic'``, smooth
random colour fields). The ledger's cut (``protocol.py``, T = ``ROUNDS`` there). 5 seeds
(at 3, S1 was within two standard errors of zero); public 25%'s seed 3 fails at round
61 (WIRE diverges, docs/moss.md).

  python experiments/sweep.py --sweep=experiments/claims/moss_ablations.py \
      --sweep_dir=results/claims/moss_ablations --seed_batch=3 --budget_min=45

Cost: 25 runs, 7.6 h of the 2-core CPU as run (results.md; often beside test suites).
"""
import os

from fedjax_het import config_files

protocol = config_files.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol.py"))


# each against Moss as built (FILE + WIRE, 200 held-out CIFAR images as the public set)
ABLATIONS = {"uniform": {"algo.aggregation": "uniform"},
             "naive mapping": {"algo.mapping": "naive"},
             "public 25%": {"algo.public_size": 50},
             "synthetic public": {"algo.public_domain": "synthetic"}}


SEEDS = (0, 1, 2, 3, 4)


def get_config(arg=None):
  return protocol.sweep(["moss"], {"FILE + WIRE": {}, **ABLATIONS}, arg=arg, seeds=SEEDS)
