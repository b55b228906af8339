"""The gateway's Prometheus metrics, registered on the app's own `CollectorRegistry`.

Names follow the vLLM / Gateway API Inference Extension style: `fleetgate_` prefix, base units
(seconds), `_total` counters. Time to first token and time per output token are measured at the
gateway, on streamed responses (a non-streamed response has no observable first token):
TTFT = request received -> first chunk carrying generated output relayed to the client;
TPOT = (last output chunk - first output chunk) / (completion tokens - 1).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from fleetgate.core.telemetry import LATENCY_BUCKETS, TPOT_BUCKETS
from fleetgate.gateway.own_time import OWN_BUCKETS, OwnTime

REQUEST_LABELS = ("model", "tier", "tenant")


class GatewayMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.requests = Counter(
            "fleetgate_requests",
            "Requests answered by the gateway, by served model, tier, tenant, HTTP status and cache status.",
            [*REQUEST_LABELS, "status", "cache"],
            registry=registry,
        )
        self.duration = Histogram(
            "fleetgate_request_duration_seconds",
            "Request received -> last byte sent, at the gateway.",
            REQUEST_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.ttft = Histogram(
            "fleetgate_time_to_first_token_seconds",
            "Streamed requests: request received -> first generated chunk relayed.",
            REQUEST_LABELS,
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            "fleetgate_time_per_output_token_seconds",
            "Streamed requests: mean time between output tokens after the first.",
            REQUEST_LABELS,
            buckets=TPOT_BUCKETS,
            registry=registry,
        )
        # the gateway's own time on a request it sends to an engine, by phase: where each clock is, `own_time`
        self.own = OwnTime(Histogram(
            "fleetgate_gateway_own_seconds",
            "The gateway's own time on a request sent to an engine, by phase: before_upstream (ASGI handler entered "
            "-> request bytes written to the engine; split into stages, up to the hand-off to the HTTP client, and "
            "upstream_write, from there), first_chunk (first chunk read from the engine -> handed to "
            "the client's ASGI send), total_to_first_byte (their sum per streamed request). Cache hits: none.",
            ["phase"],
            buckets=OWN_BUCKETS,
            registry=registry,
        ))
        self.in_flight = Gauge(
            "fleetgate_requests_in_flight", "Requests being processed by the gateway.", registry=registry
        )
        self.unwritten_requests = Counter(
            "fleetgate_unwritten_requests",
            "Requests whose usage the gateway could not confirm written to the usage ledger before it stopped "
            "(a stalled or down Redis at shutdown; each also has an error log line: `unwritten`).",
            ["tenant"], registry=registry,
        )
        self.unwritten_tokens = Counter(
            "fleetgate_unwritten_tokens",
            "Tokens of those requests by kind (prompt, completion, cached).",
            ["tenant", "kind"], registry=registry,
        )
        self.upstream_errors = Counter(
            "fleetgate_upstream_errors",
            "Failed engine calls by kind: connect, timeout, status, bad_response, midstream.",
            ["model", "endpoint", "kind"],
            registry=registry,
        )
        self.retries = Counter(
            "fleetgate_upstream_retries",
            "Engine calls retried on another endpoint or fallback model after a connect failure.",
            ["model"],
            registry=registry,
        )
        self.escalations = Counter(
            "fleetgate_cascade_escalations",
            "Cascade requests escalated from the cheap to the strong model.",
            ["from_model", "to_model"],
            registry=registry,
        )
