r"""Seeds 3 and 4 of ``fedproto_inference.py``'s 2/10 cell (FedProto predicting with the
client's own header; same configs), for M5 2/10 against it, which 3 seeds left within
two standard errors of zero. The ledger's FedMRL side reads ``m2_m3_fedmrl.py``'s
d1 = 500 runs (P1's FedMRL 2/10 config) at seeds 3-4 (``ledger.MORE_SEEDS``).

  python experiments/sweep.py --sweep=experiments/claims/header_seeds.py \
      --sweep_dir=results/claims/header_seeds --budget_min=30

Cost: 2 runs; fedproto_inference.py's 2/10 runs took 8m24s-8m46s each on the quiet
2-core CPU.
"""
import os

from fedjax_het import config_files

HERE = os.path.dirname(os.path.abspath(__file__))
fedproto_inference = config_files.load_module(os.path.join(HERE, "fedproto_inference.py"))
SEEDS = (3, 4)


def get_config(arg=None):
  c = fedproto_inference.get_config(arg)
  first = next(iter(c.settings.keys()))
  c.settings = type(c.settings)({first: c.settings[first].to_dict()},
                                allow_dotted_keys=True, sort_keys=False)
  c.seeds = SEEDS
  return c
