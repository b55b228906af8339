"""The gateway's own time, measured inside it: `fleetgate_gateway_own_seconds` (`fleetgate.gateway.own_time`: where
its clocks are, and what a client's time to first token includes that it misses) read from each gateway replica's
metrics endpoint before and after a window, and summed over the replicas.

The difference of two scrapes is the window's histogram: its sum / count is the phase's exact mean; p50 and p90 are
read from the buckets as Prometheus' `histogram_quantile` does (linear within the bucket), so they are only as fine
as the buckets (`own_time.OWN_BUCKETS`). A second method beside the paired probes (`live_overhead`): no engine, no
twin request, only the gateway's clocks.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

FAMILY = "fleetgate_gateway_own_seconds"


@dataclass(frozen=True)
class PhaseHistogram:
    """One phase's cumulative buckets (upper bound, count up to it; +Inf last), count and sum (seconds)."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    sum: float

    def minus(self, earlier: PhaseHistogram) -> PhaseHistogram:
        """The observations made between `earlier` and this scrape of the same process."""
        if [b for b, _ in earlier.buckets] != [b for b, _ in self.buckets]:
            raise ValueError("the two scrapes have different buckets")
        if self.count < earlier.count:
            raise ValueError(f"{FAMILY}: the count went from {earlier.count:g} to {self.count:g} (a restart?)")
        return PhaseHistogram(tuple((b, n - m) for (b, n), (_, m) in zip(self.buckets, earlier.buckets, strict=True)),
                              self.count - earlier.count, self.sum - earlier.sum)

    def plus(self, other: PhaseHistogram) -> PhaseHistogram:
        """Two processes' histograms of the same buckets, added."""
        if [b for b, _ in other.buckets] != [b for b, _ in self.buckets]:
            raise ValueError("the two histograms have different buckets")
        return PhaseHistogram(tuple((b, n + m) for (b, n), (_, m) in zip(self.buckets, other.buckets, strict=True)),
                              self.count + other.count, self.sum + other.sum)

    def quantile(self, q: float) -> float:
        """`histogram_quantile(q)`: linear within the bucket the rank falls in (NaN when empty; the highest finite
        bound when the rank is in the +Inf bucket)."""
        if self.count <= 0:
            return math.nan
        rank = q * self.count
        lower, below = 0.0, 0.0
        for bound, cumulative in self.buckets:
            if cumulative >= rank:
                if math.isinf(bound):
                    return lower
                inside = cumulative - below
                return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0)
            lower, below = bound, cumulative
        return lower

    def summary(self) -> dict[str, Any]:
        """count; mean (exact: sum / count), p50 and p90 (from the buckets), in milliseconds; None when empty."""
        if self.count <= 0:
            return {"count": 0, "mean_ms": None, "p50_ms": None, "p90_ms": None}
        return {"count": int(self.count), "mean_ms": round(1000 * self.sum / self.count, 4),
                "p50_ms": round(1000 * self.quantile(0.5), 4), "p90_ms": round(1000 * self.quantile(0.9), 4)}


Scrape = dict[str, PhaseHistogram]  # phase -> its histogram, of one process at one moment


def parse(text: str) -> Scrape:
    """The own-time histogram of one `/metrics` exposition, by phase (empty when the gateway exports none)."""
    lines = [ln for ln in text.splitlines() if ln.startswith((FAMILY, f"# TYPE {FAMILY}"))]
    parts: dict[str, dict[str, Any]] = {}
    for family in text_string_to_metric_families("\n".join(lines) + "\n"):
        for sample in family.samples:
            phase = sample.labels.get("phase")
            if phase is None:
                continue
            part = parts.setdefault(phase, {"buckets": [], "count": 0.0, "sum": 0.0})
            if sample.name == f"{FAMILY}_bucket":
                part["buckets"].append((float(sample.labels["le"]), sample.value))
            elif sample.name == f"{FAMILY}_count":
                part["count"] = sample.value
            elif sample.name == f"{FAMILY}_sum":
                part["sum"] = sample.value
    return {phase: PhaseHistogram(tuple(sorted(p["buckets"])), p["count"], p["sum"]) for phase, p in parts.items()}


