"""Figures of one routing-benchmark run per policy, and the table they are printed as."""

from __future__ import annotations

import statistics
from dataclasses import dataclass


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


@dataclass(slots=True)
class Row:
    policy: str
    ttft_p50: float
    ttft_p90: float
    hit_rate: float
    throughput: float
    decision_p99_us: float
    decision_cpu_p99_us: float
    spread: list[int]


def print_table(title: str, rows: list[Row], *, baseline: str, unit: str = "engine seconds") -> None:
    base = next((r for r in rows if r.policy == baseline), None)
    print(f"\n== {title}  (ratios: x better than {baseline}; TTFT in {unit})")
    print(f"{'policy':<14}{'TTFT p50':>10}{'TTFT p90':>10}{'hit rate':>10}{'tok/s':>9}"
          f"{'dec p99':>10}{'cpu p99':>10}   {'p50 x':>6}{'p90 x':>7}{'hit x':>7}  requests/endpoint")
    for r in rows:
        ratios = ["", "", ""]
        if base is not None:
            ratios = [f"{base.ttft_p50 / r.ttft_p50:.2f}", f"{base.ttft_p90 / r.ttft_p90:.2f}",
                      f"{r.hit_rate / base.hit_rate:.2f}" if base.hit_rate > 0 else "-"]
        print(f"{r.policy:<14}{r.ttft_p50:>10.3f}{r.ttft_p90:>10.3f}{r.hit_rate:>10.1%}{r.throughput:>9.1f}"
              f"{r.decision_p99_us:>8.0f}us{r.decision_cpu_p99_us:>8.0f}us   {ratios[0]:>6}{ratios[1]:>7}{ratios[2]:>7}"
              f"  {r.spread}")
