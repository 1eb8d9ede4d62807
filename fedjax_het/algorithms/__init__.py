"""Algorithms: one module each, read side by side with its paper.

Every module defines a factory (``fedmrl.fedmrl(rt, ...) -> Algorithm``) and a ``SPEC``
saying how the experiment runner builds it from a config; ``SPECS`` maps the config's
``algorithm`` name to it. Research code can call the factories directly. The names below
are the modules (``algorithms.fedmrl.fedmrl`` is the factory).
"""
from __future__ import annotations

from fedjax_het.algorithms import fedapen
from fedjax_het.algorithms import fedavg
from fedjax_het.algorithms import fedkd
from fedjax_het.algorithms import fedmoe
from fedjax_het.algorithms import fedmrl
from fedjax_het.algorithms import fd
from fedjax_het.algorithms import fedproto
from fedjax_het.algorithms import fml
from fedjax_het.algorithms import lg_fedavg
from fedjax_het.algorithms import moss
from fedjax_het.algorithms import standalone
from fedjax_het.algorithms.base import Algorithm, ClientState, Protocol, Runtime, Spec, State

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

__all__ = ["Algorithm", "ClientState", "Protocol", "Runtime", "SPECS", "Spec", "State", "fd",
           "fedapen", "fedavg", "fedkd", "fedmoe", "fedmrl", "fedproto", "fml", "lg_fedavg",
           "moss", "standalone"]
