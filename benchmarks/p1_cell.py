r"""The claims ledger's P1 cell (N=100, C=10 %, 2 of 10 classes, CNN-1..5) for the four
methods of docs/performance.md's program-size table, as a sweep file for
``compile_time.py``:

  python benchmarks/compile_time.py --sweep=benchmarks/p1_cell.py --algorithm=fedmoe

``experiments/claims/p1_classes.py`` has FedMoE's and FedMRL's rows of the same cell
(same configs); Standalone and Moss are not rows of it.
"""
import os

from fedjax_het import config_files

protocol = config_files.load_module(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "..", "experiments", "claims", "protocol.py"))


def get_config(arg=None):
  return protocol.sweep(["standalone", "fedmrl", "fedmoe", "moss"],
                        {"2 classes": {"partition.classes_per_client": 2}}, arg=arg)
