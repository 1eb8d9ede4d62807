r"""The FedMRL / pFedMoE papers' main table under the papers' training protocol (a GPU job).

Rows: Standalone and the model-heterogeneous methods. Columns: CIFAR-10 (2 of 10
classes per client) and CIFAR-100 (10 of 100) at (N=10, C=100%), (N=50, C=20%) and
(N=100, C=10%); client k runs CNN-((k mod 5)+1). Uncut: T = 500 rounds of E = 10 epochs,
B = 512, 3 seeds, both evaluation protocols every round (180 runs; the protocol's
pieces: docs/results_howto.md, where each comes from: docs/fidelity.md).

  python experiments/sweep.py --sweep=experiments/sweeps/paper_table.py \
      --sweep_dir=runs/paper_table
"""
import ml_collections

SETTINGS = (("N=10,C=100%", 10, 1.0), ("N=50,C=20%", 50, 0.2), ("N=100,C=10%", 100, 0.1))
DATASETS = (("CIFAR-10", "cifar10", 2), ("CIFAR-100", "cifar100", 10))

# The papers' protocol, shared by paper_cpu.py.
PROTOCOL = {
    "num_rounds": 500, "local_epochs": 10, "batch_size": 512, "drop_last": False,
    "learning_rate": 0.01, "momentum": 0.9, "weight_decay": 1e-3, "grad_clip": 50.0,
    "reset_downloaded_momentum": True,
    "data.pool": "official", "data.validation": 10000, "data.augment": "flip_crop_erase",
    "partition.kind": "pathological", "partition.shares": "uniform",
    "eval_every": 1, "eval_sampled": True, "checkpoint_every": 50,
}
ALGORITHM_OVERRIDES = {
    "fedmrl": {"algo.d1": 500},
    "fedkd": {"algo.svd_energy_start": 0.95, "algo.svd_energy_end": 0.98},
}
ALGORITHMS = ["standalone", "lg_fedavg", "fd", "fedproto", "fml", "fedkd", "fedapen",
              "moss", "fedmoe", "fedmrl"]


def get_config():
  c = ml_collections.ConfigDict()
  c.algorithms = list(ALGORITHMS)
  c.variant = ""
  c.settings = ml_collections.ConfigDict({
      f"{title} {name}": {"data.name": data, "partition.classes_per_client": classes,
                          "num_clients": n, "participation": frac}
      for title, data, classes in DATASETS for name, n, frac in SETTINGS
  }, allow_dotted_keys=True, sort_keys=False)
  c.seeds = (0, 1, 2)
  c.base_overrides = ml_collections.ConfigDict(PROTOCOL, allow_dotted_keys=True,
                                               sort_keys=False)
  c.algorithm_overrides = ml_collections.ConfigDict(ALGORITHM_OVERRIDES,
                                                    allow_dotted_keys=True)
  return c