def window(before: list[Scrape], after: list[Scrape]) -> Scrape:
    """The observations between two scrapes of the same processes (in the same order), summed over them. A phase
    missing from any scrape is left out."""
    if len(before) != len(after):
        raise ValueError(f"{len(before)} scrapes before, {len(after)} after")
    out: Scrape = {}
    phases = set.intersection(*(set(s) for s in [*before, *after])) if before else set()
    for phase in sorted(phases):
        diffs = [a[phase].minus(b[phase]) for b, a in zip(before, after, strict=True)]
        total = diffs[0]
        for d in diffs[1:]:
            total = total.plus(d)
        out[phase] = total
    return out


def summaries(scrape: Scrape) -> dict[str, dict[str, Any]]:
    return {phase: h.summary() for phase, h in scrape.items()}


async def scrape(session: aiohttp.ClientSession, urls: tuple[str, ...] | list[str], *, timeout_s: float = 10.0
                 ) -> list[Scrape]:
    """Each gateway's own-time histogram now (one `/metrics` read per URL, at once). An endpoint that cannot be read
gives an empty scrape, so the window has no phase at all (never a sum over some of the replicas) and the overhead
phase's other figures are kept."""
    async def one(url: str) -> Scrape:
        try:
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as r:
                r.raise_for_status()
                return parse(await r.text())
        except (aiohttp.ClientError, TimeoutError):
            return {}

    return list(await asyncio.gather(*(one(u) for u in urls)))


def own_row(idle: Scrape, loaded: Scrape, *, ttft_p50_s: float | None) -> dict[str, Any]:
    """The overhead row's fields of this method: each phase's summary over the idle pairs and the loaded window, and
    the loaded window's mean total (to the first byte) as a share of the background's TTFT p50."""
    total = loaded.get("total_to_first_byte")
    share = None
    if total is not None and total.count > 0 and ttft_p50_s and ttft_p50_s > 0:
        share = total.sum / total.count / ttft_p50_s
    return {"own_idle": summaries(idle), "own_loaded": summaries(loaded), "own_share_of_ttft_p50": share}


def _phase_text(s: dict[str, Any] | None) -> str:
    if not s or not s.get("count"):
        return "none observed"
    return f"mean {s['mean_ms']:.3f} ms (p50 {s['p50_ms']:.3f}, p90 {s['p90_ms']:.3f}) over {s['count']:,}"


def report_lines(row: dict[str, Any]) -> list[str]:
    """The overhead section's paragraph for this method (nothing for rows measured before it existed)."""
    loaded, idle = row.get("own_loaded"), row.get("own_idle")
    if not loaded:
        return []
    phases = "; ".join(f"{phase} {_phase_text(loaded.get(phase))}"
                       for phase in ("before_upstream", "stages", "upstream_write", "first_chunk",
                                     "total_to_first_byte") if phase in loaded)
    share = row.get("own_share_of_ttft_p50")
    share_text = f" = {share:.2%} of the background's TTFT p50" if share is not None else ""
    idle_total = (idle or {}).get("total_to_first_byte")
    return ["", "Second method, the gateway's own time measured inside it (`fleetgate_gateway_own_seconds`: the "
            "gateway's clocks, no engine and no twin request; means exact from the histogram's sum and count, "
            "p50/p90 from its buckets). It misses the client -> gateway hop and uvicorn's work before the app is "
            "called, the loop's wait between the first chunk reaching the gateway's socket and the relay reading "
            "it, and the write to the client (`fleetgate.gateway.own_time`). Loaded window, every request the "
            f"gateway sent to an engine: {phases}{share_text}. Idle pairs: total_to_first_byte "
            f"{_phase_text(idle_total)}."]


def target(row: dict[str, Any], *, background: str = "") -> tuple[str, bool | None, str] | None:
    """The own-time target (a different method from the paired probes' target, which stays as it is); `background`
    names the row's background load in the target's name."""
    share = row.get("own_share_of_ttft_p50")
    total = (row.get("own_loaded") or {}).get("total_to_first_byte")
    if share is None or not total:
        return None
    replicas = row.get("gateway_replicas", 1)
    door = f", {replicas} gateway replicas" if replicas > 1 else ""
    background = f"; {background}" if background else ""
    return (f"gateway's own time <= 1% of TTFT p50 ({row.get('profile', 'default')}{door}{background}; measured "
            f"inside the "
            f"gateway: mean total_to_first_byte over the loaded window, not the paired probes)", share <= 0.01,
            f"{total['mean_ms']:.3f} ms (p90 {total['p90_ms']:.3f}) over {total['count']:,} requests = {share:.2%} "
            f"of {row['background_ttft_p50_s']:.3f}s")
