"""Reads XLA's VLOG timers (TF_CPP_VMODULE=gpu_compiler=1,nvptx_compiler=1,hlo_pass_pipeline=1)
from the probe's logs: per log, the compile phases of jit_dispatch and the HLO passes that
took over 2 s in all, and for a log cut off by `timeout`, the pass it was in.

  python digest.py LOG...
"""
import re
import sys
from collections import defaultdict

UNIT = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}
PASS = re.compile(r"HLO pass: (\S+) time: ([\d.]+) (us|ms|s|min|h) ")
PHASE = re.compile(r"(GpuCompiler::\w+) for jit_dispatch time: ([\d.]+) (us|ms|s|min|h) ")
START = re.compile(r"^I\d+ (\d\d:\d\d:\d\d)\.\d+ .*HLO pass (\S+)$")
STAMP = re.compile(r"^[IW]\d+ (\d\d:\d\d:\d\d)")


def digest(path):
  passes, phases, last_start, last_stamp = defaultdict(float), [], None, None
  with open(path, errors="replace") as f:
    for line in f:
      line = line.rstrip("\n")
      if m := PASS.search(line):
        passes[m.group(1)] += float(m.group(2)) * UNIT[m.group(3)]
      if m := PHASE.search(line):
        phases.append(f"{m.group(1)} {float(m.group(2)) * UNIT[m.group(3)]:.1f} s")
      if m := START.search(line):
        last_start = (m.group(1), m.group(2))
      if m := STAMP.search(line):
        last_stamp = m.group(1)
      if not line.startswith(("I1", "W1")) and ("|" in line or line.startswith("exit")):
        print(f"  {line[:220]}")
  for p in phases:
    print(f"  phase: {p}")
  for name, secs in sorted(passes.items(), key=lambda kv: -kv[1]):
    if secs > 2:
      print(f"  pass {name}: {secs:.1f} s in all")
  if last_start:
    print(f"  last pass started: {last_start[1]} at {last_start[0]} (last log line {last_stamp})")


for path in sys.argv[1:]:
  print(f"== {path.rsplit('/', 1)[-1]}")
  digest(path)
