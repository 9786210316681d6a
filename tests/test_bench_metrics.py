"""``bench/metrics.py --quick`` prints the grounding update's cost beside a single-threshold Dice."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import metrics as metrics_bench  # noqa: E402


def test_quick_bench_prints_the_update_cost_and_its_parts(capsys):
    """The ratio goes to the log, not into an assertion: timings on a shared CPU are no test.
    What is checked is that every part and both ratio lines are printed."""
    metrics_bench.main(["--quick", "--repeats", "2"])
    out = capsys.readouterr().out
    with capsys.disabled():
        print("\n" + out)
    for label in ("counts", "CNR", "Pointing Game, Dice/IoU", "records", "update / single-tau", "loop / update",
                  "gaze update", "per pair"):
        assert f"{label} " in out or f"{label}:" in out, label
