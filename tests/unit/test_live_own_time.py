"""The harness's reading of the gateway's own-time histogram: parsing a real exposition, the difference between two
scrapes summed over replicas, the exact mean and the bucket quantiles, and the row's report and target."""

from __future__ import annotations

import math
import socket
from time import perf_counter_ns

import aiohttp
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fleetgate.bench import live_own_time
from fleetgate.bench.live_own_time import PhaseHistogram, own_row, parse, window
from fleetgate.bench.live_report import targets
from fleetgate.gateway.metrics import GatewayMetrics

MS = 1_000_000  # ns


def exposition(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()


def observe(metrics: GatewayMetrics, before_ms: list[float], first_ms: list[float]) -> None:
    """Requests with these phases, through the gateway's own recorder."""
    for b, f in zip(before_ms, first_ms, strict=True):
        took = metrics.own.before_upstream(1, 1 + int(b * MS))
        assert took == int(b * MS)
        # first_chunk reads the clock itself: a read time `f` ms ago
        metrics.own.first_chunk(perf_counter_ns() - int(f * MS), took)


def test_two_scrapes_of_two_replicas_give_the_windows_exact_mean_and_its_quantiles() -> None:
    a, b = GatewayMetrics(CollectorRegistry()), GatewayMetrics(CollectorRegistry())
    observe(a, [5.0], [5.0])  # before the window: must not count
    before = [parse(exposition(a.registry)), parse(exposition(b.registry))]
    assert before[0]["before_upstream"].count == 1 and before[1]["before_upstream"].count == 0
    observe(a, [0.4, 0.6], [0.1, 0.1])
    observe(b, [0.4, 0.4, 0.8], [0.1, 0.1, 0.1])
    after = [parse(exposition(a.registry)), parse(exposition(b.registry))]
    w = window(before, after)
    assert set(w) == {"before_upstream", "stages", "upstream_write", "first_chunk", "total_to_first_byte"}
    assert w["stages"].count == w["upstream_write"].count == 0  # no posting clock given: before_upstream unsplit
    before_upstream = w["before_upstream"]
    assert before_upstream.count == 5
    assert before_upstream.sum == pytest.approx((0.4 + 0.6 + 0.4 + 0.4 + 0.8) / 1000)
    summary = before_upstream.summary()
    assert summary["count"] == 5 and summary["mean_ms"] == pytest.approx(0.52, abs=1e-4)
    # buckets 0.3-0.5 ms hold three, 0.5-0.75 one, 0.75-1 one: rank 2.5 is 2.5/3 into the first of them
    assert summary["p50_ms"] == pytest.approx(0.3 + 0.2 * 2.5 / 3, abs=1e-4)
    assert summary["p90_ms"] == pytest.approx(0.75 + 0.25 * 0.5, abs=1e-4)
    total = w["total_to_first_byte"]
    assert total.count == 5 and total.sum > before_upstream.sum  # the first chunk's time is added per request
    assert w["first_chunk"].count == 5 and w["first_chunk"].sum == pytest.approx(total.sum - before_upstream.sum)


def test_a_gateway_without_the_histogram_or_with_a_lower_count_is_told_apart() -> None:
    assert parse("# HELP other_total x\n# TYPE other_total counter\nother_total 3.0\n") == {}
    assert window([{}], [{}]) == {}
    h = PhaseHistogram(((0.001, 2.0), (math.inf, 3.0)), 3.0, 0.004)
    with pytest.raises(ValueError, match="restart"):
        PhaseHistogram(((0.001, 1.0), (math.inf, 1.0)), 1.0, 0.001).minus(h)
    with pytest.raises(ValueError, match="buckets"):
        h.minus(PhaseHistogram(((0.002, 0.0), (math.inf, 0.0)), 0.0, 0.0))
    with pytest.raises(ValueError, match="before"):
        window([{}], [])


def test_quantiles_of_empty_and_overflowing_histograms() -> None:
    empty = PhaseHistogram(((0.001, 0.0), (math.inf, 0.0)), 0.0, 0.0)
    assert math.isnan(empty.quantile(0.5)) and empty.summary() == {"count": 0, "mean_ms": None, "p50_ms": None,
                                                                    "p90_ms": None}
    over = PhaseHistogram(((0.001, 1.0), (0.002, 1.0), (math.inf, 4.0)), 4.0, 0.5)
    assert over.quantile(0.9) == 0.002  # in the +Inf bucket: the highest finite bound, as histogram_quantile
    assert over.summary()["mean_ms"] == 125.0  # the mean stays exact


def test_the_row_the_report_and_a_target_apart_from_the_paired_one() -> None:
    m = GatewayMetrics(CollectorRegistry())
    s0 = [parse(exposition(m.registry))]
    observe(m, [0.5], [0.1])
    s1 = [parse(exposition(m.registry))]
    observe(m, [0.5, 0.5], [0.1, 0.1])
    s2 = [parse(exposition(m.registry))]
    own = own_row(window(s0, s1), window(s1, s2), ttft_p50_s=0.1)
    assert own["own_idle"]["total_to_first_byte"]["count"] == 1 and own["own_loaded"]["before_upstream"]["count"] == 2
    assert own["own_share_of_ttft_p50"] == pytest.approx(own["own_loaded"]["total_to_first_byte"]["mean_ms"] / 100,
                                                         rel=1e-3)
    assert 0.005 < own["own_share_of_ttft_p50"] < 0.01
    row = {"kind": "overhead", "background_ttft_p50_s": 0.1, "output_tps": 1000.0, "added_share_of_ttft_p50": 0.02,
           "loaded_added_ms": [2.0, 1.5, 2.5], **own}
    found = {name: met for name, met, _ in targets([row])}
    paired = [n for n in found if n.startswith("gateway overhead <= 1%")]
    inside = [n for n in found if n.startswith("gateway's own time <= 1%")]
    assert len(paired) == 1 and found[paired[0]] is False  # the paired probes' target, unchanged
    assert len(inside) == 1 and found[inside[0]] is True and "not the paired probes" in inside[0]
    text = "\n".join(live_own_time.report_lines(row))
    assert "Second method, the gateway's own time measured inside it" in text and "before_upstream mean 0.500" in text
    assert live_own_time.report_lines({"kind": "overhead"}) == [] and live_own_time.target({"kind": "overhead"}) is None


async def test_an_unreadable_endpoint_leaves_no_phase_rather_than_part_of_the_replicas() -> None:
    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    m = GatewayMetrics(CollectorRegistry())
    observe(m, [0.5], [0.1])
    readable = parse(exposition(m.registry))
    async with aiohttp.ClientSession() as session:
        [unreadable] = await live_own_time.scrape(session, [f"http://127.0.0.1:{port}/metrics"], timeout_s=2)
    assert unreadable == {}
    assert window([readable, readable], [readable, unreadable]) == {}
    assert own_row({}, {}, ttft_p50_s=0.1) == {"own_idle": {}, "own_loaded": {}, "own_share_of_ttft_p50": None}


def test_before_upstream_is_split_at_the_hand_off_to_the_http_client() -> None:
    metrics = GatewayMetrics(CollectorRegistry())
    assert metrics.own.before_upstream(1 * MS, 3 * MS, posting_ns=2 * MS + MS // 2) == 2 * MS
    metrics.own.before_upstream(1 * MS, 3 * MS, posting_ns=4 * MS)  # a clock out of order: no split
    seen = parse(exposition(metrics.registry))
    assert seen["before_upstream"].count == 2
    assert (seen["stages"].count, seen["upstream_write"].count) == (1, 1)
    assert seen["stages"].sum == pytest.approx(0.0015) and seen["upstream_write"].sum == pytest.approx(0.0005)
