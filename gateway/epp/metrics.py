"""The Endpoint Picker's own metrics (the shared stages keep theirs: requests, cost, routing decisions).

`fleetgate_epp_decision_seconds`: last request-body byte received -> the routing answer ready (admission,
cache lookup, tier, endpoint pick and the rewritten body): what the picker adds to a request before the
proxy can send it. Its buckets are fine below 5 ms, where the target (p99 <= 2 ms) lies.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, Histogram

DECISION_BUCKETS = (0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01,
                    0.025, 0.05, 0.1, 0.25, 1.0)


class EppMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decision = Histogram("fleetgate_epp_decision_seconds",
                                  "Request body complete -> routing answer ready, in the Endpoint Picker.",
                                  buckets=DECISION_BUCKETS, registry=registry)
        self.streams = Gauge("fleetgate_epp_streams", "Open ext_proc streams (one per proxied request).",
                             registry=registry)
