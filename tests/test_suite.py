"""The test suite's own setup: tests that share a heavy fixture run on one worker."""
import os

import pytest


@pytest.mark.xdist_group("flower")
def test_loadgroup_keeps_a_group_on_one_worker(request):
  """Under ``-n 2`` (pyproject's ``--dist loadgroup``), a test of the ``flower`` group
  carries the group in its node id: xdist schedules the group as one unit, so the
  Flower tests' module-scoped federation is built once. pytest 9.2 broke this silently
  (pytest-dev/pytest-xdist#1386); the dev extra pins below it."""
  if not os.environ.get("PYTEST_XDIST_WORKER"):
    pytest.skip("not run by pytest-xdist")
  assert request.node.nodeid.endswith("@flower"), request.node.nodeid
