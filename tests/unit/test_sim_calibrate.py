"""The calibration fit recovers known constants and the report lines up engine and simulator."""

from __future__ import annotations

import pytest

from fleetgate.sim.calibrate import Probe, fit_line, report


def test_fit_line_recovers_intercept_and_slope() -> None:
    a, b = fit_line({100: 0.05 + 0.002 * 100, 400: 0.05 + 0.002 * 400, 900: 0.05 + 0.002 * 900})
    assert a == pytest.approx(0.05) and b == pytest.approx(0.002)


def test_report_shows_ratios() -> None:
    real = Probe(ttft_by_len={100: 0.2, 200: 0.4}, tpot_by_batch={1: 0.1, 4: 0.2})
    sim = Probe(ttft_by_len={101: 0.3, 199: 0.4}, tpot_by_batch={1: 0.05, 4: 0.2})
    text = report(real, sim)
    assert "1.50" in text and "0.50" in text and text.count("1.00") == 2
