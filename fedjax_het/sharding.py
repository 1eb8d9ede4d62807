"""Device placement of the client axis.

Clients are stacked on a leading axis; that axis is sharded over a 1-D mesh named
``'clients'`` (``jax.make_mesh`` + ``NamedSharding``, no ``pmap``). Everything that is not
per-client (pooled images, server parameters) is replicated. The mesh uses ``Auto`` axis
types so XLA propagates shardings through gathers and scatters of sampled clients.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

CLIENT_AXIS = "clients"


def client_mesh(num_devices: int = 0) -> jax.sharding.Mesh:
  """A 1-D mesh over the first ``num_devices`` devices (0: all of them)."""
  available = jax.device_count()
  n = available if num_devices in (0, None) else num_devices
  if not 1 <= n <= available:
    raise ValueError(
        f"runtime.num_devices={num_devices}: must be 0 (all) or in [1, {available}]"
        f" (devices: {jax.devices()})")
  return jax.make_mesh((n,), (CLIENT_AXIS,),
                       axis_types=(jax.sharding.AxisType.Auto,),
                       devices=jax.devices()[:n])


def client_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Sharding of arrays whose leading axis is the client axis."""
  return NamedSharding(mesh, P(CLIENT_AXIS))


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
  """Sharding of arrays every device holds whole."""
  return NamedSharding(mesh, P())


def round_up(n: int, multiple: int) -> int:
  """Smallest multiple of ``multiple`` that is >= ``n``."""
  return -(-n // multiple) * multiple


def constrain_clients(tree, mesh: jax.sharding.Mesh | None):
  """Inside jit: asks XLA to keep the leading (client) axis of every leaf sharded."""
  if mesh is None or mesh.size == 1:
    return tree
  spec = client_sharding(mesh)
  return jax.tree.map(lambda a: jax.lax.with_sharding_constraint(a, spec), tree)


def place_clients(tree, mesh: jax.sharding.Mesh):
  """Puts a pytree whose leaves all have a leading client axis onto the mesh."""
  spec = client_sharding(mesh)
  return jax.tree.map(lambda a: jax.device_put(np.asarray(a) if not isinstance(a, jax.Array) else a, spec), tree)


def place_replicated(tree, mesh: jax.sharding.Mesh):
  """Replicates a pytree on every device of the mesh."""
  spec = replicated(mesh)
  return jax.tree.map(lambda a: jax.device_put(a, spec), tree)
