r"""FedAPEN (Qin et al., KDD 2023) on model-heterogeneous CNN-1..5, CIFAR-10 2/10.

N=10 clients, C=100%, pathological non-IID (2 of 10 classes per client), client k's
private model is CNN-((k mod 5)+1), the shared model is CNN-5 (representation width
500), SGD; lambda is learned each round on the last 10% of each client's train data.

  python experiments/main.py --config=experiments/fedapen.py --workdir=runs/fedapen
  python experiments/main.py --config=experiments/fedapen.py:smoke --workdir=/tmp/fedapen_smoke

Results (command, seed, rounds, figure): docs/results.md.
"""
from fedjax_het.config import apply_variant
from fedjax_het.config import base_config


def get_config(arg=None):
  c = base_config()
  c.algorithm = "fedapen"
  c.models = "heterogeneous"
  c.batch_size = 64
  c.learning_rate = 0.01
  c.algo.small_arch = "cnn5"
  c.algo.rep_dim = 500
  c.algo.holdout_fraction = 0.1
  c.algo.lambda_steps = 1
  c.algo.lambda_learning_rate = 1e-3
  return apply_variant(c, arg)
