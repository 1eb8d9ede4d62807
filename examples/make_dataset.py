r"""An image dataset of your own, as fedjax-het reads it (docs/extending.md).

One ``.npz`` of ``x_train``, ``x_test`` (uint8 [N, H, W, C], any H, W, C) and
``y_train``, ``y_test`` (integer labels 0..C-1). The number of classes is inferred from
the labels (or ``--config.data.num_classes``), the per-channel normalisation statistics
are computed from the training split (or ``--config.data.mean/std``).

  python examples/make_dataset.py --out=/tmp/data --name=gray28 --shape=28,28,1
  python experiments/main.py --config=experiments/fedmrl.py:smoke --workdir=/tmp/gray28 \
      --config.data.name=gray28 --config.data.path=/tmp/data/gray28.npz

This one writes synthetic images (each class a random template plus noise, so the
classes are learnable); to bring real data, call ``save`` with your arrays.
"""
import os

import numpy as np

from fedjax_het.data import make_synthetic


def save(path: str, x_train, y_train, x_test, y_test) -> str:
  """Writes the four arrays as the ``.npz`` fedjax-het reads; returns ``path``."""
  arrays = dict(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
  for key in ("x_train", "x_test"):
    if arrays[key].dtype != np.uint8 or arrays[key].ndim != 4:
      raise ValueError(f"{key}: expected uint8 [N, H, W, C], got {arrays[key].dtype} "
                       f"{arrays[key].shape}")
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  np.savez(path, **arrays)
  return path


def synthetic(path: str, shape=(28, 28, 1), num_classes: int = 10, num_train: int = 600,
              num_test: int = 200, seed: int = 0) -> str:
  """A learnable synthetic dataset of images of ``shape`` saved at ``path``."""
  raw = make_synthetic(num_train, num_test, num_classes, seed, image_shape=tuple(shape))
  return save(path, raw.x_train, raw.y_train, raw.x_test, raw.y_test)


def cli():
  from absl import app  # noqa: PLC0415 - importing this module defines no flags
  from absl import flags  # noqa: PLC0415 - importing this module defines no flags
  out = flags.DEFINE_string("out", None, "Directory of <name>.npz.")
  name = flags.DEFINE_string("name", "gray28", "Dataset name (the file <name>.npz).")
  shape = flags.DEFINE_list("shape", ["28", "28", "1"], "H,W,C of the images.")
  classes = flags.DEFINE_integer("classes", 10, "Number of classes.")
  num = flags.DEFINE_list("examples", ["1000", "200"], "train,test examples.")
  flags.mark_flags_as_required(["out"])

  def main(argv):
    del argv
    hwc = tuple(int(d) for d in shape.value)
    n_train, n_test = (int(n) for n in num.value)
    path = synthetic(os.path.join(out.value, f"{name.value}.npz"), hwc, classes.value,
                     n_train, n_test)
    print(f"wrote {path}: {n_train} + {n_test} images of {'x'.join(map(str, hwc))}, "
          f"{classes.value} classes")
  app.run(main)


if __name__ == "__main__":
  cli()
