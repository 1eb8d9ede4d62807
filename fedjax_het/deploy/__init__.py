"""Deployments: the algorithms' protocols run in separate processes.

``federation`` holds the transport-free client and server nodes and the checks every
upload passes; ``flower`` runs them as a Flower App on Flower's Deployment Runtime,
``loopback`` starts a SuperLink and SuperNodes on one machine, ``certs`` makes
throwaway TLS certificates and SuperNode keys for tests (``pip install -e
'.[flower]'``; imported on demand, so the rest of the library does not need Flower).
"""
from fedjax_het.deploy.federation import ClientData
from fedjax_het.deploy.federation import ClientNode
from fedjax_het.deploy.federation import Federation
from fedjax_het.deploy.federation import ServerNode
from fedjax_het.deploy.federation import prepare_federation

__all__ = ["ClientData", "ClientNode", "Federation", "ServerNode", "prepare_federation"]
