r"""Moss S1-S3: fidelity-guided aggregation (FILE) against plain averaging of the proxies
(``algo.aggregation='uniform'``, Sec. 4.8.3), the weight mapping WIRE against its
ablation (``algo.mapping='naive'``), a public set of 25% of the ledger's 200
examples (S3) and one from another domain (S4: ``algo.public_domain='synthetic'``, smooth
random colour fields). The ledger's cut (``protocol.py``, T = ``ROUNDS`` there).

  python experiments/sweep.py --sweep=experiments/claims/moss_ablations.py \
      --sweep_dir=results/claims/moss_ablations --seed_batch=3 --budget_min=45

Cost: 15 runs, 0.17 PFLOP, 5h39m of the 2-core CPU by `sweep.py`'s plan; measured there: a
WIRE run 14 min (8 s a round; 3 seeds on the replica axis no faster), the naive mapping's
3 seeds 15 min. One H200: a WIRE cell of 3 seeds compiles in 99 s, 0.31 s a round.
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
