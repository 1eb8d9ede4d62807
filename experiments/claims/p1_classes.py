r"""pFedMoE P1 (Fig. 7) and FedMRL M5: accuracy as each client sees more classes.

pFedMoE: accuracy falls as classes per client rise {2, 4, 6, 8, 10} (CIFAR-10, N = 100,
C = 10%) and FedMoE stays above FedProto at each (+13.10 points at 8/10); FedMRL
(Sec. 5.3.1) stays above FedProto across class counts. The ledger's cut
(``protocol.py``, T = ``ROUNDS`` there); ``:cifar100`` runs the papers' {10, 30, 50, 70, 90, 100}
of 100 classes (not run on CPU).

  python experiments/sweep.py --sweep=experiments/claims/p1_classes.py \
      --sweep_dir=results/claims/p1_classes --seed_batch=3 --budget_min=60

Cost: 45 runs, 0.87 PFLOP, 8h52m of the 2-core CPU by `sweep.py`'s plan (6 copied, below).
"""
import os

from fedjax_het import config_files

protocol = config_files.load_module(
    os.path.join(os.path.dirname(os.path.abspath(__file__)), "protocol.py"))

# Six runs were made by other sweeps with the same configs, seeds and partitions and copied
# into results/claims/p1_classes (the sweep skips them as finished): FedMoE at 2/10 is
# p3_gating_lr.py's gating lr=0.01 cell, FedMRL at 2/10 m2_m3_fedmrl.py's d1=500 cell
# (paper_table.py's FedMRL d1). On the quiet 2-core machine a FedProto run took 11m37s.
CLASSES = {"cifar10": (2, 4, 6, 8, 10), "cifar100": (10, 30, 50, 70, 90, 100)}


def get_config(arg=None):
  name, _ = protocol.dataset(arg)
  return protocol.sweep(
      ["fedmoe", "fedproto", "fedmrl"],
      {f"{k} classes": {"partition.classes_per_client": k} for k in CLASSES[name]},
      arg=arg)
