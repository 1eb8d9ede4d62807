"""Architectures by name, which client gets which, and parameter counting.

The heterogeneous setting of FedMRL / pFedMoE assigns CNN-((k mod 5) + 1) to client k;
the homogeneous setting gives every client the same CNN.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from fedjax_het.models.cnn import CNN, CNNExtractor


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
}
HETEROGENEOUS = ("cnn1", "cnn2", "cnn3", "cnn4", "cnn5")
# Valid values of the config key `models`.
MODEL_CHOICES = ("heterogeneous",) + tuple(ARCHITECTURES)


def arch_spec(name: str) -> ArchSpec:
  """The ``ArchSpec`` of ``name``; ValueError listing the valid names otherwise."""
  if name not in ARCHITECTURES:
    raise ValueError(f"unknown architecture {name!r}; valid: {list(ARCHITECTURES)}")
  return ARCHITECTURES[name]


def _check_positive(**dims: int) -> None:
  for key, value in dims.items():
    if not isinstance(value, int) or value < 1:
      raise ValueError(f"{key} must be a positive int, got {value!r}")


def get_model(name: str, *, num_classes: int, rep_dim: int = 500,
              dtype: Any = jnp.float32) -> CNN:
  """The ``CNN`` of architecture ``name``.

  Args:
    name: one of ``ARCHITECTURES`` ('cnn1'..'cnn5', 'tiny').
    num_classes: number of classes C of the header.
    rep_dim: width of the representation (last extractor layer).
    dtype: computation dtype (params are float32).

  Returns:
    An unbound ``CNN``; its params tree is ``{'extractor': ..., 'header': ...}``.
  """
  spec = arch_spec(name)
  _check_positive(num_classes=num_classes, rep_dim=rep_dim)
  return CNN(spec.conv_features, spec.fc_features, num_classes, rep_dim, dtype)


def get_extractor(name: str, *, rep_dim: int = 500, dtype: Any = jnp.float32
                  ) -> CNNExtractor:
  """The feature extractor of architecture ``name`` alone.

  FedMoE's shared global expert is ``get_extractor('cnn5')``; its params have the same
  tree as ``get_model('cnn5', ...)``'s ``params['extractor']``.

  Args:
    name: one of ``ARCHITECTURES``.
    rep_dim: width of the representation.
    dtype: computation dtype (params are float32).

  Returns:
    An unbound ``CNNExtractor``; ``apply`` returns ``(rep [B, rep_dim], features)``.
  """
  spec = arch_spec(name)
  _check_positive(rep_dim=rep_dim)
  return CNNExtractor(spec.conv_features, spec.fc_features, rep_dim, dtype)


def client_archs(models: str, num_clients: int) -> list[str]:
  """Architecture name of each client.

  Args:
    models: the config key ``models``: 'heterogeneous' (client k gets
      ``HETEROGENEOUS[k % 5]``), one architecture name (every client gets it), or a
      comma-separated list of names (client k gets the (k mod len)-th), e.g.
      'tiny,cnn5' for a small heterogeneous federation.
    num_clients: number of clients K.

  Returns:
    A list of K architecture names.

  >>> client_archs('heterogeneous', 6)
  ['cnn1', 'cnn2', 'cnn3', 'cnn4', 'cnn5', 'cnn1']
  """
  if models == "heterogeneous":
    return [HETEROGENEOUS[k % len(HETEROGENEOUS)] for k in range(num_clients)]
  names = models.split(",")
  if all(name in ARCHITECTURES for name in names):
    return [names[k % len(names)] for k in range(num_clients)]
  raise ValueError(f"config key `models` = {models!r} is not valid; valid values: "
                   f"{list(MODEL_CHOICES)} or a comma-separated list of architectures")


def count_params(params: Any) -> int:
  """Number of scalars in a params pytree (arrays or ``jax.ShapeDtypeStruct``s)."""
  return int(sum(int(x.size) for x in jax.tree.leaves(params)))
