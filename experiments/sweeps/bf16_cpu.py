r"""bf16 compute against float32 on CPU: the ``:cpu`` runs of FedMRL and FedMoE both ways.

Cut: the ``:cpu`` variant (N=10, C=100 %, the first 6000 pooled CIFAR-10 examples, 20
rounds of one epoch, SGD momentum 0.9), three seeds, evaluation every 5 rounds; the two
settings differ only in ``runtime.compute_dtype``. Why and how it is read:
docs/results_howto.md; the result: docs/performance.md.

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
