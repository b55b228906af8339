"""The gateway's own time on a request it sends to an engine, measured inside the gateway (as Envoy reports its
upstream service time): `fleetgate_gateway_own_seconds{phase=...}`.

Where the clocks are (all `time.perf_counter_ns`):

- `arrived`: the first statement of the hot route's ASGI handler (`fastpath.body_handler`), reached from uvicorn's
  call of the app after one dict lookup (`GatewayApp.__call__`), before the headers are read;
- `posting`: just before the engine request is handed to aiohttp (`forwarding.Forwarder.open`, after the body
  for the engine is built and the endpoint's in-flight count raised);
- `sent`: just after aiohttp's body writer handed the request's bytes to the engine connection's transport
  (`upstream.TimedRequest.write_bytes`, after `write_eof`; uvloop writes to the socket at once unless its buffer
  is full). On Python < 3.12 aiohttp writes the body in a task of its own, so the loop's queue before that task
  runs is inside this phase, as it should be;
- `read`: just after the network read that completed the first chunk relayed to the client returned to the
  relay (`streaming.RelayStream.__anext__` for chat and completions, `event_relay.EventRelay.__anext__` for the
  Responses and Messages APIs);
- `handed`: just before the relay returns that chunk, rewritten, to the web layer (the same `__anext__`),
  which passes it to the ASGI `send` with no await in between (`responses.StreamResponse.relay`). When the
  engine's whole answer came in that read, an event relay's `on_complete` (a Responses answer stored for
  follow-ups) runs before the chunk is handed on, so it is inside `first_chunk`.

Phases, each observed once per request and only for requests that reach an engine (never a cache hit):

- `before_upstream` = sent - arrived: reading the body, authentication, parsing, limits, cache lookup, tier and
  endpoint choice, adapter loads and scale-from-zero waits, aiohttp's request writing; a connect retry's failed
  attempt too. Observed for every engine request of the HTTP door, streamed or not, on every route that sends
  one (chat, completions, responses, messages, embeddings: all enter through `fastpath.body_handler` and
  `Forwarder.open`), for the first attempt that got an answer (a cascade's second call is not counted again);
- `stages` = posting - arrived and `upstream_write` = sent - posting: `before_upstream` split in two, the
  gateway's own stages against aiohttp's request write (on a loaded 2-core box a write to an engine on the same
  cores also holds the time the kernel gives the engine's process, woken by the bytes);
- `first_chunk` = handed - read: the relay's rewrite of the first chunk (requests whose client streams: chat,
  completions, responses and messages; a Responses or Messages request whose client does not stream is
  streamed from the engine but collected, so no chunk is handed on and it has `before_upstream` alone);
- `total_to_first_byte` = their sum, per streamed request.

The Endpoint Picker's door (`fleetgate epp`) sends no request itself: its own time is `epp.own_time`'s.

What a client's time to first token through the gateway includes that these miss: the client -> gateway hop and
uvicorn's work before the app is called (accept, HTTP parsing, the task it starts the app in, and the loop's queue
before that task runs); the engine's own answer time and the network both ways; the wait between the first
chunk's bytes reaching the gateway's socket and the relay's task running (the loop's queue and aiohttp's parsing
of the chunk); and the ASGI `send` itself (uvicorn's framing and write of the chunk to the client's socket).
Work the gateway does while the engine computes (the response headers, the client's response start) is not on the
first token's path and is in no phase.
"""

from __future__ import annotations

from time import perf_counter_ns

from prometheus_client import Histogram

PHASES = ("before_upstream", "stages", "upstream_write", "first_chunk", "total_to_first_byte")
# sub-millisecond resolution where the gateway's time lies; the histogram's sum and count give the exact mean
OWN_BUCKETS = (0.00005, 0.0001, 0.0002, 0.0003, 0.0005, 0.00075, 0.001, 0.0015, 0.002, 0.003, 0.005, 0.0075,
               0.01, 0.02, 0.05, 0.1, 0.25, 1.0, 5.0)


class OwnTime:
    """The three phases' histogram children, bound once (a `labels()` lookup per observation would cost more than
    the observation)."""

    __slots__ = ("_before", "_first", "_stages", "_total", "_write")

    def __init__(self, histogram: Histogram) -> None:
        self._before = histogram.labels("before_upstream")
        self._stages = histogram.labels("stages")
        self._write = histogram.labels("upstream_write")
        self._first = histogram.labels("first_chunk")
        self._total = histogram.labels("total_to_first_byte")

    def before_upstream(self, arrived_ns: int, sent_ns: int, posting_ns: int = 0) -> int:
        """Observe sent - arrived, and its split at `posting_ns` when given; returns it (ns), or 0 (nothing
        observed) when either end's clock is missing."""
        if not arrived_ns or not sent_ns:
            return 0
        took = sent_ns - arrived_ns
        self._before.observe(took / 1e9)
        if arrived_ns <= posting_ns <= sent_ns:
            self._stages.observe((posting_ns - arrived_ns) / 1e9)
            self._write.observe((sent_ns - posting_ns) / 1e9)
        return took

    def first_chunk(self, read_ns: int, before_ns: int) -> None:
        """The first chunk is being handed to the ASGI send now: observe now - `read_ns`, and the total with
        `before_ns` (this request's `before_upstream`, 0: not observed, and then no total)."""
        took = perf_counter_ns() - read_ns
        self._first.observe(took / 1e9)
        if before_ns:
            self._total.observe((before_ns + took) / 1e9)
