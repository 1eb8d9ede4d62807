r"""FedMRL M2 (Fig. 6 left) and M3 (Fig. 6 right): the representation width d1 of the
shared small model in {100, 200, 300, 400, 500} (smaller d1: higher accuracy, lower
cost), and the Matryoshka heads on and off (``algo.use_mrl``) at each d1's ends.
The ledger's cut (``protocol.py``, T = ``ROUNDS`` there). 5 seeds: at 3, M2 at every
d1 and M3 at d1 = 500 stayed within two standard errors of zero.

  python experiments/sweep.py --sweep=experiments/claims/m2_m3_fedmrl.py \
      --sweep_dir=results/claims/m2_m3_fedmrl --seed_batch=3 --budget_min=45

Cost: 35 runs; seeds 0-2 (21) 0.45 PFLOP, 4h09m of the 2-core CPU by `sweep.py`'s plan;
seeds 3-4 2.5 h more (a pair 22-26 min on the replica axis; its memory: protocol.py).
"""
import os

from fedjax_het import config_files

protocol = config_files.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol.py"))

SEEDS = (0, 1, 2, 3, 4)


def get_config(arg=None):
  settings = {f"d1={d}": {"algo.d1": d} for d in (100, 200, 300, 400, 500)}
  settings.update({f"d1={d}, no MRL": {"algo.d1": d, "algo.use_mrl": False}
                   for d in (100, 500)})
  return protocol.sweep(["fedmrl"], settings, arg=arg, seeds=SEEDS)
