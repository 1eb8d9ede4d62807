r"""FedMRL (Yi et al., NeurIPS 2024) on model-heterogeneous CNN-1..5, CIFAR-10 2/10.

Paper setting: N=10 clients, C=100%, pathological non-IID (2 of 10 classes per client),
client k runs CNN-((k mod 5)+1), shared small model CNN-5-sized with d1=100, SGD.

  python experiments/main.py --config=experiments/fedmrl.py --workdir=runs/fedmrl
  python experiments/main.py --config=experiments/fedmrl.py:smoke --workdir=/tmp/fedmrl
  # ablation without Matryoshka nesting:
  python experiments/main.py --config=experiments/fedmrl.py --workdir=runs/fedmrl_nomrl \
      --config.algo.use_mrl=False

Results (command, seed, rounds, figure): docs/results.md.
"""
from fedjax_het.config import apply_variant
from fedjax_het.config import base_config


def get_config(arg=None):
  c = base_config()
  c.algorithm = "fedmrl"
  c.models = "heterogeneous"
  c.batch_size = 64
  c.learning_rate = 0.01
  c.algo.d1 = 100
  c.algo.small_arch = "cnn5"
  c.algo.m_lc = 1.0
  c.algo.m_hf = 1.0
  c.algo.use_mrl = True
  c.algo.inference = "mix-large"
  c.algo.aggregation = "paper"  # or "last_client", the authors' code (docs/fidelity.md)
  return apply_variant(c, arg)
