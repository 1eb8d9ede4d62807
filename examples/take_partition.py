r"""A run's clients as rows of the original npz, for another library (docs/extending.md).

Every run writes ``partition_indices.npz``: each client's indices into the run's pool,
plus ``pool_split`` (0: ``x_train``, 1: ``x_test``) and ``pool_row`` (the row there) of
every pool row.

  python examples/take_partition.py --tables=/tmp/ext/fedprox/partition_indices.npz \
      --source=../shared/data/cifar10.npz
"""
import numpy as np


def source_rows(tables, k: int, kind: str = "train") -> tuple[np.ndarray, np.ndarray]:
  """(split 0/1, row) in the source npz of client ``k``'s ``kind`` examples."""
  idx = tables[f"{kind}_{k}"]  # pool indices
  return tables["pool_split"][idx], tables["pool_row"][idx]


def client_labels(tables, source, k: int, kind: str = "train") -> np.ndarray:
  """The labels of client ``k``'s examples, read from the source npz's own arrays."""
  labels = (source["y_train"].ravel(), source["y_test"].ravel())
  split, row = source_rows(tables, k, kind)
  return np.array([labels[s][r] for s, r in zip(split, row)], np.int64)


def cli():
  from absl import app  # noqa: PLC0415 - importing this module defines no flags
  from absl import flags  # noqa: PLC0415 - importing this module defines no flags
  tables_flag = flags.DEFINE_string("tables", None, "A run's partition_indices.npz.")
  source_flag = flags.DEFINE_string("source", None, "The dataset's npz.")
  flags.mark_flags_as_required(["tables", "source"])

  def main(argv):
    del argv
    with np.load(tables_flag.value) as tables, np.load(source_flag.value) as source:
      k = 0
      while f"train_{k}" in tables.files:
        split, _ = source_rows(tables, k)
        print(f"client {k}: {len(split)} train examples, {int(np.sum(split == 1))} of them "
              f"from x_test; classes {np.unique(client_labels(tables, source, k)).tolist()}")
        k += 1
  app.run(main)


if __name__ == "__main__":
  cli()
