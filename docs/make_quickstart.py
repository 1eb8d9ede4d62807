r"""Regenerates the transcripts of docs/quickstart.md by running its commands.

  FEDJAX_HET_DATA=../shared/data python docs/make_quickstart.py   # about 3-6 min on 2 cores

Runs the page's first command (``experiments/main.py`` with the ``:cpu`` FedMRL config,
20 rounds) into a fresh temporary workdir and its mistyped-key command, and rewrites
the page's two ``console`` blocks and the line after the first (the run's wall time and
the machine) with what they printed. ``tests/test_docs.py`` checks, with a run of a few
seconds, that every line of the page's transcript still has the shape the command
prints (``skeleton``: the line with its numbers, durations and paths blanked).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "quickstart.md")
MAIN = "experiments/main.py"
RUN_FLAGS = ("--config=experiments/fedmrl.py:cpu", "--workdir=runs/fedmrl_cpu")
TYPO_FLAGS = ("--config=experiments/fedmrl.py:cpu", "--workdir=runs/x",
              "--config.data.dataset=cifar100")
INSTALL = ("$ git clone <repo> fedjax-het && cd fedjax-het",
           "$ python3 -m venv .venv && .venv/bin/pip install -q -e .")
TIMING = re.compile(r"^The run took .*$", re.M)


def skeleton(line: str) -> str:
  """``line`` with what varies between runs blanked: the data's path and fingerprint,
  the list of client architectures, paths, durations and numbers.

  >>> skeleton("round 3/20 | mean test acc 0.5503 (round 2) | 0.06 rounds/s | eta 3m58s")
  'round N/N | mean test acc N (round N) | N rounds/s | eta DUR'
  """
  line = re.sub(r"\b(npz|tfds):[^,;)\s]+", "SOURCE", line)
  line = re.sub(r"fingerprint [0-9a-f]+", "fingerprint HEX", line)
  line = re.sub(r"\((?:[\w.:]+ x\d+(?:, )?)+\)", "(ARCHS)", line)
  line = re.sub(r"summary in \S+", "summary in PATH", line)
  line = re.sub(r"\b\d+h\d\dm\b|\b(?:\d+m)?\d+s\b|(?<=eta )\?", "DUR", line)
  return re.sub(r"(?<!\w)\d+(?:\.\d+)?", "N", line)  # not in names: cifar10


def transcript(page: str = PAGE) -> list[str]:
  """The output lines of the page's first ``console`` block (its ``$`` lines and their
  continuations left out)."""
  with open(page) as f:
    block = re.search(r"```console\n(.*?)```", f.read(), re.S).group(1)
  out, continued = [], False
  for line in block.splitlines():
    if line.startswith("$ ") or continued:
      continued = line.endswith("\\")
      continue
    out.append(line)
  return out


def command_lines(flags: Sequence[str], env_prefix: str = "") -> list[str]:
  """``$ <env>.venv/bin/python experiments/main.py \\`` and the flags on a second line."""
  return [f"$ {env_prefix}.venv/bin/python {MAIN} \\", "    " + " ".join(flags)]


def run(flags: Sequence[str], env: dict | None = None) -> tuple[list[str], float, int]:
  """(stdout and stderr lines, wall seconds, exit status) of ``experiments/main.py``."""
  t0 = time.perf_counter()
  out = subprocess.run([sys.executable, MAIN, *flags], cwd=ROOT, capture_output=True,
                       text=True, env={**os.environ, **(env or {})})
  lines = (out.stdout + out.stderr).splitlines()
  return lines, time.perf_counter() - t0, out.returncode


def replace_block(text: str, index: int, lines: Sequence[str]) -> str:
  """``text`` with its ``index``-th ``console`` block's body replaced by ``lines``."""
  blocks = list(re.finditer(r"```console\n(.*?)```", text, re.S))
  block = blocks[index]
  return text[:block.start(1)] + "\n".join(lines) + "\n" + text[block.end(1):]


def regenerate(page: str = PAGE) -> str:
  """Runs the page's commands and rewrites its transcripts; returns the new text."""
  from fedjax_het.training.metrics import format_s  # noqa: PLC0415
  workdir = tempfile.mkdtemp(prefix="fedjax_het_quickstart_")
  flags = [f"--workdir={workdir}" if f.startswith("--workdir=") else f for f in RUN_FLAGS]
  data = os.environ.get("FEDJAX_HET_DATA", "../shared/data")
  try:
    lines, wall, status = run(flags, {"FEDJAX_HET_DATA": data})
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  if status:
    raise SystemExit("the run failed:\n" + "\n".join(lines[-20:]))
  lines = [line.replace(workdir, RUN_FLAGS[1].split("=", 1)[1]) for line in lines]
  typo, _, typo_status = run(TYPO_FLAGS)
  with open(page) as f:
    text = f.read()
  text = replace_block(text, 0, [*INSTALL, *command_lines(RUN_FLAGS, "FEDJAX_HET_DATA="
                                                             "../shared/data "), *lines])
  text = replace_block(text, 1, [*command_lines(TYPO_FLAGS), *typo, "$ echo $?",
                                 str(typo_status)])
  load = os.getloadavg()[0]
  text = TIMING.sub(f"The run took {format_s(wall)} of wall time here ({os.cpu_count()} "
                    f"CPU cores, load average {load:.1f} at its end).", text, count=1)
  with open(page, "w") as f:
    f.write(text)
  return text


def main() -> None:
  argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
  regenerate()
  print(f"rewrote {os.path.relpath(PAGE)}")


if __name__ == "__main__":
  main()
