"""Progress lines with a fake clock (nothing here is timed)."""
import re

import pytest

from fedjax_het.sweeps import eta
from fedjax_het.training import metrics


class FakeClock:
  """Seconds set by the test."""

  def __init__(self):
    self.now = 0.0

  def __call__(self):
    return self.now


def progress(total=100, start=0):
  clock, lines = FakeClock(), []
  return metrics.Progress(total, start, lines.append, clock=clock), clock, lines


def test_first_line_gives_the_compiling_dispatch_time_and_no_extrapolated_eta():
  p, clock, lines = progress()
  clock.now = 10.0  # compilation + round 1
  p.update(1, None, 2.5, 0.4)
  assert lines[-1] == ("round 1/100 | sampled clients acc 0.4000 | train loss 2.5000 | "
                       "1 round in 10s with compilation | eta after the next round")
  assert "rounds/s" not in lines[-1]


def test_later_etas_count_only_the_rounds_after_the_first_dispatch():
  p, clock, lines = progress()
  clock.now = 60.0  # a long compilation
  p.update(1, None, 2.5)
  clock.now = 62.0  # round 2: 2 s
  estimate = p.estimate(60.0, 2.0, "gpu")
  p.update(2, None, 2.0)
  assert estimate == "compiled in 58s; 2.00 s per round, about 3m16s to go"
  assert lines[-1].endswith("| 0.50 rounds/s | eta 3m16s")  # agrees with the estimate
  clock.now = 80.0  # 10 more rounds in 18 s
  p.update(12, None, 1.0)
  assert lines[-1].endswith("| 0.55 rounds/s | eta 2m40s")  # 88 rounds at 11/20 per s


def test_a_carried_accuracy_names_its_round():
  p, clock, lines = progress()
  clock.now = 5.0
  p.update(1, None, 2.5)
  assert "mean test acc" not in lines[-1]  # nothing evaluated yet
  clock.now = 20.0
  p.update(10, 0.55, 1.25, acc_round=10)
  assert lines[-1].startswith("round 10/100 | mean test acc 0.5500 | train loss 1.2500 |")
  clock.now = 21.0
  p.update(11, 0.55, 1.0, acc_round=10)  # the loop passes the latest evaluation again
  assert lines[-1].startswith("round 11/100 | mean test acc 0.5500 (round 10) | train loss")
  p.update(12, None, 1.0)  # a caller passing None keeps the latest evaluation
  assert "mean test acc 0.5500 (round 10)" in lines[-1]
  p.update(15, 0.6, 0.9)  # no acc_round: evaluated at this round
  assert "mean test acc 0.6000 | train" in lines[-1]


def test_seeds_on_a_replica_axis_and_a_resumed_run():
  p, clock, lines = progress(total=20, start=10)
  clock.now = 3.0
  p.update(11, [0.5, None], [1.0, 2.0], [0.25, 0.75], acc_round=11)
  assert lines[-1] == ("round 11/20 | mean test acc 0.5000/? | sampled clients acc "
                       "0.2500/0.7500 | train loss 1.0000/2.0000 | 1 round in 3s with "
                       "compilation | eta after the next round")
  clock.now = 5.0
  p.update(20, None, [0.5, 0.5])
  assert lines[-1].endswith("| 4.50 rounds/s | eta 0s")
  assert "(round 11)" in lines[-1]


def test_a_run_of_one_round_ends_with_no_eta_to_wait_for():
  p, clock, lines = progress(total=1)
  clock.now = 7.0
  p.update(1, 0.3, 2.0)
  assert lines[-1] == ("round 1/1 | mean test acc 0.3000 | train loss 2.0000 | 1 round in "
                       "7s with compilation | eta 0s")


def test_the_sweep_projects_its_eta_from_the_loops_progress_callback():
  """As ``loop.run`` calls them: ``on_progress(r, R)``, then the dispatch's line."""
  clock, lines = FakeClock(), []
  log, on_progress = eta.prefixed_log(lines.append, "[1/2] x", clock,
                                      lambda now, projected: eta.sweep_eta([], 1, now,
                                                                           projected))
  p = metrics.Progress(30, 0, log, clock=clock)
  projected = []
  for r, t in ((1, 9.0), (2, 10.0), (3, 11.0)):
    clock.now = t
    on_progress(r, 30)
    p.update(r, 0.5 if r == 2 else None, 1.0, acc_round=2 if r > 1 else None)
    projected.append(on_progress.seconds)
  # compilation and round 1 took 9 s, then 1 s a round: 9 + 29 = 38 s a run
  assert projected[0] is None and projected[1:] == pytest.approx([38.0, 38.0])
  # a line carries the projection up to its own dispatch: none after round 1 alone, then
  # this run's rest and the next run: 38 + (38 - 10) at round 2, 38 + (38 - 11) at round 3
  assert [line.rsplit("sweep ETA ", 1)[1] for line in lines] == ["?", "1m06s", "1m05s"]
  assert [line.split(" | ")[1] for line in lines] == ["round 1/30", "round 2/30", "round 3/30"]
  assert all(line.startswith("[1/2] x | round ") for line in lines)
  assert all(re.search(r"\| eta \S", line) for line in lines)
  clock.now = 12.0  # the batch's seeds run again one by one: the projection restarts
  on_progress(1, 30)
  assert on_progress.seconds is None


def test_cpu_hint():
  p, _, _ = progress()
  assert "':cpu' variant" in p.estimate(30.0, 20.0, "cpu")
  assert "':cpu' variant" not in p.estimate(30.0, 2.0, "cpu")
  assert "':cpu' variant" not in p.estimate(30.0, 20.0, "gpu")
  quiet = metrics.Progress(100, 0, print, clock=FakeClock(), cpu_hint=False)
  assert "':cpu' variant" not in quiet.estimate(30.0, 20.0, "cpu")


def test_format_seconds():
  assert [metrics.format_s(s) for s in (5, 65, 7300, float("inf"))] == [
      "5s", "1m05s", "2h01m", "?"]
