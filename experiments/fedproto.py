r"""FedProto (Tan et al., AAAI 2022) on model-heterogeneous CNN-1..5, CIFAR-10 2/10.

Clients send per-class mean representations (500-d prototypes); the local loss adds
lamda * MSE(rep, global prototype of the label); inference by nearest global prototype.

  python experiments/main.py --config=experiments/fedproto.py --workdir=runs/fedproto
  python experiments/main.py --config=experiments/fedproto.py:smoke --workdir=/tmp/fedproto
  # the client's own header instead of the nearest prototype:
  python experiments/main.py --config=experiments/fedproto.py --workdir=runs/fedproto_hd \
      --config.algo.inference=header
  # the reference implementations' choices (experiments/claims/fedproto_reference.py):
  python experiments/main.py --config=experiments/fedproto.py --workdir=runs/fedproto_ref \
      --config.algo.prototype_classes=own --config.algo.prototype_weighting=clients \
      --config.algo.prototypes_from=during_training --config.algo.prototype_memory=False

Results (command, seed, rounds): docs/results.md.
"""
from fedjax_het.config import apply_variant
from fedjax_het.config import base_config


def get_config(arg=None):
  c = base_config()
  c.algorithm = "fedproto"
  c.models = "heterogeneous"
  c.batch_size = 64
  c.learning_rate = 0.01
  c.algo.lamda = 1.0
  c.algo.inference = "prototype"
  c.algo.prototype_memory = True  # False: HtFLlib's (docs/fidelity.md)
  # the reference codes' choices (docs/fidelity.md): 'own', 'clients', 'during_training'
  c.algo.prototype_classes = "all"
  c.algo.prototype_weighting = "counts"
  c.algo.prototypes_from = "after_training"
  return apply_variant(c, arg)
