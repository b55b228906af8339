"""The Endpoint Picker's own metrics (the shared stages keep theirs: requests, cost, routing decisions).

`fleetgate_epp_decision_seconds`: last request-body byte received -> the routing answer ready (admission,
cache lookup, tier, endpoint pick and the rewritten body): what the picker adds to a request before the
proxy can send it. Its buckets are fine below 5 ms, where the target (p99 <= 2 ms) lies.

`fleetgate_epp_own_seconds{phase=...}`: the picker's own time on a request it routes to an engine, on the
client's path to its first byte, by ext_proc exchange; the HTTP door's `fleetgate_gateway_own_seconds`
(`own_time`) for this door, whose phases differ because the proxy, not the picker, reads the body and sends the
request. Each phase runs from the exchange's message reaching `Exchange.on_message` (the gRPC read and the
message's parse are done) to the picker's answer to it being ready (its gRPC write is not in it), all
`time.perf_counter_ns`:

- `request_headers`: the request headers handled (route, declared size, the API key checked); the body's
  messages wait behind it;
- the decision (the body's last message -> the routing answer ready) is `fleetgate_epp_decision_seconds`, not
  observed a second time here (an observation costs about 1.6 us on this box), but inside the total;
- `first_chunk`: the response-body message that completed the first chunk relayed to a streaming client ->
  its rewritten chunk ready;
- `total_to_first_byte`: `request_headers` + the decision + `first_chunk`, per streamed request.

Each is observed once per request and only for requests routed to an engine: a cache hit, a refusal (401, 404,
400, 429, ...) or a request the proxy ends before its answer begins is in none. A client that does not stream
gets its answer whole at the end (assembled or checked), so it has `request_headers` alone. The
response headers are not a phase: an engine sends them when it accepts the request, before its prefill, so the
picker handles them while the engine computes (as the HTTP door's response start, `own_time`). Not in any
phase: the proxy's work (reading the client's request, its routing and connection to the engine, its writes
both ways) and the gRPC stream's own reads and writes.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Gauge, Histogram

from fleetgate.gateway.own_time import OWN_BUCKETS

DECISION_BUCKETS = (0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075, 0.01,
                    0.025, 0.05, 0.1, 0.25, 1.0)
EPP_PHASES = ("request_headers", "first_chunk", "total_to_first_byte")


class EppOwnTime:
    """The phases' histogram children, bound once (`own_time.OwnTime`)."""

    __slots__ = ("_first", "_headers", "_total")

    def __init__(self, histogram: Histogram) -> None:
        self._headers = histogram.labels("request_headers")
        self._first = histogram.labels("first_chunk")
        self._total = histogram.labels("total_to_first_byte")

    def routed(self, headers_ns: int, decision_ns: int) -> int:
        """A request was routed to an engine: observe `request_headers` (ns); returns it with the decision's time
        (`fleetgate_epp_decision_seconds`) added, for the total."""
        self._headers.observe(headers_ns / 1e9)
        return headers_ns + decision_ns

    def first_chunk(self, took_ns: int, before_ns: int) -> None:
        """The first chunk relayed to a streaming client took `took_ns`; `before_ns`: `routed`'s sum."""
        self._first.observe(took_ns / 1e9)
        self._total.observe((before_ns + took_ns) / 1e9)


class EppMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decision = Histogram("fleetgate_epp_decision_seconds",
                                  "Request body complete -> routing answer ready, in the Endpoint Picker.",
                                  buckets=DECISION_BUCKETS, registry=registry)
        self.streams = Gauge("fleetgate_epp_streams", "Open ext_proc streams (one per proxied request).",
                             registry=registry)
        # the picker's own time on a routed request's path to its first byte, by phase: the module's doc
        self.own = EppOwnTime(Histogram(
            "fleetgate_epp_own_seconds",
            "The Endpoint Picker's own time on a request it routes to an engine, by ext_proc exchange: "
            "request_headers (the key checked), first_chunk (the response-body message completing the first chunk "
            "relayed to a streaming client -> its rewrite ready), total_to_first_byte (request_headers + the "
            "decision of fleetgate_epp_decision_seconds + first_chunk, per streamed request). Cache hits and "
            "refusals: none.",
            ["phase"], buckets=OWN_BUCKETS, registry=registry))
