"""`fleetgate bench precise-prefix` runs end to end on small sizes and prints every figure it promises."""

from __future__ import annotations

import argparse
import re

import pytest

from fleetgate.bench.precise_prefix import add_arguments, run


def test_bench_prints_decision_event_and_baseline_figures(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--endpoints", "3", "--held-blocks", "256", "--requests", "50", "--rounds", "1",
                              "--prompt-tokens", "256"])
    assert run(args) == 0
    out = capsys.readouterr().out
    for row in ("approximate produce", "approximate score", "precise produce (no tokenizer)", "precise score"):
        match = re.search(rf"^{re.escape(row)}\s+([0-9.]+)\s+([0-9.]+)\s+([0-9.]+)$", out, re.M)
        assert match, (row, out)
        p50, p99 = float(match[1]), float(match[2])
        assert 0 < p50 <= p99
    assert re.search(r"events: [0-9.]+ us CPU per stored block, [0-9.]+ us per removed block", out)
    assert "load average" in out
