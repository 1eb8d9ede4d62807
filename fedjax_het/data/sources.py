"""Where the raw images come from: a local ``.npz`` file or TensorFlow Datasets.

A dataset can be provided in three ways, tried in this order by ``resolve_source``:

1. ``config.data.path``: an ``.npz`` file, a directory holding ``<name>.npz``, or a TFDS
   ``data_dir``.
2. The environment variable ``FEDJAX_HET_DATA``: a directory holding ``<name>.npz``.
3. TFDS's default data directory (needs ``pip install -e '.[tfds]'`` and either
   internet access or an already prepared cache).

Every source is checked the same way (``validate_raw``) and returned as ``RawData``:
uint8 images ``[n, H, W, C]`` and int32 labels ``[n]``. Nothing here touches JAX.

Datasets: the built-in ``DATASETS`` (CIFAR-10 and CIFAR-100: 32x32x3, their number of
classes and CIFAR's normalisation statistics are known), and any other image dataset in
an ``.npz`` of ``x_train, y_train, x_test, y_test`` (``data.name`` any name, the file
given by ``data.path`` or found as ``$FEDJAX_HET_DATA/<name>.npz``): images uint8 of any
``H, W, C`` (the same in both splits), integer labels; the number of classes is
``data.num_classes`` or, when 0, inferred as the largest label + 1; the per-channel
normalisation statistics are ``data.mean``/``data.std`` or, when empty, computed from
the training split (``normalization``).

Whatever the source, ``load_dataset`` returns each split in one canonical row order (by
a content hash of each image and its label, ``canonical_order``): the npz and TFDS
copies of CIFAR list the same examples in different orders, and the order decides the
partition, so without it one config and seed would give other clients from each. The
result also says where it came from and carries a fingerprint of its arrays.
"""
from __future__ import annotations

import hashlib
import os
import re
import zipfile
from typing import Mapping, NamedTuple

import numpy as np

from fedjax_het.data import cache
from fedjax_het.models.preprocess import CIFAR_MEAN
from fedjax_het.models.preprocess import CIFAR_STD

# Built-in dataset name -> number of classes (their images are IMAGE_SHAPE).
DATASETS = {"cifar10": 10, "cifar100": 100}
# Built-in dataset name -> examples of its (train, test) splits (``pool.pool_sizes``).
SPLIT_SIZES = {"cifar10": (50000, 10000), "cifar100": (50000, 10000)}
ENV_VAR = "FEDJAX_HET_DATA"
IMAGE_SHAPE = (32, 32, 3)
SPLITS = ("train", "test")
# data.name: also the file name <name>.npz
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


class DataNotFoundError(FileNotFoundError):
  """The dataset is not where it was looked for (the message says how to provide it)."""


class DataFormatError(ValueError):
  """The dataset was found but its arrays are not what ``RawData`` promises."""


class RawData(NamedTuple):
  """One dataset as numpy arrays, split as its publisher splits it.

  Attributes:
    x_train: uint8 [n_train, H, W, C] images (32x32x3 RGB for the built-in datasets).
    y_train: int32 [n_train] labels in [0, num_classes).
    x_test: uint8 [n_test, H, W, C].
    y_test: int32 [n_test].
    num_classes: number of classes.
    source: where the arrays were read (``'npz:<file>'``, ``'tfds:<data_dir>'``), or ''.
    fingerprint: short hash of the four arrays in canonical order, or ''.
    train_rows, test_rows: int64 [n]: the row each example had in the source's split
      (``canonical`` reorders the rows), or None.
  """
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int
  source: str = ""
  fingerprint: str = ""
  train_rows: np.ndarray | None = None
  test_rows: np.ndarray | None = None

  @property
  def image_shape(self) -> tuple[int, ...]:
    """(H, W, C) of one image."""
    return tuple(int(d) for d in self.x_train.shape[1:])


def num_classes_of(name: str) -> int:
  """Number of classes of dataset ``name``; ValueError listing ``DATASETS`` if unknown."""
  if name not in DATASETS:
    raise ValueError(f"unknown dataset {name!r}; valid choices: {sorted(DATASETS)}")
  return DATASETS[name]


