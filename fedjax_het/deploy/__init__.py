"""Deployments: the algorithms' protocols run in separate processes.

``federation`` holds the transport-free client and server nodes and the checks every
upload passes; ``flower`` runs them as a Flower App on Flower's Deployment Runtime,
``loopback`` starts a SuperLink and SuperNodes on one machine (``supernode``: Flower's
SuperNode kept in step with its replies), ``certs`` makes throwaway TLS certificates
and SuperNode keys for tests (``pip install -e '.[flower]'``; imported on demand, so the
rest of the library does not need Flower). The names below are ``federation``'s,
imported on first use: a SuperNode process (``python -m fedjax_het.deploy.supernode``)
loads nothing of JAX.
"""
import importlib

__all__ = ["ClientData", "ClientNode", "Federation", "ServerNode", "prepare_federation"]


def __getattr__(name):
  if name in __all__:
    return getattr(importlib.import_module("fedjax_het.deploy.federation"), name)
  raise AttributeError(f"module 'fedjax_het.deploy' has no attribute {name!r}")
