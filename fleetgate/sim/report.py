"""Figures of one routing-benchmark run per policy, and the table they are printed as."""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


def quantile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def group_split(placements: Sequence[tuple[str, str]]) -> dict[str, float | int | None]:
    """How a workload's prompt groups were placed, from (group, endpoint) pairs in send order:
    `group_switch_share`, the share of a group's consecutive requests that went to another engine than the one
    before (each switch can cost a prefill the engine before held, and holds the prefix twice);
    `group_off_majority_share`, the share of requests not on their group's most-used engine; `groups_split`, the
    groups sent to more than one engine. None each when no group has two requests."""
    by_group: dict[str, list[str]] = {}
    for group, endpoint in placements:
        by_group.setdefault(group, []).append(endpoint)
    pairs = switches = placed = off_majority = split = 0
    for engines in by_group.values():
        pairs += len(engines) - 1
        switches += sum(1 for a, b in itertools.pairwise(engines) if a != b)
        counts = Counter(engines)
        placed += len(engines)
        off_majority += len(engines) - max(counts.values())
        split += len(counts) > 1
    if pairs == 0:
        return {"group_switch_share": None, "group_off_majority_share": None, "groups_split": None}
    return {"group_switch_share": switches / pairs, "group_off_majority_share": off_majority / placed,
            "groups_split": split}


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