def check_name(name: str) -> None:
  """ValueError unless ``name`` can name a dataset (and its file ``<name>.npz``)."""
  if not isinstance(name, str) or not NAME_RE.match(name):
    raise ValueError(f"config.data.name={name!r} is invalid: a built-in dataset "
                     f"{sorted(DATASETS)} or a name of letters, digits, '_', '.', '-' "
                     "(the file <name>.npz)")


def how_to_provide(name: str) -> str:
  """The ways of providing dataset ``name``, for error messages."""
  if name not in DATASETS:
    return (f"Provide {name!r} as config.data.path = an .npz file of x_train, y_train, "
            f"x_test, y_test (or a directory holding {name}.npz), or as "
            f"{ENV_VAR}=<dir holding {name}.npz>; only the built-in datasets "
            f"{sorted(DATASETS)} can come from TFDS.")
  return (f"Provide {name!r} in one of three ways: (1) config.data.path = an .npz file "
          f"or a TFDS data_dir (a directory holding {name}.npz also works); "
          f"(2) {ENV_VAR}=<dir holding {name}.npz>; (3) TFDS's default data dir, which "
          "needs `pip install -e '.[tfds]'` and internet access or an already "
          "prepared cache.")


def resolve_source(name: str, path: str = "",
                   environ: Mapping[str, str] | None = None) -> tuple[str, str | None]:
  """Decides where dataset ``name`` is read from (nothing is read).

  Args:
    name: dataset name: a key of ``DATASETS``, or any name of a dataset in an npz.
    path: ``config.data.path``: an ``.npz`` file, a directory holding ``<name>.npz``,
      a TFDS data_dir, or '' to use ``FEDJAX_HET_DATA`` or TFDS's default directory.
    environ: environment to read ``FEDJAX_HET_DATA`` from (default ``os.environ``).

  Returns:
    ``('npz', file_path)`` or ``('tfds', data_dir)`` where ``data_dir`` is None for
    TFDS's default directory (built-in datasets only).

  Raises:
    ValueError: a bad ``name``, or a dataset other than the built-in ones with neither
      ``path`` nor ``FEDJAX_HET_DATA``.
    DataNotFoundError: ``path`` does not exist, or ``FEDJAX_HET_DATA`` is set but does
      not hold ``<name>.npz`` (nor does a directory ``path`` of a non-built-in dataset).
    DataFormatError: ``path`` is a file that is not an ``.npz``.
  """
  check_name(name)
  if path:
    return _resolve_path(name, os.path.expanduser(path))
  environ = os.environ if environ is None else environ
  data_dir = environ.get(ENV_VAR, "")
  if not data_dir and name not in DATASETS:
    raise ValueError(f"dataset {name!r} is not built in (valid built-in datasets: "
                     f"{sorted(DATASETS)}) and no file was given. {how_to_provide(name)}")
  if not data_dir:
    return "tfds", None
  file = os.path.join(os.path.expanduser(data_dir), f"{name}.npz")
  if not os.path.isfile(file):
    raise DataNotFoundError(f"{ENV_VAR}={data_dir!r} does not hold {name}.npz "
                            f"(looked for {file!r}). {how_to_provide(name)}")
  return "npz", file


def _resolve_path(name: str, path: str) -> tuple[str, str | None]:
  """``resolve_source`` for a non-empty ``config.data.path``."""
  if os.path.isfile(path):
    if not path.endswith(".npz"):
      raise DataFormatError(f"config.data.path={path!r} is a file but not an .npz; "
                            f"expected an .npz file or a directory. {how_to_provide(name)}")
    return "npz", path
  if os.path.isdir(path):
    file = os.path.join(path, f"{name}.npz")
    if os.path.isfile(file):
      return "npz", file
    if name not in DATASETS:
      raise DataNotFoundError(f"config.data.path={path!r} does not hold {name}.npz. "
                              f"{how_to_provide(name)}")
    return "tfds", path
  raise DataNotFoundError(f"config.data.path={path!r} does not exist. "
                          f"{how_to_provide(name)}")


