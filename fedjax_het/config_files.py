"""Loading Python config files (``get_config(arg)``); flattening configs to dotted keys.

One implementation for every caller: ``experiments/main.py`` (through
``fedjax_het.cli``), the Flower apps, the sweeps and the benchmarks.
"""
from __future__ import annotations

import importlib.util
import inspect
import os
import re
from typing import Mapping

import ml_collections


def load_module(path: str):
  """The Python file ``path`` imported as a module (a config file, or one it builds on).

  Raises:
    FileNotFoundError: ``path`` does not exist.
  """
  if not os.path.exists(path):
    raise FileNotFoundError(f"config file {path} does not exist")
  name = "_config_file_" + re.sub(r"\W", "_", os.path.abspath(path))
  spec = importlib.util.spec_from_file_location(name, path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def load_config_file(spec: str, arg: str | None = None):
  """``get_config(arg)`` of a config file, as ``config_flags`` loads it.

  Args:
    spec: ``path`` or ``path:arg`` (``experiments/fedmrl.py:smoke``).
    arg: the variant, when not given in ``spec``.

  Raises:
    FileNotFoundError: no such file.
    ValueError: the file defines no ``get_config``, or is given a variant while its
      ``get_config()`` takes no argument.
  """
  path, _, suffix = spec.partition(":")
  arg = arg or suffix or None
  module = load_module(path)
  if not hasattr(module, "get_config"):
    raise ValueError(f"{path} defines no get_config(); it is not a config file")
  if arg and not inspect.signature(module.get_config).parameters:
    raise ValueError(f"{path} has no variants (its get_config() takes no argument); "
                     f"drop ':{arg}'")
  return module.get_config(arg) if arg else module.get_config()


def flatten(tree: Mapping, prefix: str = "") -> dict:
  """Nested mappings (dicts, ConfigDicts) as dotted keys: ``{'a': {'b': 1}}`` ->
  ``{'a.b': 1}``."""
  flat = {}
  for key, value in tree.items():
    if isinstance(value, (Mapping, ml_collections.ConfigDict)):
      flat.update(flatten(value, f"{prefix}{key}."))
    else:
      flat[f"{prefix}{key}"] = value
  return flat

