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
web layer; when the stream had not ended it first reads what the engine sent but was not relayed yet (its
output still counts), then drops the connection (vLLM aborts the request), and reports the outcome. A client
that left after output began, with `cancel_drain_s` and `spawn` given, gets the chat relay's drain
(`streaming.RelayStream._drain_then_finish`: why): read to the engine's next event, half-close, read to its
close, at most `cancel_drain_s`; the outcome is reported after it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

import aiohttp

from fleetgate.gateway.stream_reads import StreamEnd, StreamReads
from fleetgate.gateway.streaming import StreamOutcome


class EventRewriter(Protocol):
    """One API's events: `event(name, data)` -> the client's bytes (None: nothing), `fail` -> the API's error event."""

    outcome: StreamOutcome
    ended: bool  # the terminal event or an error was produced: nothing more is read

    def event(self, name: str | None, data: bytes) -> bytes | None: ...

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
        spawn: Callable[[Coroutine[Any, Any, None]], None] | None = None,
    ) -> None:
        self._resp = response
        self._drain_s = cancel_drain_s if spawn is not None else 0.0
        self._spawn = spawn
        self._rw = rewriter
        self._reads = StreamReads(response, endpoint_id=endpoint_id, first_byte_timeout_s=first_byte_timeout_s,
                                  inter_chunk_timeout_s=inter_chunk_timeout_s, deadline=deadline)
        self._on_done = on_done
        self._on_complete = on_complete
        self._parser = SseParser()
        self._started = False
        self._closed = False

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
            parts = [out for name, payload in self._parser.feed(data) if not rw.ended
                     for out in (rw.event(name, payload),) if out]
            if rw.ended and rw.outcome.ok and self._on_complete is not None:
                await self._on_complete(rw.outcome)
            if parts or rw.ended:
                return b"".join(parts)

    def _absorb(self) -> None:
        """Before hanging up early: the events the engine sent and the gateway received but did not relay yet
        (their output is charged too). Their bytes go nowhere."""
        try:
            data = self._resp.content.read_nowait()
        except Exception:  # a broken connection has nothing more to give
            data = b""
        self._take(data)

    def _take(self, data: bytes) -> None:
        for name, payload in self._parser.feed(data):
            if self._rw.ended:
                break
            self._rw.event(name, payload)

    async def _drain_then_finish(self) -> None:
        """The client left mid-stream: what the engine already sent, its next event, then a half-close and
        everything up to its close, at most `cancel_drain_s` (see the module doc); then report."""
        content = self._resp.content
        try:
            async with asyncio.timeout(self._drain_s):
                await asyncio.sleep(0)  # bytes already in the socket reach the reader
                self._take(content.read_nowait())
                data = await content.readany()
                self._take(data)
                connection = self._resp.connection
                transport = connection.transport if connection is not None else None
                if data and transport is not None and transport.can_write_eof():
                    transport.write_eof()
                while data and not self._rw.ended:
                    data = await content.readany()
                    self._take(data)
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass  # what was read is counted; the rest is the engine's to drop
        finally:
            self._resp.close()
            out = self._rw.outcome
            out.ok, out.cancelled = False, True  # the client left, whatever the engine sent meanwhile
            self._on_done(out)

    def close(self, *, cancelled: bool = False) -> None:
        """Release the engine connection and report the outcome; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._reads.close()
        out = self._rw.outcome
        ended = self._rw.ended
        if ended and out.ok:
            self._resp.release()
        elif cancelled and not ended and out.output_chunks and self._drain_s > 0 and self._spawn is not None:
            self._spawn(self._drain_then_finish())
            return
        else:
            if not ended:
                self._absorb()
            self._resp.close()  # drop the connection: vLLM aborts the request
            out.cancelled = cancelled and not ended
            out.ok = False
        self._on_done(out)

