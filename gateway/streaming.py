"""Relaying an engine's server-sent events to the client, chunk by chunk, as they arrive.

Each network read from the engine is relayed at once: every complete event in it is rewritten
(`sse.SseRewriter`: usage, model name, error events) and the results go out in one write (under load
several events arrive together and cost one syscall; the gateway never waits for more data before
sending what it has).

A silent engine (no chunk within the first-byte / inter-chunk timeout), a broken connection or an
end without `[DONE]` ends the client stream with an OpenAI-shaped error event and `[DONE]`.
`close()` is called exactly once by the web layer (end, error or client disconnect): it closes
the upstream connection if the stream did not finish (the engine aborts the request) and hands a
`StreamOutcome` to the pipeline's callback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import aiohttp

from fleetgate.gateway.assembly import StreamAssembler
from fleetgate.gateway.sse import DONE, SseRewriter, StreamOutcome, error_event

__all__ = ["DONE", "RelayStream", "ReplayStream", "StreamOutcome", "error_event"]

log = logging.getLogger("fleetgate.gateway.upstream")


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
    ) -> None:
        self._resp = response
        self._endpoint_id = endpoint_id
        self._first_timeout = first_byte_timeout_s
        self._inter_timeout = inter_chunk_timeout_s
        self._rw = SseRewriter(endpoint_id=endpoint_id, include_usage=include_usage,
                               continuous_usage=continuous_usage, model_name=model_name, assembler=assembler,
                               collect_only=collect_only)
        self._on_done = on_done
        self._closed = False

    def __aiter__(self) -> RelayStream:
        return self

    async def __anext__(self) -> bytes:
        """Everything the engine sent in one network read, rewritten; waits only when nothing is ready."""
        rw = self._rw
        if rw.ended:
            raise StopAsyncIteration
        while True:
            timeout = self._inter_timeout if rw.outcome.chunks else self._first_timeout
            try:
                async with asyncio.timeout(timeout):
                    data = await self._resp.content.readany()
            except TimeoutError:
                return rw.fail("timeout", f"the engine sent nothing for {timeout:g}s", "upstream_timeout")
            except aiohttp.ClientError as exc:
                log.warning("engine stream broke off", extra={"endpoint": self._endpoint_id, "error": repr(exc)})
                return rw.fail("midstream", "the engine broke off the stream", "upstream_error")
            if not data:
                return rw.fail("midstream", "the engine closed the stream before it finished", "upstream_error")
            out = rw.feed(data)
            if out or rw.ended:
                return out

    def close(self, *, cancelled: bool = False) -> None:
        """Release the engine connection and report the outcome; idempotent."""
        if self._closed:
            return
        self._closed = True
        rw = self._rw
        if rw.ended and rw.outcome.ok:
            self._resp.release()
        else:
            try:
                unread = rw.pending + self._resp.content.read_nowait()
            except Exception:  # a broken connection has nothing more to give
                unread = rw.pending
            rw.absorb(unread)
            self._resp.close()  # drop the connection: vLLM aborts the request
        self._on_done(rw.close(cancelled=cancelled))


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
