"""tests/test_forkserver.py's stand-in for Flower's ClientApp: what a forked child sees."""
import json
import os
import sys
import time

import numpy as np

IMPORTED_IN = os.getpid()  # the process that imported this module


def make():
  """The function each child runs: prints what it sees as JSON, one line to stderr, and
  exits with ``argv[1]`` (``'sleep'``: sleeps until signalled)."""
  def run():
    print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "pid": os.getpid(),
                      "ppid": os.getppid(), "preloaded_in": IMPORTED_IN,
                      "env": os.environ.get("PYTHONPATH"),
                      "numpy_random": float(np.random.random())}), flush=True)
    print("child stderr", file=sys.stderr, flush=True)
    if sys.argv[1] == "sleep":
      time.sleep(60)
    sys.exit(int(sys.argv[1]))
  return run
