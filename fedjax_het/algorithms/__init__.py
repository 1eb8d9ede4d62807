"""Algorithms: one module each, read side by side with its paper.

Every module defines a factory (``fedmrl(rt, ...) -> Algorithm``) and a ``SPEC`` saying
how the experiment runner builds it from a config; ``SPECS`` maps the config's
``algorithm`` name to it. Research code can call the factories directly.
"""
from __future__ import annotations

from fedjax_het.algorithms import fedavg as _fedavg
from fedjax_het.algorithms import fedmoe as _fedmoe
from fedjax_het.algorithms import fedmrl as _fedmrl
from fedjax_het.algorithms import standalone as _standalone
from fedjax_het.algorithms.base import Algorithm, ClientState, Runtime, Spec, State
from fedjax_het.algorithms.fedavg import fedavg
from fedjax_het.algorithms.fedmoe import fedmoe
from fedjax_het.algorithms.fedmrl import fedmrl
from fedjax_het.algorithms.standalone import standalone

SPECS: dict[str, Spec] = {
    "standalone": _standalone.SPEC,
    "fedavg": _fedavg.SPEC,
    "fedmrl": _fedmrl.SPEC,
    "fedmoe": _fedmoe.SPEC,
}

__all__ = ["Algorithm", "ClientState", "Runtime", "SPECS", "Spec", "State", "fedavg",
           "fedmoe", "fedmrl", "standalone"]
