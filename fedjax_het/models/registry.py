"""Architectures by name, which client gets which, and parameter counting.

The heterogeneous setting of FedMRL / pFedMoE assigns CNN-((k mod 5) + 1) to client k;
the homogeneous setting gives every client the same CNN.

Architectures of the user's own (docs/extending.md): wherever an architecture name is
accepted (``config.models``, ``algo.small_arch``, ...), a ``'package.module:factory'``
reference (``fedjax_het.plugins``) names an extractor factory ``factory(*, rep_dim,
dtype) -> flax.linen.Module`` (``models.custom``), and ``register_architecture`` gives
one a plain name in this process. ``config.models`` may also reference an *assignment*:
a function ``assign(client_id) -> architecture`` or a list of architectures.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_het import plugins
from fedjax_het.models.cnn import CNN
from fedjax_het.models.cnn import CNNExtractor
from fedjax_het.models.custom import Classifier


class ArchSpec(NamedTuple):
  """Layer widths of one architecture.

  Attributes:
    conv_features: output channels of each 5x5 convolution.
    fc_features: widths of the hidden FC layers before the representation layer (whose
      width is ``rep_dim``, chosen when the model is built).
  """
  conv_features: tuple[int, ...]
  fc_features: tuple[int, ...]


ARCHITECTURES: dict[str, ArchSpec] = {
    "cnn1": ArchSpec((16, 32), (2000,)),
    "cnn2": ArchSpec((16, 16), (2000,)),
    "cnn3": ArchSpec((16, 32), (1000,)),
    "cnn4": ArchSpec((16, 32), (800,)),
    "cnn5": ArchSpec((16, 32), (500,)),
    "tiny": ArchSpec((4, 8), (32,)),  # test-only: conv4-conv8-FC32-FC(rep_dim)
    # test-only: a second cheap architecture, so tests and CI-sized runs have two groups
    # of clients without compiling a CNN-1..5 (conv4-conv6-FC24-FC(rep_dim))
    "tiny2": ArchSpec((4, 6), (24,)),
}
HETEROGENEOUS = ("cnn1", "cnn2", "cnn3", "cnn4", "cnn5")
# Valid values of the config key `models`.
MODEL_CHOICES = ("heterogeneous",) + tuple(ARCHITECTURES)
# Extractor factories registered by research code in this process (register_architecture).
REGISTERED: dict[str, Callable] = {}
REFERENCE_HINT = "or a 'package.module:factory' reference"


def arch_spec(name: str) -> ArchSpec:
  """The ``ArchSpec`` of ``name``; ValueError listing the valid names otherwise."""
  if name not in ARCHITECTURES:
    raise ValueError(f"unknown architecture {name!r}; valid: {list(ARCHITECTURES)}")
  return ARCHITECTURES[name]


def register_architecture(name: str, factory: Callable) -> None:
  """Makes an extractor factory usable as architecture ``name`` in this process.

  For research code composing in Python; a command line (``experiments/main.py``, the
  sweep, Flower's processes) cannot see a registration, so there name the factory by a
  reference (``--config.models=my_project.my_models:mlp``). Registering a name again
  replaces the earlier factory; built-in names cannot be replaced.

  Args:
    name: a Python identifier, not a built-in architecture.
    factory: ``factory(*, rep_dim, dtype) -> flax.linen.Module`` mapping images
      [B, H, W, C] to ``(rep [B, rep_dim], features dict)`` (``models.custom``).
  """
  if not isinstance(name, str) or not name.isidentifier():
    raise ValueError(f"register_architecture: name {name!r} must be a Python identifier")
  if name in ARCHITECTURES or name == "heterogeneous":
    raise ValueError(f"register_architecture: {name!r} is built in; choose another name "
                     f"(built-ins: {list(MODEL_CHOICES)})")
  if _kind(factory) != "factory":
    raise ValueError(f"register_architecture({name!r}, ...): expected a factory taking "
                     "keyword arguments rep_dim and dtype")
  REGISTERED[name] = factory


def _kind(obj) -> str:
  """'factory' (takes ``rep_dim``), 'assignment' (another callable), 'list' or 'other'."""
  if isinstance(obj, (list, tuple)):
    return "list"
  if not callable(obj):
    return "other"
  try:
    params = inspect.signature(obj).parameters
  except (TypeError, ValueError):
    return "other"
  return "factory" if "rep_dim" in params else "assignment"


def factory_of(name: str, key: str = "models") -> Callable | None:
  """The extractor factory of architecture ``name``; None for a built-in CNN.

  Raises:
    ValueError: naming config key ``key``: ``name`` is no architecture (with the valid
      names), or a reference that cannot be resolved or does not name a factory.
  """
  if name in ARCHITECTURES:
    return None
  if name in REGISTERED:
    return REGISTERED[name]
  if plugins.is_reference(name):
    obj = plugins.resolve(name, key)
    if _kind(obj) != "factory":
      raise ValueError(f"config.{key}: {name!r} names a {type(obj).__name__} that is no "
                       "architecture factory: expected factory(*, rep_dim, dtype) -> "
                       "flax.linen.Module")
    return obj
  raise ValueError(f"unknown architecture {name!r} in config.{key}; valid: "
                   f"{list(ARCHITECTURES) + list(REGISTERED)} {REFERENCE_HINT}")


def is_architecture(name: str, key: str = "models") -> bool:
  """Whether ``name`` is a built-in, registered or referenced architecture.

  A reference that does not resolve raises (its message says why) rather than
  answering False.
  """
  if not isinstance(name, str):
    return False
  if name in ARCHITECTURES or name in REGISTERED:
    return True
  return plugins.is_reference(name) and factory_of(name, key) is not None


class ArchitectureChoices:
  """The valid values of an architecture-valued ``algo`` key (a ``Spec.choices`` entry).

  Contains every built-in and registered architecture and every reference to a
  factory, plus ``extra`` values (Moss's ``'auto'``); iterating lists the names.
  """

  def __init__(self, extra: tuple[str, ...] = (), key: str = "algo"):
    self.extra, self.key = tuple(extra), key

  def __contains__(self, value) -> bool:
    return value in self.extra or is_architecture(value, self.key)

  def __iter__(self):
    return iter(self.extra + tuple(ARCHITECTURES) + tuple(REGISTERED))

  def __repr__(self) -> str:
    return f"{list(self)} {REFERENCE_HINT}"


def _check_positive(**dims: int) -> None:
  for key, value in dims.items():
    if not isinstance(value, int) or value < 1:
      raise ValueError(f"{key} must be a positive int, got {value!r}")


def get_model(name: str, *, num_classes: int, rep_dim: int = 500,
              dtype: Any = jnp.float32) -> CNN:
  """The ``CNN`` of architecture ``name``.

  Args:
    name: one of ``ARCHITECTURES`` ('cnn1'..'cnn5', 'tiny'), a registered name or a
      ``'package.module:factory'`` reference.
    num_classes: number of classes C of the header.
    rep_dim: width of the representation (last extractor layer).
    dtype: computation dtype (params are float32).

  Returns:
    An unbound ``CNN`` (a ``custom.Classifier`` for a factory's architecture); its
    params tree is ``{'extractor': ..., 'header': ...}``.
  """
  _check_positive(num_classes=num_classes, rep_dim=rep_dim)
  factory = factory_of(name)
  if factory is not None:
    return Classifier(factory(rep_dim=rep_dim, dtype=dtype), num_classes, rep_dim, dtype)
  spec = arch_spec(name)
  return CNN(spec.conv_features, spec.fc_features, num_classes, rep_dim, dtype)


def get_extractor(name: str, *, rep_dim: int = 500, dtype: Any = jnp.float32
                  ) -> CNNExtractor:
  """The feature extractor of architecture ``name`` alone.

  FedMoE's shared global expert is ``get_extractor('cnn5')``; its params have the same
  tree as ``get_model('cnn5', ...)``'s ``params['extractor']``.

  Args:
    name: one of ``ARCHITECTURES``, a registered name or a reference.
    rep_dim: width of the representation.
    dtype: computation dtype (params are float32).

  Returns:
    An unbound ``CNNExtractor`` (the factory's module for a factory's architecture);
    ``apply`` returns ``(rep [B, rep_dim], features)``.
  """
  _check_positive(rep_dim=rep_dim)
  factory = factory_of(name)
  if factory is not None:
    return factory(rep_dim=rep_dim, dtype=dtype)
  spec = arch_spec(name)
  return CNNExtractor(spec.conv_features, spec.fc_features, rep_dim, dtype)


def client_archs(models: str, num_clients: int) -> list[str]:
  """Architecture name of each client.

  Args:
    models: the config key ``models``: 'heterogeneous' (client k gets
      ``HETEROGENEOUS[k % 5]``), one architecture (every client gets it), or a
      comma-separated list of them (client k gets the (k mod len)-th), e.g.
      'tiny,cnn5' for a small heterogeneous federation. An architecture is a built-in
      or registered name or a ``'package.module:factory'`` reference. A single
      reference may instead name an assignment: a function ``assign(client_id) ->
      architecture`` or a list of architectures (cycled).
    num_clients: number of clients K.

  Returns:
    A list of K architecture names.

  >>> client_archs('heterogeneous', 6)
  ['cnn1', 'cnn2', 'cnn3', 'cnn4', 'cnn5', 'cnn1']
  """
  if models == "heterogeneous":
    return [HETEROGENEOUS[k % len(HETEROGENEOUS)] for k in range(num_clients)]
  names = models.split(",") if isinstance(models, str) else []
  if len(names) == 1 and plugins.is_reference(names[0]):
    assigned = _assignment(names[0], num_clients)
    if assigned is not None:
      return assigned
  if names and all(is_architecture(name) for name in names):
    return [names[k % len(names)] for k in range(num_clients)]
  raise ValueError(f"config key `models` = {models!r} is not valid; valid values: "
                   f"{list(MODEL_CHOICES) + list(REGISTERED)}, a comma-separated list of "
                   f"architectures, {REFERENCE_HINT} (or to an assignment)")


def _assignment(ref: str, num_clients: int) -> list[str] | None:
  """The clients' architectures of a reference to an assignment; None for a factory."""
  obj = plugins.resolve(ref, "models")
  kind = _kind(obj)
  if kind == "factory":
    return None
  if kind == "list":
    archs = [obj[k % len(obj)] for k in range(num_clients)] if obj else []
  elif kind == "assignment":
    archs = [obj(k) for k in range(num_clients)]
  else:
    raise ValueError(f"config.models={ref!r} names a {type(obj).__name__}; expected an "
                     "architecture factory(*, rep_dim, dtype), an assignment function "
                     "assign(client_id) -> architecture, or a list of architectures")
  for k, arch in enumerate(archs):
    if arch == "heterogeneous" or not is_architecture(arch):
      raise ValueError(f"config.models={ref!r} gives client {k} {arch!r}, which is no "
                       f"architecture; valid: {list(ARCHITECTURES) + list(REGISTERED)} "
                       f"{REFERENCE_HINT}")
  return archs


def check_architectures(archs, image_shape: tuple[int, ...], num_classes: int,
                        rep_dim: int = 500) -> None:
  """Raises ValueError unless every architecture accepts the images (shapes only).

  Traces each model's ``init`` with ``jax.eval_shape`` on one image of ``image_shape``
  (no compute), so images too small for a CNN's two convolutions, or a factory's
  module that does not return ``(rep [B, rep_dim], features)``, fail before anything
  runs, naming the architecture.
  """
  x = jnp.zeros((1,) + tuple(image_shape), jnp.float32)
  for arch in dict.fromkeys(archs):
    factory = factory_of(arch)
    if factory is not None:
      out = _traced(arch, image_shape, lambda f=factory: f(rep_dim=rep_dim, dtype=jnp.float32)
                    .init_with_output(jax.random.PRNGKey(0), x)[0])
      if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)
              and getattr(out[0], "shape", None) == (1, rep_dim)):
        got = jax.tree.map(lambda a: tuple(a.shape), out)
        raise ValueError(f"architecture {arch!r}: its module returned {got} for one "
                         f"image; expected (rep of shape (1, rep_dim={rep_dim}), dict of "
                         "features)")
    model = get_model(arch, num_classes=num_classes, rep_dim=rep_dim)
    _traced(arch, image_shape, lambda m=model: m.init(jax.random.PRNGKey(0), x))


def _traced(arch: str, image_shape, fn: Callable):
  """``jax.eval_shape(fn)``; a tracing error becomes a ValueError naming ``arch``."""
  try:
    return jax.eval_shape(fn)
  except Exception as err:  # noqa: BLE001 - a tracing error here is about the shapes
    hint = (" (the CNNs' two 5x5 convolutions and 2x2 poolings need images of at least "
            "16x16)" if arch in ARCHITECTURES else "")
    raise ValueError(f"architecture {arch!r} cannot take images of shape "
                     f"{tuple(image_shape)}{hint}: {type(err).__name__}: {err}") from err


def count_params(params: Any) -> int:
  """Number of scalars in a params pytree (arrays or ``jax.ShapeDtypeStruct``s)."""
  return int(sum(int(x.size) for x in jax.tree.leaves(params)))
