r"""A partition of your own: McMahan et al.'s label-sorted shards (docs/extending.md).

The pool of a config (its examples, in the order fedjax-het partitions them) is sorted
by label and cut into ``shards_per_client * N`` shards; every client gets
``shards_per_client`` random shards and keeps ``test_fraction`` of them for testing.
The file is what a run exports into its workdir (``partition_indices.npz``), and a run
reads it back with ``partition.kind='file'``:

  python examples/make_partition.py --config=experiments/fedmrl.py:smoke --out=/tmp/shards.npz
  python experiments/main.py --config=experiments/fedmrl.py:smoke --workdir=/tmp/shards \
      --config.partition.kind=file --config.partition.path=/tmp/shards.npz
"""
import numpy as np

from fedjax_het import config as config_lib
from fedjax_het.data import load_pool
from fedjax_het.data import partition_file


def shards(labels: np.ndarray, num_clients: int, *, shards_per_client: int = 2,
           test_fraction: float = 0.2, seed: int = 0) -> tuple[list, list]:
  """(train, test) index lists: every client ``shards_per_client`` label-sorted shards."""
  rng = np.random.default_rng(seed)
  order = np.argsort(labels, kind="stable")
  pieces = np.array_split(order, shards_per_client * num_clients)
  owner = rng.permutation(len(pieces)) % num_clients
  train, test = [], []
  for k in range(num_clients):
    mine = rng.permutation(np.concatenate([p for p, o in zip(pieces, owner) if o == k]))
    cut = max(1, int(round(test_fraction * len(mine))))
    test.append(np.sort(mine[:cut]))
    train.append(np.sort(mine[cut:]))
  return train, test


def write(config, out: str, shards_per_client: int = 2) -> partition_file.ClientTables:
  """Writes the shards partition of ``config``'s pool to ``out``; returns the tables."""
  pool = load_pool(**config_lib.pool_args(config))  # what a run of it partitions
  train, test = shards(pool.y, config.num_clients, shards_per_client=shards_per_client,
                       test_fraction=config.partition.test_fraction, seed=config.seed)
  tables = pool.tables(train, test)
  partition_file.save(out, tables)
  return tables


def cli():
  from absl import app  # noqa: PLC0415 - importing this module defines no flags
  from absl import flags  # noqa: PLC0415 - importing this module defines no flags
  from ml_collections import config_flags  # noqa: PLC0415
  config = config_flags.DEFINE_config_file("config", None, "Experiment config file.")
  out = flags.DEFINE_string("out", None, "The partition file (.npz or .json).")
  per_client = flags.DEFINE_integer("shards_per_client", 2, "Shards of each client.")
  flags.mark_flags_as_required(["config", "out"])

  def main(argv):
    del argv
    tables = write(config.value, out.value, per_client.value)
    print(f"wrote {out.value}: {len(tables.train)} clients of {tables.pool_size} pooled "
          f"examples; train sizes {[len(t) for t in tables.train]}")
  app.run(main)


if __name__ == "__main__":
  cli()
