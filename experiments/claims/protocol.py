r"""The claims ledger's cut of the papers' protocol, shared by the sweeps beside it.

The papers' protocol (``experiments/sweeps/paper_table.py``: SGD momentum 0.9, weight
decay 1e-3, clipping at 50, flip + crop + erasing, pFedHN's U(0.4, 0.6) shares,
CIFAR's test split in each client's training proportions, K = round(C * N), both
evaluation protocols every round) at the papers' N = 100, C = 10% on CIFAR-10 (2 of 10
classes per client, CNN-1..5), cut for 2 CPU cores by examples and rounds, never by
clients: 100 training examples per client (``data.subsample`` 12,000 of the official
pool: 10,000 train + 2,000 test; the papers' clients hold about 400), E = 5 local epochs
with B = 64: 10 SGD steps per visit, as the papers' E = 10 epochs of one B = 512 step
each on 400 examples; T = 100 rounds (``ROUNDS``; the papers' 500), so that a client
trains on about 10 visits (at T = 40, about 4 visits, Standalone had reached 54-60% on
its 2 classes at round 18: still near chance).
Every sweep holds Moss's public set of 200 examples out of the clients' pool, so runs
of one seed and setting share their partition across sweeps and pair across them.
``:cifar100`` switches every sweep to CIFAR-100 with the papers' 10 of 100 classes.

Cost of this cut: a cell of 3 seeds is 34-71 TFLOP (22-67 minutes of the 2-core CPU by
the plans); the eight sweeps that use it are 172 runs (5 seeds where 3 left a claim
within two standard errors), about 35 h by their plans (each sweep file's docstring;
calibrated while another sweep shared the machine, so somewhat long), far over the 4 h
the ledger was meant to take. Memory: a FedMRL seed's state at this cut is 2.36 GiB;
two seeds on the replica axis (``--seed_batch``) peaked at 11.3 GiB over 24 rounds, one
seed alone at 5.2 GiB (docs/performance.md, "Seeds on a replica axis"; a run warns
first where it may not fit): with less than about 6 GiB free a seed, ``--seed_batch=1``.
Fewer rounds leave the clients near chance (above); the sweeps run across
sessions (``--budget_min``; finished cells are committed and skipped by a rerun), or on
a GPU.

``cell_sweep`` builds the ledger's other cut: variants of ``paper_cpu.py``'s N = 10 cell.
"""
import os

import ml_collections

from fedjax_het import config_files

SWEEPS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "sweeps")
paper_table = config_files.load_module(os.path.join(SWEEPS, "paper_table.py"))
paper_cpu = config_files.load_module(os.path.join(SWEEPS, "paper_cpu.py"))

ROUNDS = 100  # the ledger's budget T for the N=100 rows

SEEDS = (0, 1, 2)
CUT = {**paper_table.PROTOCOL, "num_rounds": ROUNDS, "local_epochs": 5, "batch_size": 64,
       "data.validation": 0, "data.subsample": 12000, "num_clients": 100,
       "participation": 0.1, "checkpoint_every": 20, "data.public": 200}
ALGORITHM_OVERRIDES = {**paper_table.ALGORITHM_OVERRIDES,
                       "moss": {"algo.public_size": 200}}
# dataset switch: (data.name, classes per client of the papers' pathological split)
DATASETS = {"cifar10": ("cifar10", 2), "cifar100": ("cifar100", 10)}


def dataset(arg: str | None) -> tuple[str, int]:
  """``(data.name, classes per client)`` for a sweep file's ``get_config(arg)``."""
  name = arg or "cifar10"
  if name not in DATASETS:
    raise ValueError(f"unknown claims dataset {name!r}; valid: {sorted(DATASETS)}")
  return DATASETS[name]


def on_dataset(values: dict, arg: str | None) -> dict:
  """A setting's overrides moved to ``arg``'s dataset (``dataset``): CIFAR-100 with the
  papers' 10 of 100 classes per client; CIFAR-10's stay as they are."""
  name, classes = dataset(arg)
  return {**values, "data.name": name, "partition.classes_per_client": classes}


def sweep(algorithms, settings: dict, *, arg: str | None = None, rounds: int = ROUNDS,
          algorithm_overrides: dict | None = None,
          seeds=SEEDS) -> ml_collections.ConfigDict:
  """A claims sweep: ``settings`` ({name: dotted overrides}) on top of the cut.

  Args:
    algorithms: the rows (config names, as in any sweep file).
    settings: the columns; each gets the dataset of ``arg`` unless it names one.
    arg: ``None``/``'cifar10'`` or ``'cifar100'`` (the sweep file's variant).
    rounds: T of every run.
    algorithm_overrides: per row, on top of ``ALGORITHM_OVERRIDES``.
    seeds: the seeds of every cell.
  """
  name, classes = dataset(arg)
  c = ml_collections.ConfigDict()
  c.algorithms = list(algorithms)
  c.variant = ""
  c.settings = ml_collections.ConfigDict(
      {title: {"data.name": name, "partition.classes_per_client": classes, **values}
       for title, values in settings.items()},
      allow_dotted_keys=True, sort_keys=False)
  c.seeds = tuple(seeds)
  c.base_overrides = ml_collections.ConfigDict({**CUT, "num_rounds": rounds},
                                               allow_dotted_keys=True, sort_keys=False)
  per_algorithm = {k: dict(v) for k, v in ALGORITHM_OVERRIDES.items() if k in algorithms}
  for k, v in (algorithm_overrides or {}).items():
    per_algorithm[k] = {**per_algorithm.get(k, {}), **v}
  c.algorithm_overrides = ml_collections.ConfigDict(per_algorithm, allow_dotted_keys=True)
  return c


def cell_name(arg: str | None = None) -> str:
  """The name of ``paper_cpu.py``'s one setting (a table column), on ``arg``'s dataset."""
  (name,) = paper_cpu.get_config().settings.keys()
  return name.replace("CIFAR-10", "CIFAR-100") if dataset(arg)[0] == "cifar100" else name


def cell_sweep(algorithms, variants: dict, *, arg: str | None = None,
               seeds=None, base_overrides: dict | None = None) -> ml_collections.ConfigDict:
  """``paper_cpu.py``'s N = 10, C = 100% cell (T = 20, same partitions) in variants.

  Every method holds out the cell's largest public set (Moss's), as paper_cpu's plan
  does, so runs pair with paper_cpu's by seed even without Moss among ``algorithms``.

  Args:
    algorithms: the rows; only their ``paper_cpu`` algorithm overrides are kept.
    variants: the columns, ``{name: dotted overrides}`` on top of the cell's setting.
    arg: the dataset (``on_dataset``).
    seeds: the seeds of every cell (``paper_cpu``'s when None).
    base_overrides: on top of ``paper_cpu``'s base overrides.
  """
  c = paper_cpu.get_config()
  c.base_overrides["data.public"] = max(v.get("data.public", 0)
                                        for v in c.algorithm_overrides.values())
  (_, values), = c.settings.items()
  values = on_dataset(values, arg)
  c.algorithms = list(algorithms)
  c.settings = ml_collections.ConfigDict({k: {**values, **v} for k, v in variants.items()},
                                         allow_dotted_keys=True, sort_keys=False)
  c.algorithm_overrides = ml_collections.ConfigDict(
      {k: v for k, v in c.algorithm_overrides.items() if k in algorithms},
      allow_dotted_keys=True)
  if seeds is not None:
    c.seeds = tuple(seeds)
  for k, v in (base_overrides or {}).items():
    c.base_overrides[k] = v
  return c
