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


def test_census_sums_each_workers_span_and_wall_by_file(tmp_path, capsys):
  """tests/compile_census.py over two workers' files (conftest's census lines)."""
  import json

  import compile_census

  def line(where, start, wall, secs):
    return json.dumps({"where": where, "kind": "cpu", "fun": "", "secs": secs, "hit": None,
                       "start": start, "wall": wall})
  (tmp_path / "1.jsonl").write_text("\n".join([
      line("tests/test_a.py::t1 call", 100.0, 4.0, 3.0),
      line("tests/test_b.py::t2 call", 104.0, 6.0, 5.5)]) + "\n")
  (tmp_path / "2.jsonl").write_text(line("tests/test_a.py::t3 call", 101.0, 3.0, 1.0) + "\n"
                                    + json.dumps({"where": "tests/test_a.py::t3 call",
                                                  "kind": "compile", "fun": "jit(f)",
                                                  "secs": 0.5, "hit": False}) + "\n")
  compile_census.main(str(tmp_path))
  out = capsys.readouterr().out.splitlines()
  assert out[:5] == ["worker 1.jsonl: tests from 0 s to 10 s, 10 s in tests",
                     "worker 2.jsonl: tests from 1 s to 4 s, 3 s in tests",
                     "wall s by file (13 in all):",
                     "      7.0 s  tests/test_a.py",
                     "      6.0 s  tests/test_b.py"]
  assert "1 compiles, 1 misses: 0 s compiling, 0 s reading the cache" in out
