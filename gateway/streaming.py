"""Relaying an engine's server-sent events to the client, chunk by chunk, as they arrive.

Each network read from the engine is relayed at once: every complete event in it is rewritten
(`sse.SseRewriter`: usage, model name, error events, the completion cap) and the results go out in one write (under load
several events arrive together and cost one syscall; the gateway never waits for more data before
sending what it has).

A silent engine (no chunk within the first-byte / inter-chunk timeout), a broken connection or an
end without `[DONE]` ends the client stream with an OpenAI-shaped error event and `[DONE]`. So do three
limits the gateway holds whatever the engine does: `completion_cap` (the completion tokens reserved over
all sequences: an engine streaming past `max_tokens` is cut off there, and charged no more), `deadline`
(the stream's total time, `server.stream_deadline_s`) and `interrupt()` (the gateway is shutting down:
the stream ends now, at its next read or during the one it is waiting on).
`close()` is called exactly once by the web layer (end, error or client disconnect): it closes
the upstream connection if the stream did not finish (the engine aborts the request) and hands a
`StreamOutcome` to the pipeline's callback. A client that left after output began, or a stream the gateway
ended at its deadline, is reported once the engine's stream is drained (`stream_drain.EngineDrain`, with
`cancel_drain_s`), so it is charged what the engine counted. With `cancel_finish_tokens`, a client that leaves
with at most that many completion tokens still to come (its reservation less what the engine reported,
`SseRewriter.to_come`) lets the engine finish instead: no abort, so the charge is exactly the engine's count
(an abort can lose the tokens of the engine step in flight).
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from time import perf_counter_ns
from typing import Any

import aiohttp

from fleetgate.gateway.assembly import StreamAssembler
from fleetgate.gateway.own_time import OwnTime
from fleetgate.gateway.sse import DONE, SseRewriter, StreamOutcome, error_event
from fleetgate.gateway.stream_drain import EngineDrain
from fleetgate.gateway.stream_reads import StreamEnd, StreamReads

__all__ = ["DONE", "RelayStream", "ReplayStream", "StreamOutcome", "error_event", "reported"]


def reported(outcome: StreamOutcome) -> None:
    """A relay's `on_done` once it was called: an outcome is reported once."""
    raise AssertionError("a stream's outcome is reported once")