def _check_images(where: str, key: str, x: np.ndarray,
                  image_shape: tuple[int, ...] | None = None) -> None:
  """DataFormatError unless ``x`` is uint8 [n, H, W, C] (of ``image_shape`` if given)."""
  if image_shape is not None and (x.ndim != 4 or tuple(x.shape[1:]) != tuple(image_shape)):
    raise DataFormatError(f"{where}: {key} has shape {tuple(x.shape)}; expected "
                          f"[n, {', '.join(map(str, image_shape))}] (NHWC images)")
  if x.ndim != 4 or min(x.shape[1:], default=0) < 1:
    hint = " (grayscale images need a channel axis: x[..., None])" if x.ndim == 3 else ""
    raise DataFormatError(f"{where}: {key} has shape {tuple(x.shape)}; expected "
                          f"[n, H, W, C] (NHWC images){hint}")
  if x.dtype != np.uint8:
    raise DataFormatError(f"{where}: {key} has dtype {x.dtype}; expected uint8 pixels in "
                          "[0, 255] (floats are not accepted: convert with "
                          "np.round(x * 255).astype(np.uint8))")


def _check_labels(where: str, key: str, y: np.ndarray, num_examples: int,
                  num_classes: int) -> np.ndarray:
  """Labels of shape (n,) or (n, 1) as int32 [n]; DataFormatError if invalid.

  ``num_classes=0``: labels need only be >= 0 (the classes are inferred).
  """
  if not (y.ndim == 1 or (y.ndim == 2 and y.shape[1] == 1)):
    raise DataFormatError(f"{where}: {key} has shape {tuple(y.shape)}; expected (n,) or "
                          "(n, 1)")
  if not np.issubdtype(y.dtype, np.integer):
    raise DataFormatError(f"{where}: {key} has dtype {y.dtype}; expected integer labels")
  y = y.reshape(-1)
  if len(y) != num_examples:
    raise DataFormatError(f"{where}: {key} has {len(y)} labels but the images have "
                          f"{num_examples} rows; expected one label per image")
  if len(y) and (y.min() < 0 or (num_classes and y.max() >= num_classes)):
    expected = f"[0, {num_classes})" if num_classes else ">= 0"
    raise DataFormatError(f"{where}: {key} has labels in [{y.min()}, {y.max()}]; "
                          f"expected labels in {expected}")
  if y.max(initial=0) > np.iinfo(np.int32).max:
    raise DataFormatError(f"{where}: {key} has labels up to {y.max()}; expected int32")
  return y.astype(np.int32)


def validate_raw(arrays: Mapping[str, np.ndarray], num_classes: int, where: str,
                 image_shape: tuple[int, ...] | None = IMAGE_SHAPE) -> RawData:
  """Checks images and labels of both splits and returns them as ``RawData``.

  Args:
    arrays: ``x_train, y_train, x_test, y_test`` (labels of shape (n,) or (n, 1)).
    num_classes: labels must lie in [0, num_classes); 0: inferred, the largest label
      of either split + 1.
    where: source name used in error messages (a file path, 'tfds:cifar10').
    image_shape: the (H, W, C) every image must have; None: any, the same in both
      splits.

  Returns:
    ``RawData`` with int32 labels of shape [n].

  Raises:
    DataFormatError: naming the bad array and what was expected.
  """
  out = {}
  for split in SPLITS:
    x, y = np.asarray(arrays[f"x_{split}"]), np.asarray(arrays[f"y_{split}"])
    _check_images(where, f"x_{split}", x, image_shape)
    out[f"x_{split}"] = x
    out[f"y_{split}"] = _check_labels(where, f"y_{split}", y, len(x), num_classes)
  if out["x_train"].shape[1:] != out["x_test"].shape[1:]:
    raise DataFormatError(f"{where}: x_train has images of shape "
                          f"{tuple(out['x_train'].shape[1:])} but x_test's are "
                          f"{tuple(out['x_test'].shape[1:])}; both splits need one shape")
  if not len(out["y_train"]):
    raise DataFormatError(f"{where}: x_train has no examples")
  if not num_classes:
    num_classes = int(max(out["y_train"].max(), out["y_test"].max(initial=0))) + 1
  return RawData(num_classes=num_classes, **out)


def _npz_label_key(split: str, name: str, files: list[str]) -> str:
  """``y_<split>_fine`` for cifar100 when present, else ``y_<split>``."""
  fine = f"y_{split}_fine"
  return fine if name == "cifar100" and fine in files else f"y_{split}"


