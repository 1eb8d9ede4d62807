"""Device placement of the client axis.

Clients are stacked on a leading axis; that axis is sharded over a 1-D mesh named
``'clients'`` (``jax.make_mesh`` + ``NamedSharding``, no ``pmap``). Everything that is not
per-client (pooled images, server parameters) is replicated. The mesh uses ``Auto`` axis
types so XLA propagates shardings through gathers and scatters of sampled clients.

In a multi-process run (``fedjax_het.distributed``) the mesh spans every process's
devices; ``put`` builds each process's shards from its own host copy.
"""
from __future__ import annotations

import jax
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

CLIENT_AXIS = "clients"


def client_mesh(num_devices: int = 0, devices: list | None = None) -> jax.sharding.Mesh:
  """A 1-D mesh over ``num_devices`` devices (0: all of them, of every process).

  ``devices``: the devices to take them from, in order, instead of jax's (a deviceless
  compile's, ``training.deviceless``).
  """
  every = jax.devices() if devices is None else list(devices)
  n = len(every) if num_devices in (0, None) else num_devices
  if not 1 <= n <= len(every):
    raise ValueError(
        f"runtime.num_devices={num_devices}: must be 0 (all) or in [1, {len(every)}]"
        f" (devices: {every})")
  return jax.make_mesh((n,), (CLIENT_AXIS,),
                       axis_types=(jax.sharding.AxisType.Auto,),
                       devices=mesh_devices(n) if devices is None else every[:n])


def mesh_devices(n: int) -> list:
  """The first ``n`` devices, or in a multi-process run ``n / P`` of each process's.

  Every process of a multi-process run must own part of the mesh (each runs the same
  program on its own shards), so ``n`` must then be a multiple of the process count.
  """
  procs = jax.process_count()
  if procs == 1:
    return jax.devices()[:n]
  if n % procs:
    raise ValueError(f"runtime.num_devices={n}: a run of {procs} processes needs 0 (all) "
                     f"or a multiple of {procs} (the same number of devices from each)")
  by_process = {}
  for d in jax.devices():
    by_process.setdefault(d.process_index, []).append(d)
  return [d for p in sorted(by_process) for d in by_process[p][:n // procs]]


def client_sharding(mesh: jax.sharding.Mesh, replicas: bool = False) -> NamedSharding:
  """Sharding of arrays whose leading axis is the client axis.

  With ``replicas`` the arrays have a leading replica axis (independent runs stacked,
  ``loop.run_seeds``), kept whole on every device, and the client axis second.
  """
  return NamedSharding(mesh, P(None, CLIENT_AXIS) if replicas else P(CLIENT_AXIS))


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


def put(a, spec: NamedSharding) -> jax.Array:
  """One leaf onto ``spec``; across processes every process must pass the same value.

  A sharding within this process (one-process runs) is a plain ``jax.device_put``. One
  spanning other processes' devices cannot be filled by ``device_put`` from here, so each
  process builds its own shards from its (identical) host copy
  (``jax.make_array_from_callback``).
  """
  if spec.is_fully_addressable or (isinstance(a, jax.Array) and not a.is_fully_addressable):
    return jax.device_put(a, spec)
  host = np.asarray(a)
  return jax.make_array_from_callback(host.shape, spec, lambda index: host[index])


def place_clients(tree, mesh: jax.sharding.Mesh, replicas: bool = False):
  """Puts a pytree whose leaves all have a leading client axis onto the mesh.

  ``replicas``: the leaves are ``[replicas, clients, ...]`` (``client_sharding``).
  """
  spec = client_sharding(mesh, replicas)
  return jax.tree.map(
      lambda a: put(np.asarray(a) if not isinstance(a, jax.Array) else a, spec), tree)


def place_replicated(tree, mesh: jax.sharding.Mesh):
  """Replicates a pytree on every device of the mesh."""
  spec = replicated(mesh)
  return jax.tree.map(lambda a: put(a, spec), tree)
