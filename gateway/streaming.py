"""Relaying an engine's server-sent events to the client, chunk by chunk, as they arrive.

Each network read from the engine is relayed at once: every complete event in it is rewritten and
the results go out in one write (under load several events arrive together and cost one syscall;
the gateway never waits for more data before sending what it has).

Upstream the gateway always asks for `include_usage` + `continuous_usage_stats`, so every engine
chunk carries the usage so far: accounting is exact even when the client leaves mid-stream.
Each chunk is rewritten for the client: usage is removed unless the client asked for it (then
`usage: null` on content chunks and the final usage-only chunk, as OpenAI does; every chunk's usage
if it also asked for continuous stats), and `model` names what the gateway served. A malformed usage
(`engine_usage`) is dropped and flagged in the outcome; the pipeline then charges an estimate.

A silent engine (no chunk within the first-byte / inter-chunk timeout), a broken connection or an
end without `[DONE]` ends the client stream with an OpenAI-shaped error event and `[DONE]`. So do three
limits the gateway holds whatever the engine does: `completion_cap` (the completion tokens reserved over
all sequences: an engine streaming past `max_tokens` is cut off there, and charged no more), `deadline`
(the stream's total time, `server.stream_deadline_s`) and `interrupt()` (the gateway is shutting down:
the stream ends now, at its next read or during the one it is waiting on).
`close()` is called exactly once by the web layer (end, error or client disconnect): it closes
the upstream connection if the stream did not finish (the engine aborts the request) and hands a
`StreamOutcome` to the pipeline's callback.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from fleetgate.gateway.assembly import StreamAssembler
from fleetgate.gateway.engine_usage import parse_usage
from fleetgate.gateway.errors import safe_message

DONE = b"data: [DONE]\n\n"

log = logging.getLogger("fleetgate.gateway.upstream")


def error_event(message: str, *, code: str, type_: str = "server_error") -> bytes:
    body = {"error": {"message": message, "type": type_, "param": None, "code": code}}
    return b"data: " + orjson.dumps(body) + b"\n\n"


@dataclass(slots=True)
class StreamOutcome:
    ok: bool = False  # ended with [DONE] and no error event
    cancelled: bool = False  # the client went away first
    error_kind: str | None = None  # timeout | midstream | engine_error
    usage: dict[str, Any] | None = None  # the last well-formed usage the engine reported
    bad_usage: bool = False  # the engine sent a usage that is not one (`engine_usage.parse_usage`)
    first_token_at: float | None = None  # perf_counter of the first chunk with generated output
    last_token_at: float | None = None
    chunks: int = 0
    output_chunks: int = 0  # chunks that carried generated output (>= 1 token each)
    assembled: dict[str, Any] | None = None  # the complete response (when assembling and ok)
    extra: dict[str, str] = field(default_factory=dict)


def _has_output(choices: list[Any]) -> bool:
    for c in choices:
        if not isinstance(c, dict):
            continue
        if c.get("text"):
            return True
        delta = c.get("delta")
        if isinstance(delta, dict) and (
            delta.get("content") or delta.get("tool_calls") or delta.get("reasoning_content")
        ):
            return True
    return False


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
        spawn: Callable[[Coroutine[Any, Any, None]], None] | None = None,
    ) -> None:
        self._resp = response
        self._endpoint_id = endpoint_id
        self._first_timeout = first_byte_timeout_s
        self._inter_timeout = inter_chunk_timeout_s
        self._include_usage = include_usage
        self._continuous = include_usage and continuous_usage
        self._model_name = model_name
        self._assembler = assembler
        self._on_done = on_done
        self._collect_only = collect_only  # nothing for a client: only usage and the assembled answer
        self._drain_s = cancel_drain_s if spawn is not None else 0.0
        self._spawn = spawn
        self._outcome = StreamOutcome()
        self._ended = False  # [DONE] (ours or the engine's) was produced
        self._buf = b""  # bytes read from the engine, not yet relayed
        self._pos = 0
        self._closed = False
        self._cap = completion_cap
        self._deadline = deadline  # loop time by which the whole stream must end
        self._interrupted: str | None = None
        self._timer: asyncio.Timeout | None = None  # the running read's timeout, rescheduled by `interrupt`

    def interrupt(self, message: str) -> None:
        """End the stream at once with an error event saying `message` (the gateway is shutting down)."""
        if self._interrupted is None:
            self._interrupted = message
        if self._timer is not None:
            self._timer.reschedule(asyncio.get_running_loop().time())

    def __aiter__(self) -> RelayStream:
        return self

    async def __anext__(self) -> bytes:
        """Everything the engine sent in one network read, rewritten; waits only when nothing is buffered."""
        if self._ended:
            raise StopAsyncIteration
        parts: list[bytes] = []
        while True:
            buf = self._buf
            while not self._ended:
                end = buf.find(b"\n", self._pos)
                if end < 0:
                    break
                line = buf[self._pos : end]
                self._pos = end + 1
                event = self._event(line)
                if event is not None:
                    parts.append(event)
            if parts or self._ended:
                return b"".join(parts)
            self._buf = buf[self._pos :]
            self._pos = 0
            if self._interrupted is not None:
                return self._fail("shutdown", self._interrupted, "server_shutting_down")
            timeout = self._inter_timeout if self._outcome.chunks else self._first_timeout
            loop = asyncio.get_running_loop()
            when = loop.time() + timeout
            if self._deadline is not None:
                when = min(when, self._deadline)
            try:
                async with asyncio.timeout_at(when) as self._timer:
                    data = await self._resp.content.readany()
            except TimeoutError:
                if self._interrupted is not None:
                    return self._fail("shutdown", self._interrupted, "server_shutting_down")
                if self._deadline is not None and loop.time() >= self._deadline:
                    return self._fail("deadline", "the stream reached the gateway's deadline for a whole stream",
                                      "stream_deadline")
                return self._fail(
                    "timeout", f"the engine sent nothing for {timeout:g}s", "upstream_timeout"
                )
            except aiohttp.ClientError as exc:
                log.warning("engine stream broke off", extra={"endpoint": self._endpoint_id, "error": repr(exc)})
                return self._fail("midstream", "the engine broke off the stream", "upstream_error")
            finally:
                self._timer = None
            if not data:
                return self._fail(
                    "midstream", "the engine closed the stream before it finished", "upstream_error"
                )
            self._buf += data

    def _event(self, line: bytes) -> bytes | None:
        """One SSE line from the engine -> the bytes for the client, or None to drop it."""
        if not line.startswith(b"data:"):
            return None  # blank separators, comments, event names
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self._ended = True
            self._outcome.ok = self._outcome.error_kind is None
            return DONE
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return self._fail("midstream", "the engine sent an invalid chunk", "bad_gateway")
        if not isinstance(chunk, dict):
            return None
        if "error" in chunk or chunk.get("object") == "error":
            # Relayed as a clean event: an engine's message can hold tracebacks or internal addresses.
            self._outcome.error_kind = "engine_error"
            log.warning("engine error event", extra={"endpoint": self._endpoint_id, "body": payload[:2000].decode(
                "utf-8", "replace")})
            inner = chunk.get("error")
            message = (inner if isinstance(inner, dict) else chunk).get("message")
            safe = safe_message(message) if isinstance(message, str) else None
            return error_event(safe or "the engine reported an error; details are in the gateway log",
                               code="engine_error")
        return self._rewrite(chunk)

    def _over_cap(self, usage: dict[str, Any] | None) -> bool:
        """The engine generated more than the completion tokens reserved for all sequences."""
        if self._cap is None:
            return False
        parsed = parse_usage(usage) if usage is not None else None
        done = parsed.completion_tokens if parsed is not None else self._outcome.output_chunks
        return done > self._cap

    def _rewrite(self, chunk: dict[str, Any]) -> bytes | None:
        out = self._outcome
        usage = chunk.get("usage")
        if usage is not None and usage != {}:
            if parse_usage(usage) is None:
                out.bad_usage = True  # never relayed, never read as numbers: charged by estimate instead
                usage = None
                del chunk["usage"]
            elif self._over_cap(usage):
                return self._fail("overrun", f"the engine generated more than the {self._cap} completion tokens "
                                  "requested; the stream was ended there", "max_tokens_exceeded")
            else:
                out.usage = usage
        choices = chunk.get("choices")
        if not choices:
            if self._collect_only or not (usage and self._include_usage):
                return None  # the usage-only chunk the client did not ask for
        else:
            now = time.perf_counter()
            out.chunks += 1
            if _has_output(choices):
                out.output_chunks += 1
                if out.usage is None and self._over_cap(None):  # no usage to go by: each chunk >= 1 token
                    return self._fail("overrun", f"the engine generated more than the {self._cap} completion "
                                      "tokens requested; the stream was ended there", "max_tokens_exceeded")
                if out.first_token_at is None:
                    out.first_token_at = now
                out.last_token_at = now
            if self._assembler is not None:
                self._assembler.add(chunk)
            if self._collect_only:
                return None
            if "usage" in chunk and not self._continuous:
                if self._include_usage:
                    chunk["usage"] = None
                else:
                    del chunk["usage"]
        if self._model_name is not None:
            chunk["model"] = self._model_name
        return b"data: " + orjson.dumps(chunk) + b"\n\n"

    def _absorb_buffered(self) -> None:
        """Before hanging up early: count the usage in what the engine sent and the gateway received but
        did not relay yet (a client that leaves is charged up to the engine's last reported token that
        reached the gateway, not only up to the last one relayed)."""
        try:
            data = self._buf[self._pos :] + self._resp.content.read_nowait()
        except Exception:  # a broken connection has nothing more to give
            data = self._buf[self._pos :]
        self._absorb(data, final=True)

    def _absorb(self, data: bytes, *, final: bool) -> bytes:
        """Read the usage and output chunks of the complete events in `data`, nothing relayed; returns the
        incomplete last line (all of it is tried when `final`)."""
        lines = data.split(b"\n")
        rest = b"" if final else lines.pop()
        for line in lines:
            if not line.startswith(b"data:"):
                continue
            try:
                chunk = orjson.loads(line[5:].strip())
            except orjson.JSONDecodeError:
                continue  # a partial last event, or [DONE]
            if not isinstance(chunk, dict):
                continue
            usage = chunk.get("usage")
            if usage:
                if parse_usage(usage) is None:
                    self._outcome.bad_usage = True
                else:
                    self._outcome.usage = usage
            choices = chunk.get("choices")
            if isinstance(choices, list) and _has_output(choices):
                self._outcome.output_chunks += 1
        return rest

    async def _buffered(self) -> bytes:
        """Every byte that has arrived from the engine by now, without waiting for more (one event-loop turn
        first, so bytes already in the socket reach the reader)."""
        await asyncio.sleep(0)
        return self._resp.content.read_nowait()

    async def _drain_then_finish(self) -> None:
        """The client left mid-stream. vLLM counts a token when its engine step's output is processed, a moment
        before it writes the chunk, and hangs up on an abort without sending what it counted but did not
        write: hanging up at an arbitrary moment loses those tokens to the tenant's charge. So the gateway
        takes in what already arrived, waits for the engine's next chunk (right after a write, nothing
        counted is pending), then half-closes the connection (the engine sees the client leave and aborts;
        servers flush what they wrote before closing) and reads everything up to the engine's close, taking
        the last usage seen; at most `cancel_drain_s`, then it hangs up anyway. Costs the engine at most one
        more token. A gateway too busy to read that chunk within an engine step can still miss a token."""
        pending = self._buf[self._pos :]
        self._buf, self._pos = b"", 0
        content = self._resp.content
        try:
            async with asyncio.timeout(self._drain_s):
                pending = self._absorb(pending + await self._buffered(), final=False)
                data = await content.readany()
                if data:
                    data += await self._buffered()
                pending = self._absorb(pending + data, final=False)
                connection = self._resp.connection
                transport = connection.transport if connection is not None else None
                if data and transport is not None and transport.can_write_eof():
                    transport.write_eof()
                while data:
                    data = await content.readany()
                    pending = self._absorb(pending + data, final=False)
        except (TimeoutError, aiohttp.ClientError, OSError):
            pass  # what was read is counted; the rest is the engine's to drop
        finally:
            self._absorb(pending, final=True)
            self._resp.close()
            self._finish()

    def _fail(self, kind: str, message: str, code: str) -> bytes:
        """End the stream with an error event; the message names no endpoint (that goes to the log)."""
        log.warning("engine stream failed", extra={"endpoint": self._endpoint_id, "kind": kind, "detail": message})
        self._outcome.error_kind = kind
        self._ended = True
        return error_event(message, code=code) + DONE

    def close(self, *, cancelled: bool = False) -> None:
        """Release the engine connection and report the outcome; idempotent. A client that left after output
        began, with `cancel_drain_s` set, is reported once the engine's stream is drained
        (`_drain_then_finish`, in a task given to `spawn`)."""
        if self._closed:
            return
        self._closed = True
        out = self._outcome
        if self._ended and out.ok:
            self._resp.release()
        elif cancelled and not self._ended and out.output_chunks and self._drain_s > 0 and self._spawn is not None:
            out.ok = False
            out.cancelled = True
            self._spawn(self._drain_then_finish())
            return
        else:
            self._absorb_buffered()
            self._resp.close()  # drop the connection: vLLM aborts the request
            out.ok = False
            out.cancelled = cancelled and not self._ended
        self._finish()

    def _finish(self) -> None:
        out = self._outcome
        if out.ok and self._assembler is not None:
            out.assembled = self._assembler.result(usage=out.usage)
        self._on_done(out)


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