class RelayStream:
    """Async iterator of the client's SSE bytes for one engine response."""

    def __init__(
        self,
        *,
        response: aiohttp.ClientResponse,
        endpoint_id: str,
        first_byte_timeout_s: float,
        inter_chunk_timeout_s: float,
        include_usage: bool,
        continuous_usage: bool,
        model_name: str | None,
        assembler: StreamAssembler | None,
        on_done: Callable[[StreamOutcome], None],
        collect_only: bool = False,
        completion_cap: int | None = None,
        deadline: float | None = None,
        cancel_drain_s: float = 0.0,
        cancel_finish_tokens: int = 0,
        spawn: Callable[[Coroutine[Any, Any, None]], None] | None = None,
        on_first_token: Callable[[], None] | None = None,
        own: OwnTime | None = None,
        before_upstream_ns: int = 0,
    ) -> None:
        """`own`: where the first chunk's `first_chunk` phase is observed (`own_time`; None: not measured), with the
        request's `before_upstream_ns` for the total."""
        self._resp = response
        self._reads = StreamReads(response, endpoint_id=endpoint_id, first_byte_timeout_s=first_byte_timeout_s,
                                  inter_chunk_timeout_s=inter_chunk_timeout_s, deadline=deadline)
        self._rw = SseRewriter(endpoint_id=endpoint_id, include_usage=include_usage,
                               continuous_usage=continuous_usage, model_name=model_name, assembler=assembler,
                               collect_only=collect_only, completion_cap=completion_cap,
                               on_first_token=on_first_token)
        self._on_done = on_done
        self._drain = EngineDrain(drain_s=cancel_drain_s, finish_tokens=cancel_finish_tokens,
                                  inter_chunk_s=inter_chunk_timeout_s, deadline=deadline)
        self._spawn = spawn
        self._closed = False
        self._own = own  # None once the first chunk was handed on
        self._before_ns = before_upstream_ns
        self._read_ns = 0

    def interrupt(self, message: str) -> None:
        """End the stream at once with an error event saying `message` (the gateway is shutting down)."""
        self._reads.interrupt(message)

    def __aiter__(self) -> RelayStream:
        return self

    async def __anext__(self) -> bytes:
        """Everything the engine sent in one network read, rewritten; waits only when nothing is ready."""
        rw = self._rw
        if rw.ended:
            raise StopAsyncIteration
        while True:
            data = self._reads.shutdown() or await self._reads.read(started=bool(rw.outcome.chunks))
            if isinstance(data, StreamEnd):
                return rw.fail(data.kind, data.message, data.code)
            if self._own is not None:  # until the first chunk is handed on: when its last read returned
                self._read_ns = perf_counter_ns()
            out = rw.feed(data)
            if out or rw.ended:
                if out and self._own is not None:
                    self._own.first_chunk(self._read_ns, self._before_ns)
                    self._own = None
                return out

    async def _drain_then_finish(self, *, cancelled: bool) -> None:
        """Read what is left of the engine's stream, relaying nothing (`stream_drain.EngineDrain`: drained, or
        finished for a client that left with few tokens to come), then report the outcome."""
        rw, drain = self._rw, self._drain
        try:
            await drain.run(self._resp, rw.count, finish=cancelled and drain.finishes(rw.to_come()))
        finally:
            rw.absorb(rw.take_pending(), final=True)
            self._report(rw.close(cancelled=cancelled))

    def close(self, *, cancelled: bool = False) -> None:
        """Release the engine connection and report the outcome; idempotent. A client that left after output
        began, or a stream this gateway ended at its deadline (the engine is still generating: hanging up would
        leave its step in flight uncharged), with `cancel_drain_s` set, is reported once the engine's stream is
        drained (`_drain_then_finish`, in a task given to `spawn`)."""
        if self._closed:
            return
        self._closed = True
        self._reads.close()
        rw = self._rw
        if rw.ended and rw.outcome.ok:
            self._resp.release()
        elif self._spawn is not None and self._drain.wanted(rw.outcome, ended=rw.ended, cancelled=cancelled):
            self._spawn(self._drain_then_finish(cancelled=cancelled and not rw.ended))
            return
        else:
            try:
                unread = rw.pending + self._resp.content.read_nowait()
            except Exception as exc:  # a broken connection has nothing more to give
                exc.__traceback__ = None  # the reader keeps the error: its traceback (this frame) would be a cycle
                unread = rw.pending
            rw.absorb(unread)
            self._resp.close()  # drop the connection: vLLM aborts the request
        self._report(rw.close(cancelled=cancelled))

    def _report(self, outcome: StreamOutcome) -> None:
        """Hand the outcome to `on_done`, and let go of it: the callback is usually a closure over this stream
        (the pipeline's `done` names the relay), a reference cycle that would keep the request's whole state
        (context, engine response, rewriter) for the cyclic GC, whose collections stop the loop."""
        on_done, self._on_done = self._on_done, reported
        on_done(outcome)


class ReplayStream:
    """A fixed list of SSE chunks (a cache hit replayed) behind the same interface as `RelayStream`."""

    def __init__(self, chunks: list[bytes], *, on_done: Callable[[bool], None]) -> None:
        self._chunks = iter(chunks)
        self._on_done = on_done
        self._finished = False
        self._closed = False

    def __aiter__(self) -> ReplayStream:
        return self

    async def __anext__(self) -> bytes:
        try:
            return next(self._chunks)
        except StopIteration:
            self._finished = True
            raise StopAsyncIteration from None

    def close(self, *, cancelled: bool = False) -> None:
        if not self._closed:
            self._closed = True
            self._on_done(self._finished and not cancelled)
