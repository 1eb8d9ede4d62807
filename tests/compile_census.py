"""Sums a census (tests/conftest.py's FEDJAX_HET_COMPILE_CENSUS): each worker's span and
wall seconds by test file, CPU seconds by test, then XLA compiles by test file, by test
and by function.

  FEDJAX_HET_COMPILE_CENSUS=/tmp/census python -m pytest -n 2 tests
  python tests/compile_census.py /tmp/census
"""
import collections
import glob
import json
import os
import sys


def main(directory, top=25):
  rows = []
  for path in sorted(glob.glob(os.path.join(directory, "*.jsonl"))):
    with open(path) as f:
      rows += [dict(json.loads(line), worker=os.path.basename(path))
               for line in f if line.strip()]
  cpu = [r for r in rows if r["kind"] == "cpu"]
  timed = [r for r in cpu if "wall" in r]
  if timed:
    t0 = min(r["start"] for r in timed)
    for worker in sorted({r["worker"] for r in timed}):
      mine = [r for r in timed if r["worker"] == worker]
      end = max(r["start"] + r["wall"] for r in mine)
      print(f"worker {worker}: tests from {min(r['start'] for r in mine) - t0:.0f} s to "
            f"{end - t0:.0f} s, {sum(r['wall'] for r in mine):.0f} s in tests")
    walls = collections.Counter()
    for r in timed:
      walls[r["where"].split("::")[0]] += r["wall"]
    print(f"wall s by file ({sum(walls.values()):.0f} in all):")
    for name, secs in walls.most_common(top):
      print(f"  {secs:7.1f} s  {name}")
  print(f"CPU: {sum(r['secs'] for r in cpu):.0f} s in the tests' processes and the "
        "subprocesses they waited for; by test:")
  for r in sorted(cpu, key=lambda r: -r["secs"])[:top]:
    print(f"  {r['secs']:7.1f} s  {r['where']}")
  for kind in ("trace", "lower"):
    print(f"{kind}: {sum(r['secs'] for r in rows if r['kind'] == kind):.0f} s")
  rows = [r for r in rows if r["kind"] == "compile"]
  misses = [r for r in rows if not r["hit"]]
  print(f"{len(rows)} compiles, {len(misses)} misses: "
        f"{sum(r['secs'] for r in misses):.0f} s compiling, "
        f"{sum(r['secs'] for r in rows if r['hit']):.0f} s reading the cache")
  for title, key in (("by file", lambda r: r["where"].split("::")[0]),
                     ("by test", lambda r: r["where"]),
                     ("by function (misses)", lambda r: r["fun"])):
    sums, counts = collections.Counter(), collections.Counter()
    for r in misses:
      sums[key(r)] += r["secs"]
      counts[key(r)] += 1
    print(f"\n{title}:")
    for name, secs in sums.most_common(top):
      print(f"  {secs:7.1f} s {counts[name]:4d}x  {name}", flush=True)


if __name__ == "__main__":
  main(sys.argv[1])
