"""Progress lines with a fake clock."""
from fedjax_het.training import metrics


def test_progress_lines_keep_the_latest_accuracy_and_estimate():
  now = [0.0]
  lines = []
  p = metrics.Progress(100, 0, lines.append, clock=lambda: now[0])
  now[0] = 10.0
  p.update(1, None, 2.5, 0.4)
  assert lines[-1] == ("round 1/100 | sampled clients acc 0.4000 | train loss 2.5000 | "
                       "0.10 rounds/s | eta 16m30s")
  now[0] = 20.0
  p.update(10, 0.55, 1.25)
  assert lines[-1].startswith("round 10/100 | mean test acc 0.5500 | train loss 1.2500")
  p.update(11, None, 1.0)
  assert "mean test acc 0.5500" in lines[-1]  # the latest evaluation is kept
  assert p.estimate(30.0, 2.0, "gpu") == "compiled in 28s; 2.00 s per round, about 3m16s to go"
  assert "':cpu' variant" in p.estimate(30.0, 20.0, "cpu")
  assert "':cpu' variant" not in p.estimate(30.0, 2.0, "cpu")


def test_format_seconds():
  assert [metrics.format_s(s) for s in (5, 65, 7300, float("inf"))] == [
      "5s", "1m05s", "2h01m", "?"]
