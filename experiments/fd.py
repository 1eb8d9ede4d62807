r"""FD (Jeong et al., 2018) on model-heterogeneous CNN-1..5, CIFAR-10 2/10.

Clients send per-class average logits; the local loss adds lamda * a distillation term
toward the global logit of the label (soft-target CE as HtFLlib; ``distill='mse'``).

  python experiments/main.py --config=experiments/fd.py --workdir=runs/fd
  python experiments/main.py --config=experiments/fd.py:smoke --workdir=/tmp/fd
  python experiments/main.py --config=experiments/fd.py --workdir=runs/fd_mse \
      --config.algo.distill=mse

Results (command, seed, rounds): docs/results.md.
"""
from fedjax_het.config import apply_variant
from fedjax_het.config import base_config


def get_config(arg=None):
  c = base_config()
  c.algorithm = "fd"
  c.models = "heterogeneous"
  c.batch_size = 64
  c.learning_rate = 0.01
  c.algo.lamda = 1.0
  c.algo.distill = "ce"
  return apply_variant(c, arg)
