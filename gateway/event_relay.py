"""Relaying an engine's *named* server-sent events (the Responses and Messages APIs), as they arrive.

vLLM streams `/v1/responses` and `/v1/messages` as SSE events with an `event:` line and one JSON `data:` line
each, and ends them by closing the stream after a terminal event (`response.completed`, `message_stop`), not
with `data: [DONE]`. `EventRelay` is the I/O side: one network read at a time, every complete event in it
handed to the route's `EventRewriter` (pure: the client's bytes out, what happened into its `outcome`), the
results sent in one write. It holds the same limits as the chat relay (`streaming.RelayStream`), whatever the
engine does: the first-byte and inter-chunk timeouts, the stream's total `deadline`, `interrupt()` (the
gateway is shutting down), and the completion cap the rewriter enforces; each ends the client's stream with
the API's own error event. A stream that closes before its terminal event broke off.

`on_complete(outcome)` runs before the terminal event is sent: what must be true once the client has its
answer (a stored conversation a follow-up can name) is true first. `close()` is called exactly once by the
web layer; when the stream did not end well it first counts what the engine sent but was not relayed yet (its
output still counts), then drops the connection (vLLM aborts the request), and reports the outcome. As for chat
(`stream_drain.EngineDrain`, shared), with `cancel_drain_s` and `spawn` given, a client that left after output
began and a stream the gateway ended at its deadline are drained instead (the engine's counted-but-unwritten
step is charged), and with `cancel_finish_tokens` a client that left with at most that many reserved tokens to
come (`EventRewriter.to_come`: an estimate from the deltas, vLLM sends these APIs' usage only at the end) lets
the engine finish (no abort: the charge is the engine's final usage); the outcome is reported after it. Either
way nothing more is relayed, the events are only counted (`EventRewriter.absorb`), and a drained outcome holds no
answer to store (the client never had it).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Coroutine
from time import perf_counter_ns
from typing import Any, Protocol

import aiohttp

from fleetgate.gateway.own_time import OwnTime
from fleetgate.gateway.stream_drain import EngineDrain
from fleetgate.gateway.stream_reads import StreamEnd, StreamReads
from fleetgate.gateway.streaming import StreamOutcome, reported


class EventRewriter(Protocol):
    """One API's events: `event(name, data)` -> the client's bytes (None: nothing), `fail` -> the API's error event."""

    outcome: StreamOutcome
    ended: bool  # the terminal event or an error was produced: nothing more is read

    def event(self, name: str | None, data: bytes) -> bytes | None: ...

    def absorb(self, name: str | None, data: bytes) -> bool: ...  # count an unrelayed event; True: nothing more

    def to_come(self) -> int | None: ...  # reserved completion tokens still to come (an estimate); None: no cap

    def fail(self, kind: str, message: str, code: str) -> bytes: ...


class SseParser:
    """Complete SSE events out of any split of bytes (`event:` and `data:` fields; a blank line ends one)."""

    def __init__(self) -> None:
        self._buf = b""
        self._name: str | None = None
        self._data: list[bytes] = []

    @property
    def pending(self) -> bytes:
        return self._buf

    def feed(self, data: bytes) -> list[tuple[str | None, bytes]]:
        self._buf += data
        events: list[tuple[str | None, bytes]] = []
        while True:
            end = self._buf.find(b"\n")
            if end < 0:
                return events
            line = self._buf[:end].rstrip(b"\r")
            self._buf = self._buf[end + 1 :]
            if not line:
                if self._data:
                    events.append((self._name, b"\n".join(self._data)))
                self._name, self._data = None, []
            elif line.startswith(b"event:"):
                self._name = line[6:].strip().decode("utf-8", "replace")
            elif line.startswith(b"data:"):
                self._data.append(line[5:].strip())


