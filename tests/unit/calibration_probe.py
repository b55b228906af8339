"""A calibration probe's throughput points, as `scripts/gpu/device_run.py` records them, from known step-time
constants: TTFT = ttft0 + prefill x prompt tokens at batch 1, TPOT = overhead + slope x batch. Shared by the tests
of the measured cost report (`test_cost_measured.py`, `test_cost_tier_entry.py`)."""

from __future__ import annotations

from fleetgate.bench.measured_throughput import ThroughputPoint


def probe_points(*, ttft0: float, prefill: float, overhead: float, slope: float,
                 batches: tuple[int, ...]) -> tuple[ThroughputPoint, ...]:
    ttft = [ThroughputPoint(concurrency=1, requests=3, prompt_tokens=n, output_tokens=1,
                            output_tokens_per_s=1 / (ttft0 + prefill * n), ttft_p50_s=ttft0 + prefill * n,
                            ttft_p90_s=None) for n in (128, 1024, 4096)]
    tpot = [ThroughputPoint(concurrency=b, requests=3 * b, prompt_tokens=64, output_tokens=32,
                            output_tokens_per_s=b / (overhead + slope * b), ttft_p50_s=None, ttft_p90_s=None)
            for b in batches]
    return (*ttft, *tpot)