def _open_npz(file: str):
  """``np.load`` of an ``.npz`` archive; DataFormatError if it is not one."""
  try:
    data = np.load(file, allow_pickle=False)
  except (zipfile.BadZipFile, OSError, EOFError, ValueError) as e:
    raise DataFormatError(f"{file}: not a readable .npz file ({e})") from e
  if not isinstance(data, np.lib.npyio.NpzFile):
    raise DataFormatError(f"{file}: holds a single array, not an .npz archive of "
                          "x_train, y_train, x_test, y_test")
  return data


def _read_array(file: str, data, key: str) -> np.ndarray:
  """One array of an open ``.npz``; DataFormatError if it cannot be read."""
  try:
    return data[key]
  except (ValueError, OSError, zipfile.BadZipFile) as e:
    raise DataFormatError(f"{file}: cannot read array {key!r} ({e}); expected a plain "
                          "numeric array (no pickled objects)") from e


def load_npz(file: str, name: str, num_classes: int = 0) -> RawData:
  """Reads dataset ``name`` from an ``.npz`` file.

  The file holds ``x_train, y_train, x_test, y_test`` (for cifar100 ``y_train_fine`` /
  ``y_test_fine`` are used when present). Other arrays (file names, label names) are
  ignored.

  Args:
    file: path of the ``.npz`` file.
    name: dataset name: a built-in one (its images must be 32x32x3 and its labels
      within its classes) or any other (images of any one shape).
    num_classes: the classes of a non-built-in dataset (0: the largest label + 1).

  Returns:
    ``RawData``.

  Raises:
    DataNotFoundError: the file does not exist.
    DataFormatError: unreadable file, missing arrays, or arrays of the wrong shape,
      dtype or label range.
  """
  check_name(name)
  known = name in DATASETS
  num_classes = DATASETS[name] if known else num_classes
  if not os.path.isfile(file):
    raise DataNotFoundError(f"{file!r} does not exist. {how_to_provide(name)}")
  with _open_npz(file) as data:
    files = list(data.files)
    keys = {}
    for split in SPLITS:
      keys[f"x_{split}"] = f"x_{split}"
      keys[f"y_{split}"] = _npz_label_key(split, name, files)
    missing = [k for k in keys.values() if k not in files]
    if missing:
      raise DataFormatError(f"{file}: missing arrays {missing}; the file holds "
                            f"{sorted(files)}; expected x_train, y_train, x_test, y_test")
    arrays = {role: _read_array(file, data, key) for role, key in keys.items()}
  return validate_raw(arrays, num_classes, file, IMAGE_SHAPE if known else None)


def _tfds_missing(e: Exception) -> bool:
  """Whether a TFDS exception means 'the data is not there' (vs a bug)."""
  kind = type(e).__name__
  return (isinstance(e, (AssertionError, OSError))
          or "NotFound" in kind or "Download" in kind)


