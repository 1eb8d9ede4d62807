"""fedjax-het: model-heterogeneous personalized federated learning in JAX.

Research code extends it without editing it (docs/extending.md):
``register_algorithm`` and ``register_architecture`` name an algorithm's ``Spec`` or an
architecture factory in this process; a config names them anywhere by reference
(``'package.module:attribute'``, ``fedjax_het.plugins``). The names are imported on
first use, so ``import fedjax_het`` alone loads nothing of JAX.
"""
import importlib

_LAZY = {"register_algorithm": "fedjax_het.algorithms",
         "register_architecture": "fedjax_het.models"}


def __getattr__(name):
  if name in _LAZY:
    return getattr(importlib.import_module(_LAZY[name]), name)
  raise AttributeError(f"module 'fedjax_het' has no attribute {name!r}")


__all__ = sorted(_LAZY)
