r"""Kill a run with SIGKILL at random moments, resume it, and compare with an unkilled run.

  python benchmarks/kill_resume.py --config=experiments/fedmrl.py:smoke
  python benchmarks/kill_resume.py --config=experiments/moss.py:smoke --kills=4 --seed=1
  python benchmarks/kill_resume.py --all          # every experiments/*.py :smoke config
  # extra flags after -- go to experiments/main.py unchanged:
  python benchmarks/kill_resume.py --config=experiments/fedavg.py:smoke -- \
      --config.num_rounds=6

For each config it

1. runs ``experiments/main.py`` uninterrupted into ``<workdir>/<name>/reference``;
2. runs the same command into ``<workdir>/<name>/killed``, killing it with SIGKILL
   ``--kills`` times: the first kill lands while a checkpoint is being written (the
   script polls the checkpoint directory for orbax's temporary step directory), each
   other one a random 0-0.3 s after the progress line of a random round not yet
   checkpointed (round 0: during start-up); then reruns the command until it finishes
   and logs the round that last process resumed from (``last process: resumed from
   round N``; 0: it started afresh, and the kills tested nothing);
3. checks that ``summary.json`` and every row of ``metrics.jsonl`` are identical
   (``wall_s``, the wall-clock time, excluded), rounds 1..R each exactly once.

Exit status 0 when every config matches, 1 otherwise. Both runs use the same backend
(``JAX_PLATFORMS`` is passed through), so accuracies must agree to the last bit.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAIN = os.path.join(ROOT, "experiments", "main.py")


def is_config_file(path: str) -> bool:
  """An experiment config file: a module defining ``get_config`` at top level (not the
  commands beside the configs: main.py, sweep.py, flower_*.py, ...)."""
  with open(path) as f:
    return re.search(r"^def get_config\(", f.read(), flags=re.MULTILINE) is not None


def command(config: str, workdir: str, extra: list[str]) -> list[str]:
  return [sys.executable, MAIN, f"--config={config}", f"--workdir={workdir}", *extra]


def run_to_end(cmd: list[str], timeout: float) -> tuple[float, str]:
  """Runs ``cmd`` to completion; returns its wall time and stdout. Raises on a non-zero
  exit."""
  t0 = time.perf_counter()
  out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
  if out.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
  return time.perf_counter() - t0, out.stdout


def resumed_round(stdout: str) -> int:
  """The round a process resumed from (its ``resumed from round N`` line), 0 if none."""
  found = re.search(r"resumed from round (\d+)", stdout)
  return int(found.group(1)) if found else 0


def checkpoint_being_written(workdir: str) -> bool:
  """True while orbax has a temporary (unfinished) step directory in the workdir."""
  try:
    return any("tmp" in name for name in os.listdir(os.path.join(workdir, "checkpoints")))
  except FileNotFoundError:
    return False


def kill_once(cmd: list[str], workdir: str, *, after_round: int | None, delay: float,
              timeout: float) -> str:
  """Starts ``cmd`` and SIGKILLs it.

  Args:
    cmd: the experiment command.
    workdir: its workdir (polled for checkpoint writes).
    after_round: kill ``delay`` seconds after the progress line of this round (0: after
      the start); None: kill as soon as a checkpoint write is seen in progress.
    delay: seconds.
    timeout: give up after this many seconds.

  Returns:
    What happened, for the log.
  """
  proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          bufsize=1)
  lines: list[str] = []
  reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")),
                            daemon=True)
  reader.start()
  t0, seen_at = time.perf_counter(), None
  marker = f"round {after_round}/"
  while proc.poll() is None and time.perf_counter() - t0 < timeout:
    now = time.perf_counter()
    if after_round is None:
      if checkpoint_being_written(workdir):
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        return f"killed during a checkpoint write at {now - t0:.2f}s"
      time.sleep(0.0005)
      continue
    if seen_at is None and (after_round == 0 or
                            any(line.startswith(marker) for line in list(lines))):
      seen_at = now
    if seen_at is not None and now - seen_at >= delay:
      proc.send_signal(signal.SIGKILL)
      proc.wait()
      return f"killed {delay:.2f}s after round {after_round} at {now - t0:.2f}s"
    time.sleep(0.002)
  if proc.poll() is None:
    proc.kill()
    proc.wait()
    raise RuntimeError(f"{' '.join(cmd)} did not finish in {timeout}s")
  if proc.returncode != 0:
    raise RuntimeError(f"{' '.join(cmd)} exited with {proc.returncode}")
  return "finished before the kill"


def rounds_done(workdir: str) -> int:
  """Rounds in the newest complete checkpoint (what a restart resumes from)."""
  try:
    steps = [int(n) for n in os.listdir(os.path.join(workdir, "checkpoints")) if n.isdigit()]
  except FileNotFoundError:
    return 0
  return max(steps, default=0)


def read_run(workdir: str) -> tuple[list[dict], dict]:
  """(metrics rows, summary) of a finished run, wall-clock fields (and timing) dropped."""
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f]
  rows = [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]
  with open(os.path.join(workdir, "summary.json")) as f:
    summary = json.load(f)
  summary.pop("timing", None)
  return rows, summary


def compare(reference: str, killed: str) -> list[str]:
  """Differences between two finished runs (empty when they are identical)."""
  (rows_a, sum_a), (rows_b, sum_b) = read_run(reference), read_run(killed)
  problems = []
  rounds = [r["round"] for r in rows_b]
  if len(set(rounds)) != len(rounds):
    problems.append(f"duplicated rounds in metrics.jsonl: {rounds}")
  if rounds != [r["round"] for r in rows_a]:
    problems.append(f"rounds {rounds} != reference {[r['round'] for r in rows_a]}")
  for a, b in zip(rows_a, rows_b):
    if a != b:
      problems.append(f"round {a['round']}: {b} != reference {a}")
  for key in sorted(set(sum_a) | set(sum_b)):
    if sum_a.get(key) != sum_b.get(key):
      problems.append(f"summary[{key!r}]: {sum_b.get(key)} != reference {sum_a.get(key)}")
  return problems


def check(config: str, workdir: str, *, kills: int, seed: int, extra: list[str],
          timeout: float = 900.0, log=print) -> bool:
  """Runs the three steps of the module docstring for one config; True when identical."""
  rng = random.Random(seed)
  ref_dir, killed_dir = os.path.join(workdir, "reference"), os.path.join(workdir, "killed")
  duration, _ = run_to_end(command(config, ref_dir, extra), timeout)
  log(f"{config}: uninterrupted run {duration:.1f}s")
  cmd = command(config, killed_dir, extra)
  num_rounds = read_run(ref_dir)[1]["rounds_completed"]
  for i in range(kills):
    after = None if i == 0 else rng.randint(rounds_done(killed_dir), num_rounds - 1)
    delay = rng.uniform(0.0, 0.5 * duration if after == 0 else 0.3)
    what = kill_once(cmd, killed_dir, after_round=after, delay=delay, timeout=timeout)
    log(f"  kill {i + 1}: {what}")
  _, stdout = run_to_end(cmd, timeout)
  log(f"  last process: resumed from round {resumed_round(stdout)} of {num_rounds}")
  problems = compare(ref_dir, killed_dir)
  log(f"  {'IDENTICAL' if not problems else 'DIFFERENT'}: metrics.jsonl and summary.json "
      f"after {kills} kills")
  for p in problems:
    log("    " + p)
  return not problems


def smoke_configs() -> list[str]:
  """``experiments/<algorithm>.py:smoke`` for every algorithm config."""
  files = sorted(glob.glob(os.path.join(ROOT, "experiments", "*.py")))
  return [f"{f}:smoke" for f in files if is_config_file(f)]


def main(argv=None) -> int:
  argv = list(sys.argv[1:] if argv is None else argv)
  extra = argv[argv.index("--") + 1:] if "--" in argv else []
  argv = argv[:argv.index("--")] if "--" in argv else argv
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  parser.add_argument("--config", action="append", default=[],
                      help="config file[:variant]; repeatable")
  parser.add_argument("--all", action="store_true", help="every algorithm's :smoke config")
  parser.add_argument("--kills", type=int, default=3,
                      help="SIGKILLs per config (the first during a checkpoint write)")
  parser.add_argument("--seed", type=int, default=0,
                      help="seed of the random kill moments")
  parser.add_argument("--workdir", default="/tmp/fedjax_het_kill_resume",
                      help="where the reference and killed runs write")
  args = parser.parse_args(argv)
  configs = args.config + (smoke_configs() if args.all else [])
  if not configs:
    parser.error("give --config or --all")
  ok = True
  for i, config in enumerate(configs):
    name = os.path.basename(config.split(":")[0]).removesuffix(".py")
    workdir = os.path.join(args.workdir, name)
    shutil.rmtree(workdir, ignore_errors=True)
    ok &= check(config, workdir, kills=args.kills, seed=args.seed + i, extra=extra)
  return 0 if ok else 1


if __name__ == "__main__":
  sys.exit(main())
