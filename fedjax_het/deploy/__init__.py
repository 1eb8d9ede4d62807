"""Deployments: the algorithms' protocols run in separate processes.

``federation`` holds the transport-free client and server nodes; ``flower`` runs them
over Flower (``pip install -e '.[flower]'``; imported on demand, so the rest of
the library does not need Flower).
"""
from fedjax_het.deploy.federation import (ClientData, ClientNode, Federation, ServerNode,
                                          prepare_federation)

__all__ = ["ClientData", "ClientNode", "Federation", "ServerNode", "prepare_federation"]
