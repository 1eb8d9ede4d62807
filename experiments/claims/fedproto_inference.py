r"""FedProto at the ledger's cut: its clients' own header against the nearest prototype.

FedProto's P1 runs predict by the nearest global prototype (our default) and end below
their clients' chance at the ledger's cut (docs/fidelity.md, "FedProto at the N=100
cut"). The same FedProto at each of P1's class counts predicting with the client's own
header (``algo.inference='header'``; the same training), paired by seed with P1's runs;
the ledger's cut (``protocol.py``, T = ``ROUNDS`` there).

  python experiments/sweep.py --sweep=experiments/claims/fedproto_inference.py \
      --sweep_dir=results/claims/fedproto_inference --seed_batch=3 --budget_min=60

Cost: 15 runs; at 2/10 8m24s-8m46s each on the quiet 2-core CPU.
"""
import os

from fedjax_het import config_files

HERE = os.path.dirname(os.path.abspath(__file__))
protocol = config_files.load_module(os.path.join(HERE, "protocol.py"))
p1_classes = config_files.load_module(os.path.join(HERE, "p1_classes.py"))


def get_config(arg=None):
  name, _ = protocol.dataset(arg)
  return protocol.sweep(
      ["fedproto"],
      {f"header inference, {k} classes": {"algo.inference": "header",
                                          "partition.classes_per_client": k}
       for k in p1_classes.CLASSES[name]},
      arg=arg)
