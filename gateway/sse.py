"""Rewriting an engine's server-sent events for the client, fed any split of bytes; no I/O.

Both front doors relay engine streams through this: the HTTP gateway feeds it each network read
(`streaming.RelayStream`), the Endpoint Picker each response-body chunk Envoy hands it over ext_proc.

Upstream the gateway always asks for `include_usage` + `continuous_usage_stats`, so every engine chunk
carries the usage so far: accounting is exact even when the client leaves mid-stream. Each chunk is
rewritten for the client: usage is removed unless the client asked for it (then `usage: null` on content
chunks and the final usage-only chunk, as OpenAI does; every chunk's usage if it also asked for continuous
stats), and `model` names what the gateway served. A malformed usage (`engine_usage`) is dropped and
flagged in the outcome; the gateway then charges an estimate. An engine's error event is relayed as a
clean error event (its message can hold tracebacks or internal addresses). Events after `[DONE]` are
ignored. `completion_cap` (the completion tokens reserved over all sequences, `reserving.Reserver`): an
engine that generates past the client's `max_tokens` is cut off there with an error event (`overrun`), and
is charged no more (`collect.charged_usage`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import orjson

from fleetgate.gateway.assembly import StreamAssembler
from fleetgate.gateway.engine_usage import parse_usage, usage_counts
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
    error_kind: str | None = None  # timeout | deadline | shutdown | midstream | engine_error | overrun
    usage: dict[str, Any] | None = None  # the last well-formed usage the engine reported
    bad_usage: bool = False  # the engine sent a usage that is not one (`engine_usage.parse_usage`)
    first_token_at: float | None = None  # perf_counter of the first chunk with generated output
    last_token_at: float | None = None
    chunks: int = 0
    output_chunks: int = 0  # chunks that carried generated output (>= 1 token each)
    assembled: dict[str, Any] | None = None  # the complete response (when assembling and ok)
    extra: dict[str, str] = field(default_factory=dict)


def to_come(out: StreamOutcome, cap: int | None) -> int | None:
    """The completion tokens `cap` still allows after what `out` counted: the engine's last usage, else one token
    per output chunk (negative: past it); None without a cap."""
    if cap is None:
        return None
    counts = usage_counts(out.usage) if out.usage is not None else None
    return cap - (counts[1] if counts is not None else out.output_chunks)


def has_output(choices: list[Any]) -> bool:
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


class SseRewriter:
    """One engine stream's events in, the client's bytes out; `outcome` accumulates what happened."""

    def __init__(
        self,
        *,
        endpoint_id: str,
        include_usage: bool,
        continuous_usage: bool,
        model_name: str | None,
        assembler: StreamAssembler | None,
        collect_only: bool = False,
        completion_cap: int | None = None,
        on_first_token: Callable[[], None] | None = None,
    ) -> None:
        self._endpoint_id = endpoint_id
        self._on_first_token = on_first_token  # the router's queued-prefill load: this request's prefill is over
        self._include_usage = include_usage
        self._continuous = include_usage and continuous_usage
        self._model_name = model_name
        self._assembler = assembler
        self._collect_only = collect_only  # nothing for a client: only usage and the assembled answer
        self._cap = completion_cap
        self.outcome = StreamOutcome()
        self.ended = False  # [DONE] (ours or the engine's) was produced
        self._buf = b""  # an incomplete last line, until the rest arrives

    @property
    def pending(self) -> bytes:
        """Bytes received but not rewritten yet (an incomplete line, or all that followed an early end)."""
        return self._buf

    def take_pending(self) -> bytes:
        """`pending`, handed over: nothing more is rewritten from it."""
        pending, self._buf = self._buf, b""
        return pending

    def feed(self, data: bytes) -> bytes:
        """The client's bytes for every complete event line in what arrived so far (b"" when none). Once the
        stream has ended (an overrun, an invalid chunk), what still arrives is only counted (`absorb`): the
        engine's work that reached the gateway is known, though never relayed (nor charged past the cap)."""
        if self.ended:
            self._buf = self.absorb(self._buf + data, final=False)
            return b""
        buf = self._buf + data if self._buf else data
        parts: list[bytes] = []
        pos = 0
        while not self.ended:
            end = buf.find(b"\n", pos)
            if end < 0:
                break
            line = buf[pos:end]
            pos = end + 1
            if not line.startswith(b"data:"):
                continue  # blank separators (every other line), comments, event names
            event = self._event(line)
            if event is not None:
                parts.append(event)
        self._buf = buf[pos:]  # after an early end: received, not relayed, still counted by `absorb`
        return b"".join(parts)

    def _event(self, line: bytes) -> bytes | None:
        """One SSE `data:` line from the engine -> the bytes for the client, or None to drop it."""
        payload = line[5:].strip()
        if payload == b"[DONE]":
            self.ended = True
            self.outcome.ok = self.outcome.error_kind is None
            return DONE
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            return self.fail("midstream", "the engine sent an invalid chunk", "bad_gateway")
        if not isinstance(chunk, dict):
            return None
        if "error" in chunk or chunk.get("object") == "error":
            self.outcome.error_kind = "engine_error"
            log.warning("engine error event", extra={"endpoint": self._endpoint_id, "body": payload[:2000].decode(
                "utf-8", "replace")})
            inner = chunk.get("error")
            message = (inner if isinstance(inner, dict) else chunk).get("message")
            safe = safe_message(message) if isinstance(message, str) else None
            return error_event(safe or "the engine reported an error; details are in the gateway log",
                               code="engine_error")
        return self._rewrite(chunk)

    def to_come(self) -> int | None:
        """Completion tokens the reservation still allows (negative: the engine went past it); None without a cap."""
        return to_come(self.outcome, self._cap)

    def count(self, data: bytes) -> bool:
        """What arrived once nobody reads the stream (the client left, or it ended early): counted, never relayed
        (`absorb`; an incomplete last line waits in `pending`). True when the engine went past the reservation:
        nothing more is worth reading (`stream_drain.EngineDrain`)."""
        self._buf = self.absorb(self._buf + data, final=False)
        to_come = self.to_come()
        return to_come is not None and to_come < 0

    def _over_cap(self, done: int) -> bool:
        """The engine generated (`done` tokens) more than the completion tokens reserved for all sequences."""
        return self._cap is not None and done > self._cap

    def _overrun(self) -> bytes:
        return self.fail("overrun", f"the engine generated more than the {self._cap} completion tokens requested; "
                         "the stream was ended there", "max_tokens_exceeded")

    def _rewrite(self, chunk: dict[str, Any]) -> bytes | None:
        out = self.outcome
        usage = chunk.get("usage")
        if usage is not None and usage != {}:
            counts = usage_counts(usage)
            if counts is None:
                out.bad_usage = True  # never relayed, never read as numbers: charged by estimate instead
                usage = None
                del chunk["usage"]
            elif self._over_cap(counts[1]):
                return self._overrun()
            else:
                out.usage = usage
        choices = chunk.get("choices")
        if not choices:
            if self._collect_only or not (usage and self._include_usage):
                return None  # the usage-only chunk the client did not ask for
        else:
            now = time.perf_counter()
            out.chunks += 1
            if has_output(choices):
                out.output_chunks += 1
                if out.usage is None and self._over_cap(out.output_chunks):  # no usage: each chunk >= 1 token
                    return self._overrun()
                if out.first_token_at is None:
                    out.first_token_at = now
                    if self._on_first_token is not None:
                        self._on_first_token()
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

    def absorb(self, data: bytes, *, final: bool = True) -> bytes:
        """Before hanging up early: count the usage in what the engine sent and the gateway received but did
        not relay yet (a client that leaves is charged up to the engine's last reported token that reached the
        gateway, not only up to the last one relayed). Nothing is relayed. Returns the incomplete last line
        (every line is tried when `final`)."""
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
                    self.outcome.bad_usage = True
                else:
                    self.outcome.usage = usage
            choices = chunk.get("choices")
            if isinstance(choices, list) and has_output(choices):
                self.outcome.output_chunks += 1
        return rest

    def fail(self, kind: str, message: str, code: str) -> bytes:
        """End the stream with an error event; the message names no endpoint (that goes to the log)."""
        log.warning("engine stream failed", extra={"endpoint": self._endpoint_id, "kind": kind, "detail": message})
        self.outcome.error_kind = kind
        self.ended = True
        return error_event(message, code=code) + DONE

    def close(self, *, cancelled: bool) -> StreamOutcome:
        """The outcome once the stream is over: not ok unless [DONE] came with no error; `cancelled` counts only
        when the stream had not ended; the assembled answer when assembling and ok."""
        out = self.outcome
        if not (self.ended and out.ok):
            out.ok = False
            out.cancelled = cancelled and not self.ended
        if out.ok and self._assembler is not None:
            out.assembled = self._assembler.result(usage=out.usage)
        return out
