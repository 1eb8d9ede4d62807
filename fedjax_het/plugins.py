"""References to research code outside the package: ``'package.module:attribute'``.

A config names an algorithm (``config.algorithm``), a client architecture or an
assignment of architectures to clients (``config.models``, the ``algo`` keys that take
an architecture) that lives in the user's own module by such a reference, e.g.
``--config.algorithm=my_project.my_algo:SPEC``. The config then describes the whole run:
a resumed run, every run of a sweep and every process of a Flower deployment import
the same object again from the same reference (docs/extending.md).

Where modules are found: as Python finds any import (``sys.path``: ``PYTHONPATH``, the
installed packages), plus the current working directory, which ``resolve`` appends to
``sys.path`` when it is missing (``python experiments/main.py`` puts ``experiments/``
first, not the current directory); so ``my_project.my_algo:SPEC`` resolves when the
command runs from the directory holding ``my_project/``. The package itself never names a user's module.
"""
from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any

# package.module:attribute (dotted on both sides: 'pkg.mod:Class.method' also works)
_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
REFERENCE = re.compile(rf"^{_DOTTED}:{_DOTTED}$")


def is_reference(value: Any) -> bool:
  """Whether ``value`` has the form ``'package.module:attribute'``.

  >>> is_reference("my_project.my_algo:SPEC"), is_reference("fedavg")
  (True, False)
  """
  return isinstance(value, str) and bool(REFERENCE.match(value))


def _import(module_name: str, key: str, ref: str):
  """``importlib.import_module`` with the current directory importable and errors that
  name the config key."""
  cwd = os.getcwd()
  if "" not in sys.path and cwd not in sys.path:
    sys.path.append(cwd)
  try:
    return importlib.import_module(module_name)
  except ModuleNotFoundError as err:
    if err.name and (module_name == err.name or module_name.startswith(err.name + ".")):
      raise ValueError(
          f"config.{key}={ref!r}: module {module_name!r} cannot be imported ({err}); it "
          f"must be importable from the current directory ({cwd}) or a directory on "
          "PYTHONPATH (e.g. PYTHONPATH=/path/to/my_project)") from err
    raise ValueError(f"config.{key}={ref!r}: importing {module_name!r} failed: {err}") \
        from err
  except Exception as err:  # noqa: BLE001 - the user's module failed to import
    raise ValueError(f"config.{key}={ref!r}: importing {module_name!r} failed: "
                     f"{type(err).__name__}: {err}") from err


def resolve(ref: str, key: str) -> Any:
  """The object that ``ref`` (``'package.module:attribute'``) names.

  Args:
    ref: the reference.
    key: the config key it was given in, for error messages (``'algorithm'``).

  Returns:
    ``getattr(import_module('package.module'), 'attribute')``.

  Raises:
    ValueError: naming ``key``: ``ref`` is not a reference, the module cannot be
      imported (with a hint at ``PYTHONPATH``), or it has no such attribute (listing the
      public names it has).
  """
  if not is_reference(ref):
    raise ValueError(f"config.{key}={ref!r} is not a 'package.module:attribute' "
                     "reference")
  module_name, attr = ref.split(":")
  obj = _import(module_name, key, ref)
  for part in attr.split("."):
    if not hasattr(obj, part):
      names = sorted(n for n in dir(obj) if not n.startswith("_"))
      raise ValueError(f"config.{key}={ref!r}: {module_name!r} has no attribute "
                       f"{attr!r}; its public names are {names}")
    obj = getattr(obj, part)
  return obj
