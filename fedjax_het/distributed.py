"""Multi-process (multi-controller) runs: joining, the primary process, host reads.

A simulation too big for one host runs as N processes (one per host, or several on one
machine), each started with the same command. After ``jax.distributed.initialize``
``jax.devices()`` lists every process's devices, the ``clients`` mesh spans them all,
and every process runs the same jitted program on its own shards (see
``docs/distributed.md``). This module holds the pieces that differ from a one-process
run:

- ``validate_flags`` / ``initialize``: join the run, checked before any JAX call;
- ``is_primary``: process 0 alone writes the run's JSON outputs and prints progress;
- ``sync``: a barrier, e.g. after process 0 has removed or written files;
- ``to_host``: numpy copies of (possibly sharded over other processes) results;
- ``all_true``: one process's verdict agreed by all (every process takes the same branch).

With one process every function reduces to the plain single-host behaviour.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import jax
import numpy as np
from jax.experimental import multihost_utils


class JoinArgs(NamedTuple):
  """How this process joins a multi-process run (``None`` fields: auto-detected).

  Attributes:
    coordinator_address: ``host:port`` of process 0's coordinator service.
    num_processes: processes in the run.
    process_id: this process's index in ``[0, num_processes)``.
  """
  coordinator_address: str | None = None
  num_processes: int | None = None
  process_id: int | None = None


def validate_flags(coordinator_address: str | None, num_processes: int | None,
                   process_id: int | None, auto: bool = False) -> JoinArgs | None:
  """Checks the multi-process flags of ``experiments/main.py`` (no JAX call).

  Args:
    coordinator_address: ``--coordinator_address`` (``host:port``) or None/''.
    num_processes: ``--num_processes`` or None.
    process_id: ``--process_id`` or None.
    auto: ``--distributed``: let JAX detect the cluster (SLURM, Open MPI, ...).

  Returns:
    ``JoinArgs`` to pass to ``initialize``, or None for a one-process run.

  Raises:
    ValueError: some but not all of the three explicit flags, ``--distributed`` together
      with them, a malformed address, or a process id out of range.
  """
  given = {"--coordinator_address": coordinator_address or None,
           "--num_processes": num_processes, "--process_id": process_id}
  missing = [k for k, v in given.items() if v is None]
  if len(missing) == 3:
    return JoinArgs() if auto else None
  if auto:
    raise ValueError("--distributed auto-detects the cluster; do not combine it with "
                     f"{', '.join(k for k in given if k not in missing)}")
  if missing:
    raise ValueError(f"a multi-process run needs --coordinator_address, --num_processes "
                     f"and --process_id together; missing {', '.join(missing)}")
  host, _, port = coordinator_address.rpartition(":")
  if not host or not port.isdigit() or not 0 < int(port) < 65536:
    raise ValueError(f"--coordinator_address={coordinator_address!r}: expected host:port,"
                     " e.g. 10.0.0.1:1234 or localhost:1234")
  if num_processes < 1:
    raise ValueError(f"--num_processes={num_processes}: must be >= 1")
  if not 0 <= process_id < num_processes:
    raise ValueError(f"--process_id={process_id}: must lie in [0, {num_processes}) for "
                     f"--num_processes={num_processes}")
  return JoinArgs(coordinator_address, num_processes, process_id)


def initialize(join: JoinArgs | None) -> None:
  """Joins the run (``jax.distributed.initialize``); must precede every other JAX call.

  On CPU, cross-process collectives use gloo (jax's default
  ``jax_cpu_collectives_implementation``).

  Raises:
    ValueError: ``--distributed`` outside a cluster JAX recognizes.
  """
  if join is None:
    return
  try:
    jax.distributed.initialize(coordinator_address=join.coordinator_address,
                               num_processes=join.num_processes,
                               process_id=join.process_id)
  except ValueError as err:
    if join.coordinator_address is not None:
      raise
    raise ValueError(
        f"--distributed: JAX detected no cluster to join ({err}); run under SLURM's srun "
        "or Open MPI's mpirun, or give --coordinator_address, --num_processes and "
        "--process_id") from err


def is_primary() -> bool:
  """True on the process that writes the run's JSON outputs and prints (process 0)."""
  return jax.process_index() == 0


def sync(name: str) -> None:
  """Barrier across processes (no-op with one process); ``name`` must match on all."""
  if jax.process_count() > 1:
    multihost_utils.sync_global_devices(name)


def to_host(tree: Any) -> Any:
  """Numpy copy of every leaf, gathered from all processes when it is sharded over them.

  With one process this is ``np.asarray`` of every leaf; with several, an array whose
  shards live on other processes' devices is first replicated (a jitted identity, which
  moves bytes and computes nothing), so every process gets the same whole value.
  """
  if jax.process_count() == 1:
    return jax.tree.map(np.asarray, tree)
  return multihost_utils.process_allgather(tree, tiled=True)


def all_true(flag: bool) -> bool:
  """True when ``flag`` is True on every process (each process passes its own)."""
  if jax.process_count() == 1:
    return bool(flag)
  flags = multihost_utils.process_allgather(np.asarray([flag]), tiled=True)
  return bool(np.all(flags))