class EventRelay:
    """Async iterator of the client's bytes for one engine event stream (see the module doc)."""

    def __init__(
        self,
        *,
        response: aiohttp.ClientResponse,
        rewriter: EventRewriter,
        endpoint_id: str,
        first_byte_timeout_s: float,
        inter_chunk_timeout_s: float,
        on_done: Callable[[StreamOutcome], None],
        on_complete: Callable[[StreamOutcome], Awaitable[None]] | None = None,
        deadline: float | None = None,
        cancel_drain_s: float = 0.0,
        cancel_finish_tokens: int = 0,
        spawn: Callable[[Coroutine[Any, Any, None]], None] | None = None,
        own: OwnTime | None = None,
        before_upstream_ns: int = 0,
    ) -> None:
        """`own`: where the first chunk's `first_chunk` phase is observed, as the chat relay does
        (`streaming.RelayStream`, `own_time`; None: not measured, as for a client that does not stream), with the
        request's `before_upstream_ns` for the total."""
        self._resp = response
        self._drain = EngineDrain(drain_s=cancel_drain_s, finish_tokens=cancel_finish_tokens,
                                  inter_chunk_s=inter_chunk_timeout_s, deadline=deadline)
        self._spawn = spawn
        self._rw = rewriter
        self._reads = StreamReads(response, endpoint_id=endpoint_id, first_byte_timeout_s=first_byte_timeout_s,
                                  inter_chunk_timeout_s=inter_chunk_timeout_s, deadline=deadline)
        self._on_done = on_done
        self._on_complete = on_complete
        self._parser = SseParser()
        self._started = False
        self._closed = False
        self._spent = False  # `_count`: the engine's stream has nothing more worth reading
        self._own = own  # None once the first chunk was handed on
        self._before_ns = before_upstream_ns
        self._read_ns = 0

    @property
    def outcome(self) -> StreamOutcome:
        return self._rw.outcome

    def interrupt(self, message: str) -> None:
        """End the stream at once with the API's error event saying `message` (the gateway is shutting down)."""
        self._reads.interrupt(message)

    def __aiter__(self) -> EventRelay:
        return self

    async def __anext__(self) -> bytes:
        rw = self._rw
        if rw.ended:
            raise StopAsyncIteration
        while True:
            data = self._reads.shutdown() or await self._reads.read(started=self._started)
            if isinstance(data, StreamEnd):
                return rw.fail(data.kind, data.message, data.code)
            self._started = True
            if self._own is not None:  # until the first chunk is handed on: when its last read returned
                self._read_ns = perf_counter_ns()
            parts = [out for name, payload in self._parser.feed(data) if not rw.ended
                     for out in (rw.event(name, payload),) if out]
            if rw.ended and rw.outcome.ok and self._on_complete is not None:
                await self._on_complete(rw.outcome)  # on the first chunk's path when the answer came in one read
            if parts or rw.ended:
                if parts and self._own is not None:
                    self._own.first_chunk(self._read_ns, self._before_ns)
                    self._own = None
                return b"".join(parts)

    def _count(self, data: bytes) -> bool:
        """What arrived once nobody reads the stream: every complete event counted (`absorb`), none relayed. True
        once nothing more is worth reading (the engine's terminal event or error, or output past the cut-off)."""
        for name, payload in self._parser.feed(data):
            self._spent = self._spent or self._rw.absorb(name, payload)
        return self._spent

    async def _drain_then_finish(self, *, cancelled: bool) -> None:
        """Read what is left of the engine's stream, relaying nothing (`stream_drain.EngineDrain`: drained, or
        finished for a client that left with few tokens to come), then report the outcome."""
        drain = self._drain
        try:
            await drain.run(self._resp, self._count, finish=cancelled and drain.finishes(self._rw.to_come()))
        finally:
            self._report(cancelled=cancelled)

    def _report(self, *, cancelled: bool) -> None:
        """The outcome once the stream is over: not ok unless the terminal event was relayed with no error, and
        then no answer to store (the client never had it)."""
        out = self._rw.outcome
        if not (self._rw.ended and out.ok):
            out.ok, out.cancelled, out.assembled = False, cancelled, None
        # let go of the callback: a closure over this relay (`ApiPipeline._events`' `done`) is a reference cycle
        # that keeps the request's state for the cyclic GC (`streaming.RelayStream._report`)
        on_done, self._on_done = self._on_done, reported
        on_done(out)

    def close(self, *, cancelled: bool = False) -> None:
        """Release the engine connection and report the outcome; idempotent. A client that left after output
        began, or a stream this gateway ended at its deadline, with `cancel_drain_s` set, is reported once the
        engine's stream is drained (`_drain_then_finish`, in a task given to `spawn`)."""
        if self._closed:
            return
        self._closed = True
        self._reads.close()
        out, ended = self._rw.outcome, self._rw.ended
        if ended and out.ok:
            self._resp.release()
        elif self._spawn is not None and self._drain.wanted(out, ended=ended, cancelled=cancelled):
            self._spawn(self._drain_then_finish(cancelled=cancelled and not ended))
            return
        else:
            try:
                unread = self._resp.content.read_nowait()
            except Exception as exc:  # a broken connection has nothing more to give
                exc.__traceback__ = None  # the reader keeps the error: its traceback (this frame) would be a cycle
                unread = b""
            self._count(unread)  # received but not relayed: its output is charged too
            self._resp.close()  # drop the connection: vLLM aborts the request
        self._report(cancelled=cancelled and not ended)
