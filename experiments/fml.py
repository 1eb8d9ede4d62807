r"""FML (Shen et al. 2020) on model-heterogeneous CNN-1..5, CIFAR-10 2/10.

Setting as FedMRL's comparison: N=10 clients, C=100%, pathological non-IID (2 of 10
classes per client), client k runs CNN-((k mod 5)+1) as its private model, the shared
meme model is CNN-5 (representation width 500), SGD; alpha = beta = 0.5.

  python experiments/main.py --config=experiments/fml.py --workdir=runs/fml
  python experiments/main.py --config=experiments/fml.py:smoke --workdir=/tmp/fml_smoke

Results (command, seed, rounds, figure): docs/results.md.
"""
from fedjax_het.config import apply_variant
from fedjax_het.config import base_config


def get_config(arg=None):
  c = base_config()
  c.algorithm = "fml"
  c.models = "heterogeneous"
  c.batch_size = 64
  c.learning_rate = 0.01
  c.algo.alpha = 0.5
  c.algo.beta = 0.5
  c.algo.small_arch = "cnn5"
  c.algo.rep_dim = 500
  c.algo.evaluate = "private"  # or "shared" (docs/fidelity.md)
  c.algo.kl_reduction = "batchmean"  # or "mean" (KL averaged over classes)
  return apply_variant(c, arg)
