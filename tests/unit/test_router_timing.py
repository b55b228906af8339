"""The hot-path histogram renders like a prometheus_client Histogram."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Histogram

from fleetgate.router.timing import TimingHistogram


def test_timing_histogram_matches_prometheus_client() -> None:
    buckets = (0.001, 0.01, 0.1)
    ours_reg, ref_reg = CollectorRegistry(), CollectorRegistry()
    ours = TimingHistogram("t_seconds", "doc", ["plugin"], buckets=buckets)
    ours_reg.register(ours)
    ref = Histogram("t_seconds", "doc", ["plugin"], buckets=buckets, registry=ref_reg)
    for v in (0.0005, 0.001, 0.005, 0.05, 0.5, 0.01):
        ours.labels("p").observe(v)
        ref.labels("p").observe(v)
    for bound in ("0.001", "0.01", "0.1", "+Inf"):
        labels = {"plugin": "p", "le": bound}
        assert ours_reg.get_sample_value("t_seconds_bucket", labels) == ref_reg.get_sample_value(
            "t_seconds_bucket", labels), bound
    assert ours_reg.get_sample_value("t_seconds_count", {"plugin": "p"}) == 6
    assert abs(ours_reg.get_sample_value("t_seconds_sum", {"plugin": "p"}) - 0.5665) < 1e-9  # type: ignore[operator]
