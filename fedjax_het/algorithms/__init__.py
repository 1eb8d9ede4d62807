"""Algorithms: one module each, read side by side with its paper.

Every module defines a factory (``fedmrl.fedmrl(rt, ...) -> Algorithm``) and a ``SPEC``
saying how the experiment runner builds it from a config; ``SPECS`` maps the config's
``algorithm`` name to it. Research code can call the factories directly. The names below
are the modules (``algorithms.fedmrl.fedmrl`` is the factory).

An algorithm of the user's own (docs/extending.md) is named in the config by a
reference to its ``Spec``, ``config.algorithm = 'my_project.my_algo:SPEC'``
(``get_spec`` imports it; the config then describes the run in every process), or
registered under a plain name in this process with ``register_algorithm``.

No algorithm module imports another: what several are built from is in ``shared``
(models, classifier loss, the example-weighted average, the averaging round,
``from_protocol``), ``class_tables`` (FedProto's and FD's per-class tables) and
``mutual`` (the shared-beside-private protocol of FML, FedKD and FedAPEN). ``api`` is
the contract an algorithm is written against, ``rounds`` the machinery that runs it.
"""
from __future__ import annotations

from fedjax_het import plugins
from fedjax_het.algorithms import fd
from fedjax_het.algorithms import fedapen
from fedjax_het.algorithms import fedavg
from fedjax_het.algorithms import fedkd
from fedjax_het.algorithms import fedmoe
from fedjax_het.algorithms import fedmrl
from fedjax_het.algorithms import fedproto
from fedjax_het.algorithms import fml
from fedjax_het.algorithms import lg_fedavg
from fedjax_het.algorithms import moss
from fedjax_het.algorithms import standalone
from fedjax_het.algorithms.api import Algorithm
from fedjax_het.algorithms.api import ClientState
from fedjax_het.algorithms.api import Protocol
from fedjax_het.algorithms.api import Runtime
from fedjax_het.algorithms.api import Spec
from fedjax_het.algorithms.api import State

SPECS: dict[str, Spec] = {
    "standalone": standalone.SPEC,
    "fedavg": fedavg.SPEC,
    "fedmrl": fedmrl.SPEC,
    "fedmoe": fedmoe.SPEC,
    "lg_fedavg": lg_fedavg.SPEC,
    "fd": fd.SPEC,
    "fedproto": fedproto.SPEC,
    "moss": moss.SPEC,
    "fml": fml.SPEC,
    "fedkd": fedkd.SPEC,
    "fedapen": fedapen.SPEC,
}

# Algorithms registered by research code in this process (``register_algorithm``).
REGISTERED: dict[str, Spec] = {}


def register_algorithm(name: str, spec: Spec) -> None:
  """Makes ``spec`` runnable as ``config.algorithm = name`` in this process.

  For research code that composes in Python (a notebook, its own sweep driver). A
  registration lives in the process that made it: runs started by a command line
  (``experiments/main.py``, the sweep command, Flower's processes) cannot see it, so
  there name the spec by a reference (``config.algorithm = 'my_project.my_algo:SPEC'``).
  Registering a name again replaces the earlier spec; built-in names cannot be replaced.

  Raises:
    ValueError: ``name`` is a built-in algorithm, is not an identifier, or ``spec`` is
      not a ``Spec``.
  """
  if not isinstance(name, str) or not name.isidentifier():
    raise ValueError(f"register_algorithm: name {name!r} must be a Python identifier")
  if name in SPECS:
    raise ValueError(f"register_algorithm: {name!r} is a built-in algorithm; choose "
                     f"another name (built-ins: {sorted(SPECS)})")
  if not isinstance(spec, Spec):
    raise ValueError(f"register_algorithm({name!r}, ...): expected a "
                     f"fedjax_het.algorithms.Spec, got {type(spec).__name__}")
  REGISTERED[name] = spec


def algorithm_names() -> list[str]:
  """The plain names ``config.algorithm`` accepts: built-ins, then registered ones."""
  return list(SPECS) + [n for n in REGISTERED if n not in SPECS]


def get_spec(name: str) -> Spec:
  """The ``Spec`` of ``config.algorithm``: a built-in or registered name, or a reference.

  Raises:
    ValueError: naming ``config.algorithm`` and the valid names, or what is wrong with
      the reference (module not importable, no such attribute, not a ``Spec``).
  """
  if isinstance(name, str) and name in SPECS:
    return SPECS[name]
  if isinstance(name, str) and name in REGISTERED:
    return REGISTERED[name]
  if plugins.is_reference(name):
    spec = plugins.resolve(name, "algorithm")
    if not isinstance(spec, Spec):
      raise ValueError(f"config.algorithm={name!r} names a {type(spec).__name__}; "
                       "expected a fedjax_het.algorithms.Spec (the SPEC of an algorithm "
                       "module)")
    return spec
  raise ValueError(f"config.algorithm={name!r} is invalid: valid choices are "
                   f"{algorithm_names()}, or a 'package.module:SPEC' reference to the "
                   "Spec of an algorithm of your own")


def averages(name: str) -> bool:
  """Whether the algorithm ``config.algorithm = name`` averages one parameter set every
  group uploads alike (``Spec.averages``): a deployment may then aggregate robustly
  (``fedjax_het.deploy.robust``). A built-in, registered or referenced name."""
  return get_spec(name).averages


__all__ = ["Algorithm", "ClientState", "Protocol", "REGISTERED", "Runtime", "SPECS", "Spec",
           "State", "algorithm_names", "averages", "fd", "fedapen", "fedavg", "fedkd", "fedmoe",
           "fedmrl", "fedproto", "fml", "get_spec", "lg_fedavg", "moss",
           "register_algorithm", "standalone"]