def load_tfds(name: str, data_dir: str | None) -> RawData:
  """Reads dataset ``name`` with TensorFlow Datasets (the optional ``[tfds]`` extra).

  For cifar100 the supervised label is the fine (100-class) label.

  Args:
    name: dataset name, a key of ``DATASETS``.
    data_dir: a prepared TFDS data_dir (read only, no download), or None for TFDS's
      default directory (downloads if the data is not cached).

  Returns:
    ``RawData``.

  Raises:
    DataNotFoundError: tensorflow_datasets is not installed, or the data is missing.
    DataFormatError: the arrays are not what ``RawData`` promises.
  """
  num_classes = num_classes_of(name)
  try:
    import tensorflow_datasets as tfds  # pylint: disable=g-import-not-at-top
  except ImportError as e:
    raise DataNotFoundError(
        f"reading {name!r} from TFDS needs tensorflow_datasets "
        f"(`pip install -e '.[tfds]'`), which is not installed. "
        f"{how_to_provide(name)}") from e
  try:
    splits = tfds.load(name, split=list(SPLITS), data_dir=data_dir, batch_size=-1,
                       as_supervised=True, download=data_dir is None)
  except Exception as e:  # pylint: disable=broad-except
    if not _tfds_missing(e):
      raise
    where = f"data_dir={data_dir!r}" if data_dir else "TFDS's default data dir"
    raise DataNotFoundError(f"TFDS could not load {name!r} from {where}: "
                            f"{type(e).__name__}: {e}. {how_to_provide(name)}") from e
  (x_train, y_train), (x_test, y_test) = tfds.as_numpy(splits)
  arrays = dict(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
  return validate_raw(arrays, num_classes, f"tfds:{name}")


def load_dataset(name: str, path: str = "",
                 environ: Mapping[str, str] | None = None, *,
                 num_classes: int = 0) -> RawData:
  """Resolves where dataset ``name`` is (see ``resolve_source``) and reads it.

  Args:
    name: dataset name, a key of ``DATASETS`` or the name of a dataset in an npz.
    path: ``config.data.path`` ('' for ``FEDJAX_HET_DATA`` or TFDS's default).
    environ: environment (default ``os.environ``): ``FEDJAX_HET_DATA``, and
      ``FEDJAX_HET_DATA_CACHE``, a directory caching decoded ``.npz`` files
      (``fedjax_het.data.cache``; its arrays come back memory-mapped, read only).
    num_classes: ``config.data.num_classes`` of a non-built-in dataset (0: inferred).

  Returns:
    ``RawData``.
  """
  environ = os.environ if environ is None else environ
  kind, where = resolve_source(name, path, environ)
  source = f"{kind}:{os.path.abspath(where) if where else 'default data dir'}"
  cache_dir = environ.get(cache.ENV_VAR, "")
  if kind == "npz" and cache_dir:
    return _load_npz_cached(where, name, num_classes, cache_dir, source)
  raw = (load_npz(where, name, num_classes) if kind == "npz"
         else load_tfds(name, where))
  return canonical(raw, source)


_CACHED = ("x_train", "y_train", "x_test", "y_test", "train_rows", "test_rows")


def _load_npz_cached(file: str, name: str, num_classes: int, cache_dir: str,
                     source: str) -> RawData:
  """``canonical(load_npz(...))`` through the dataset cache (``fedjax_het.data.cache``):
  the arrays memory-mapped from its entry, which the first reader writes."""
  entry = cache.entry_dir(cache_dir, file, name, num_classes)
  hit = cache.read(entry, _CACHED)
  if hit is None:
    raw = canonical(load_npz(file, name, num_classes), source)
    meta = {"num_classes": raw.num_classes, "fingerprint": raw.fingerprint}
    if not cache.write(entry, {k: getattr(raw, k) for k in _CACHED}, meta):
      return raw
    hit = cache.read(entry, _CACHED)  # what later readers get, from the first one on
  arrays, meta = hit
  return RawData(**arrays, num_classes=meta["num_classes"], source=source,
                 fingerprint=meta["fingerprint"])


def canonical_order(x: np.ndarray, y: np.ndarray) -> np.ndarray:
  """The permutation sorting a split by a 64-bit BLAKE2 hash of each image and label.

  Identical (image, label) rows hash alike and are interchangeable, so the sorted split
  is the same whatever order the source listed it in.
  """
  keys = np.fromiter(
      (int.from_bytes(hashlib.blake2b(img.tobytes() + int(label).to_bytes(4, "little"),
                                      digest_size=8).digest(), "little")
       for img, label in zip(x, y)), dtype=np.uint64, count=len(y))
  return np.argsort(keys, kind="stable")


def fingerprint(raw: RawData) -> str:
  """16 hex digits of a SHA-256 over the four arrays (shapes included)."""
  h = hashlib.sha256()
  for a in (raw.x_train, raw.y_train, raw.x_test, raw.y_test):
    h.update(str(a.shape).encode())
    h.update(np.ascontiguousarray(a).tobytes())
  return h.hexdigest()[:16]


def canonical(raw: RawData, source: str = "") -> RawData:
  """``raw`` with both splits in canonical order, its ``source`` and ``fingerprint``.

  ``train_rows``/``test_rows`` say which row of the source each canonical row was.
  """
  tr = canonical_order(raw.x_train, raw.y_train)
  te = canonical_order(raw.x_test, raw.y_test)
  out = RawData(raw.x_train[tr], raw.y_train[tr], raw.x_test[te], raw.y_test[te],
                raw.num_classes, source, train_rows=tr.astype(np.int64),
                test_rows=te.astype(np.int64))
  return out._replace(fingerprint=fingerprint(out))


def channel_stats(x: np.ndarray, chunk: int = 4096) -> tuple[tuple[float, ...],
                                                              tuple[float, ...]]:
  """Per-channel mean and (population) std of uint8 images [n, H, W, C] scaled to [0, 1].

  Exact integer sums over chunks of ``chunk`` images (no float32 accumulation), so the
  result does not depend on the array's size or order.

  >>> channel_stats(np.array([[[[0, 255]]], [[[255, 255]]]], np.uint8))
  ((0.5, 1.0), (0.5, 0.0))
  """
  c = x.shape[-1]
  total, squares = np.zeros(c, np.uint64), np.zeros(c, np.uint64)
  for start in range(0, len(x), chunk):
    part = x[start:start + chunk].reshape(-1, c).astype(np.uint64)
    total += part.sum(0)
    squares += (part * part).sum(0)
  n = x.size // c
  mean = total.astype(np.float64) / n / 255.0
  var = np.maximum(squares.astype(np.float64) / n / 255.0 ** 2 - mean ** 2, 0.0)
  return tuple(float(m) for m in mean), tuple(float(s) for s in np.sqrt(var))


def parse_floats(text: str) -> tuple[float, ...]:
  """``'0.5,0.25'`` -> ``(0.5, 0.25)``; ``''`` -> ``()`` (ValueError if not numbers)."""
  return tuple(float(v) for v in text.split(",")) if text.strip() else ()


def normalization(name: str, raw: RawData, mean: str = "", std: str = ""
                  ) -> tuple[tuple[float, ...], tuple[float, ...]]:
  """The per-channel ``(mean, std)`` that ``preprocess.normalize`` uses for a dataset.

  Args:
    name: the dataset's name.
    raw: its arrays.
    mean, std: ``config.data.mean`` / ``data.std`` (comma-separated, one per channel);
      empty: CIFAR's statistics for the built-in datasets (both use CIFAR-10's, as
      always), else ``channel_stats`` of the training split.

  Raises:
    DataFormatError: given statistics whose count differs from the images' channels.
  """
  channels = raw.image_shape[-1]
  if mean:
    stats = parse_floats(mean), parse_floats(std)
    if len(stats[0]) != channels:
      raise DataFormatError(f"config.data.mean={mean!r} has {len(stats[0])} values but the "
                            f"images of {name!r} have {channels} channel(s)")
    return stats
  if name in DATASETS:
    return tuple(CIFAR_MEAN), tuple(CIFAR_STD)
  mean, std = channel_stats(raw.x_train)
  return mean, tuple(s if s > 0 else 1.0 for s in std)  # a constant channel stays 0


def make_synthetic(num_train: int, num_test: int, num_classes: int, seed: int,
                   image_shape: tuple[int, int, int] = IMAGE_SHAPE) -> RawData:
  """Small deterministic random data whose classes are learnable, for tests.

  Every class has a random mean image (uniform in [32, 224]); an example is its class
  mean plus Gaussian noise (std 24), clipped to uint8. Labels cycle through the classes
  and are shuffled, so every class appears ``n // num_classes`` or one more times.

  Args:
    num_train, num_test: examples per split.
    num_classes: number of classes.
    seed: seed of ``np.random.default_rng``.
    image_shape: shape of one image.

  Returns:
    ``RawData`` (train and test share the class means).
  """
  if num_classes < 1:
    raise ValueError(f"num_classes={num_classes}: must be >= 1")
  rng = np.random.default_rng(seed)
  means = rng.uniform(32, 224, size=(num_classes,) + tuple(image_shape))

  def split(n):
    y = rng.permutation(np.arange(n) % num_classes).astype(np.int32)
    x = means[y] + rng.normal(0.0, 24.0, size=(n,) + tuple(image_shape))
    return np.clip(np.round(x), 0, 255).astype(np.uint8), y

  x_train, y_train = split(num_train)
  x_test, y_test = split(num_test)
  return RawData(x_train, y_train, x_test, y_test, num_classes)
