r"""bf16 compute against float32 on CPU: the ``:cpu`` runs of FedMRL and FedMoE both ways.

``runtime.compute_dtype='bfloat16'``: activations and matmul/conv inputs in bf16, the
parameters, optimizer state, loss and softmax in float32 (``docs/performance.md``). The
issue's check: a short run's accuracy within 1 point of float32's. The ``:cpu`` variant:
N=10, C=100 %, the first 6000 pooled CIFAR-10 examples, 20 rounds of one epoch, SGD
momentum 0.9; three seeds (one 20-round run's accuracy moves by a few points from one
evaluation to the next, so a single pair cannot resolve 1 point). XLA:CPU has no fast
bf16 convolutions, so the bf16 runs are slower here; on a GPU bf16 is about speed. Three
seeds left FedMRL unsettled: ``bf16_fedmrl_cpu.py`` runs it over ten.

  python experiments/sweep.py --sweep=experiments/sweeps/bf16_cpu.py \
      --sweep_dir=results/bf16_cpu --seed_batch=2
"""
import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.algorithms = ["fedmrl", "fedmoe"]
  c.variant = "cpu"
  c.settings = ml_collections.ConfigDict({
      "float32": {"runtime.compute_dtype": "float32"},
      "bfloat16": {"runtime.compute_dtype": "bfloat16"},
  }, allow_dotted_keys=True, sort_keys=False)
  c.seeds = (0, 1, 2)
  c.base_overrides = ml_collections.ConfigDict({}, allow_dotted_keys=True)
  c.algorithm_overrides = ml_collections.ConfigDict({}, allow_dotted_keys=True)
  return c
