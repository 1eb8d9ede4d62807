r"""Moss S1-S3: fidelity-guided aggregation (FILE) against plain averaging of the proxies
(``algo.aggregation='uniform'``, Sec. 4.8.3), the weight mapping WIRE against its
ablation (``algo.mapping='naive'``), a public set of 25% of the ledger's 200
examples (S3) and one from another domain (S4: ``algo.public_domain='synthetic'``, smooth
random colour fields). The ledger's cut (``protocol.py``, T = ``ROUNDS`` there).

  python experiments/sweep.py --sweep=experiments/claims/moss_ablations.py \
      --sweep_dir=results/claims/moss_ablations --seed_batch=3 --budget_min=45

Cost: 15 runs, 0.17 PFLOP, 5h39m of the 2-core CPU by `sweep.py`'s plan. Measured there
(2026-11-28, other work beside at times): a WIRE run 13m55s alone (8.0 s a round), three
seeds on the replica axis 42m35s (22.8 s a round: no faster than one after another); the
naive mapping's three seeds 14m59s (8.4 s a round: WIRE's meta-network is most of a
round). On one H200 a WIRE cell of three seeds compiles in 99 s and runs 0.31 s a round
(docs/performance.md).
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


def get_config(arg=None):
  return protocol.sweep(["moss"], {"FILE + WIRE": {}, **ABLATIONS}, arg=arg)
