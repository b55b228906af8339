"""The cost report's targets compare all-on with naive, and a run of a subset of configurations still reports."""

from __future__ import annotations

from fleetgate.bench.cost_report import Row, targets


def row(config: str, *, usd: float, ttft: float, precision: float | None = 0.99, recall: float = 1.0) -> Row:
    return Row(config=config, requests=100, errors=0, usd_per_1k=usd, engine_calls=100, gpu_seconds=1.0,
               ttft_p50_s=ttft, ttft_p90_s=ttft, cache_hit_rate=0.5, cache_precision=precision, wrong_hits=0,
               strong_share=0.4, strong_recall=recall, prefix_hit_rate=0.9, accounted_usd=None)


def test_targets_compare_all_on_with_naive() -> None:
    met = {name: ok for name, ok, _ in targets([row("naive", usd=1.0, ttft=0.1), row("all-on", usd=0.2, ttft=0.01)])}
    assert all(met.values()) and len(met) == 4
    missed = {name: ok for name, ok, _ in targets([row("naive", usd=1.0, ttft=0.1),
                                                   row("all-on", usd=0.9, ttft=0.09, recall=0.5)])}
    assert not missed["$ per 1,000 requests >= 30% lower"] and not missed["strong-tier recall >= 95%"]


def test_a_subset_without_all_on_or_naive_has_no_targets_instead_of_crashing() -> None:
    assert targets([row("naive", usd=1.0, ttft=0.1), row("+tiers", usd=0.3, ttft=0.05)]) == []
    assert targets([row("+cache", usd=0.5, ttft=0.05)]) == []
