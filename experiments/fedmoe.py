r"""FedMoE (pFedMoE, Yi et al., arXiv 2402.01350) on model-heterogeneous CNN-1..5, CIFAR-10.

Paper setting: N=10 clients, C=100%, pathological non-IID (2 of 10 classes per client),
client k runs CNN-((k mod 5)+1); the global expert is CNN-5's extractor (500-d); gating
network hidden width m; SGD with a separate gating learning rate.

  python experiments/main.py --config=experiments/fedmoe.py --workdir=runs/fedmoe
  python experiments/main.py --config=experiments/fedmoe.py:smoke --workdir=/tmp/fedmoe

Results (command, seed, rounds, figure): docs/results.md.
"""
from fedjax_het.config import apply_variant
from fedjax_het.config import base_config


def get_config(arg=None):
  c = base_config()
  c.algorithm = "fedmoe"
  c.models = "heterogeneous"
  c.batch_size = 64
  c.learning_rate = 0.01
  c.algo.gating_learning_rate = 0.01
  c.algo.gating_hidden = 64
  c.algo.global_arch = "cnn5"
  return apply_variant(c, arg)
