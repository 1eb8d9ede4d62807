r"""FedKD (Wu et al. 2022) on model-heterogeneous CNN-1..5, CIFAR-10 2/10.

N=10 clients, C=100%, pathological non-IID (2 of 10 classes per client), client k's
mentor is CNN-((k mod 5)+1), the shared mentee is CNN-5 (representation width 500), SGD.
Updates are SVD-compressed with the energy annealed 0.95 -> 0.98 over the rounds, as
the paper; ``--config.algo.svd_energy_start=0`` sends them uncompressed.

  python experiments/main.py --config=experiments/fedkd.py --workdir=runs/fedkd
  python experiments/main.py --config=experiments/fedkd.py:smoke --workdir=/tmp/fedkd_smoke
  python experiments/main.py --config=experiments/fedkd.py --workdir=runs/fedkd_plain \
      --config.algo.svd_energy_start=0

Results (command, seed, rounds, figure): docs/results.md.
"""
from fedjax_het.config import apply_variant
from fedjax_het.config import base_config


def get_config(arg=None):
  c = base_config()
  c.algorithm = "fedkd"
  c.models = "heterogeneous"
  c.batch_size = 64
  c.learning_rate = 0.01
  c.algo.small_arch = "cnn5"
  c.algo.rep_dim = 500
  c.algo.svd_energy_start = 0.95
  c.algo.svd_energy_end = 0.98
  c.algo.evaluate = "private"  # or "shared" (docs/fidelity.md)
  c.algo.kl_reduction = "batchmean"  # or "mean" (KL averaged over classes)
  return apply_variant(c, arg)
