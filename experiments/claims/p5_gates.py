r"""pFedMoE P5 (Figs. 9-10) at N = 100: the gates of P1's FedMoE 2/10 cell, rerun (same
configs, seeds, partitions) keeping final checkpoints for ``claims_page.py``'s
``gates.json`` (p1_classes.py's runs no longer hold them; checkpoints not committed).
Another build of the program rounds floats otherwise (P1's seed 0 rerun: train loss
differs in the 7th digit at round 3), so the gates are read from these runs, not P1's.

  python experiments/sweep.py --sweep=experiments/claims/p5_gates.py \
      --sweep_dir=results/claims/p5_gates --keep_checkpoints=last --budget_min=60

Cost: 3 runs, about 16 min each on the 2-core CPU.
"""
import os

from fedjax_het import config_files

HERE = os.path.dirname(os.path.abspath(__file__))
protocol = config_files.load_module(os.path.join(HERE, "protocol.py"))
p1_classes = config_files.load_module(os.path.join(HERE, "p1_classes.py"))


def get_config(arg=None):
  name, _ = protocol.dataset(arg)
  k = p1_classes.CLASSES[name][0]
  return protocol.sweep(["fedmoe"], {f"{k} classes": {"partition.classes_per_client": k}},
                        arg=arg)
