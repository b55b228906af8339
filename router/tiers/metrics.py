"""The tier router's Prometheus metrics, registered in the registry the caller owns (one per app).

Operators watch the live share of large-tier decisions (`fleetgate_tier_decisions_total` by tier) against
the share `fleetgate tier calibrate` promised, and the score histogram for drift of the traffic away from
the labelled data the threshold was calibrated on.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from fleetgate.core.telemetry import DECISION_BUCKETS

# Decision time: microseconds with the cache's embedding, tens to hundreds of milliseconds computing one.
SECONDS_BUCKETS: tuple[float, ...] = tuple(sorted({*DECISION_BUCKETS, 0.1, 0.25, 0.5, 1.0, 2.5}))
SCORE_BUCKETS: tuple[float, ...] = tuple(round(0.05 * i, 2) for i in range(1, 21))


class TierMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        r = registry if registry is not None else CollectorRegistry()
        self.registry = r
        self.decisions = Counter(
            "fleetgate_tier_decisions", "Alias requests resolved, by alias, chosen tier and reason.",
            ["alias", "tier", "reason"], registry=r,
        )
        self.decision_seconds = Histogram(
            "fleetgate_tier_decision_seconds",
            "Time to resolve an alias; `embedding` says whether the cache's was reused, one was computed, or none.",
            ["alias", "embedding"], buckets=SECONDS_BUCKETS, registry=r,
        )
        self.scores = Histogram(
            "fleetgate_tier_score", "Scores (need for the strong tier) of prompts sent to an alias.",
            ["alias"], buckets=SCORE_BUCKETS, registry=r,
        )
        self.escalation_checks = Counter(
            "fleetgate_tier_escalation_checks",
            "Cascade answers checked, by alias and outcome: `kept` or the reason to escalate.",
            ["alias", "outcome"], registry=r,
        )
