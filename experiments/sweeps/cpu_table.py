r"""A CPU-sized version of the papers' CIFAR-10 column (N=10, C=100%, pathological 2/10).

CPU ONLY: no GPU was lent to the session that ran it, so the papers' GPU reproduction
(issues 3-5: full CIFAR-10, 100+ rounds, paper_table.py) is still to be run. The runs
share 2 CPU cores with other jobs; their wall times are not speed figures.

Every model-heterogeneous method of the library on the same partition of the first 6000
pooled CIFAR-10 examples (clients run CNN-1..5), 10 rounds, one seed (about 15-25 min
per method on 2 busy CPU cores, so a session finishes only some of them). It is a regression check of the
whole pipeline on real data, not a reproduction of the papers' numbers (those need
the full 60000 examples and the papers' round counts: ``paper_table.py`` on a GPU).

  python experiments/sweep.py --sweep=experiments/sweeps/cpu_table.py \
      --sweep_dir=runs/cpu_table
  python experiments/plots.py --runs=runs/cpu_table --out=runs/cpu_table/plots \
      --compare=fedmrl,standalone
  python experiments/results_page.py --sweep_dir=runs/cpu_table \
      --plots_dir=runs/cpu_table/plots --out=docs/results.md
"""
import ml_collections


def get_config():
  c = ml_collections.ConfigDict()
  c.algorithms = ["standalone", "fedmrl", "fedmoe", "lg_fedavg", "fedproto", "fd", "fml",
                  "fedkd", "fedapen", "moss"]
  c.variant = ""
  c.settings = ml_collections.ConfigDict({
      "CIFAR-10 N=10,C=100% (6k examples)": {
          "data.name": "cifar10", "data.subsample": 6000, "partition.kind": "pathological",
          "partition.classes_per_client": 2, "num_clients": 10, "participation": 1.0},
  }, allow_dotted_keys=True, sort_keys=False)
  c.seeds = (0,)
  c.base_overrides = ml_collections.ConfigDict(
      {"num_rounds": 10, "eval_every": 5, "checkpoint_every": 5},
      allow_dotted_keys=True, sort_keys=False)
  c.algorithm_overrides = ml_collections.ConfigDict({}, allow_dotted_keys=True)
  return c
