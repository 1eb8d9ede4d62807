r"""FedMRL's bf16 check on CPU with enough seeds to resolve one point.

Cut: ``bf16_cpu.py``'s ``:cpu`` FedMRL cell (N=10, C=100 %, 6000 pooled CIFAR-10
examples, 20 rounds of one epoch), both ways over ten seeds, both protocols evaluated
every round, so a run also reads as the mean of its last rounds (docs/results_howto.md).

  python experiments/sweep.py --sweep=experiments/sweeps/bf16_fedmrl_cpu.py \
      --sweep_dir=results/bf16_fedmrl_cpu --seed_batch=2
  python experiments/paired.py --sweep_dir=results/bf16_fedmrl_cpu \
      --baseline=float32 --per_seed
"""
import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.algorithms = ["fedmrl"]
  c.variant = "cpu"
  c.settings = ml_collections.ConfigDict({
      "float32": {"runtime.compute_dtype": "float32"},
      "bfloat16": {"runtime.compute_dtype": "bfloat16"},
  }, allow_dotted_keys=True, sort_keys=False)
  c.seeds = tuple(range(10))
  c.base_overrides = ml_collections.ConfigDict({"eval_every": 1},
                                               allow_dotted_keys=True)
  c.algorithm_overrides = ml_collections.ConfigDict({}, allow_dotted_keys=True)
  return c
