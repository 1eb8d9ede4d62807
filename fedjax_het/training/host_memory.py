"""Handing the host heap's freed pages back to the system between dispatches.

A run on the CPU backend frees large buffers every round, and a checkpoint copies the
whole state to host memory and frees it again, much of it in orbax's threads. glibc's
allocator keeps what they free in its arenas for reuse, so a process's resident memory
only grows: one seed of the ledger's N=100 FedMRL cell (2.36 GiB of state) sat at
4.0 GiB before its first checkpoint, 5.6 GiB after it and 5.9 GiB after the second, and
peaked at 7.4 GiB over 24 rounds. ``malloc_trim(0)`` after every dispatch returns the
free pages: 3.1 GiB between dispatches, a 5.7 GiB peak, rounds as fast
(docs/performance.md, "Seeds on a replica axis").
"""
from __future__ import annotations

import ctypes
import functools


@functools.cache
def _malloc_trim():
  """glibc's ``malloc_trim``, or None (another C library, or not Linux)."""
  try:
    return ctypes.CDLL("libc.so.6").malloc_trim
  except (OSError, AttributeError):
    return None


def release_freed() -> bool:
  """Returns the heap's free pages to the system (glibc's ``malloc_trim(0)``).

  Frees nothing that is in use; costs milliseconds. Returns whether it could run (False
  where the C library has no ``malloc_trim``).
  """
  trim = _malloc_trim()
  if trim is None:
    return False
  trim(0)
  return True
