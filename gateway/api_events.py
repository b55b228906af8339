"""What the Responses and Messages event rewriters share (`event_relay.EventRewriter`): one engine event in, the
client's bytes out, and what the gateway must know afterwards in `outcome`.

Per event: its JSON is read (an invalid one ends the stream: the engine is broken); an engine's error event is
relayed as the API's own error event with a message fit for a client (`errors.safe_message`: no tracebacks or
addresses); an output delta (`is_delta`) counts as one output chunk (each carries at least one generated
token, which is what a stream whose usage never arrives is charged) and stamps the first/last token times;
the subclass then reads what it needs (`observe`: usage, the assembled answer, the model name to rewrite) and
says whether the event is the stream's last (`terminal`).

The completion cap: the gateway sets the engine's output limit to what was reserved, and an engine that
streams past it is cut off. One engine step can produce more than one delta event (where reasoning turns into
text, or a tool call starts), so the cut-off is at `2 * cap + DELTA_SLACK` deltas, beyond any correct engine;
the charge itself is never above `cap` (`collect.capped`).

`collect`: nothing for a client (a non-streaming request read from an engine stream): only the outcome.

What arrives once nobody reads the stream (the client left, or the gateway ended it at its deadline) is still
counted, never relayed (`absorb`), and `to_come` estimates the reserved tokens still to come from the deltas
seen (vLLM sends these APIs' usage only at the end), to decide whether a departed client lets the engine
finish (`stream_drain`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import orjson

from fleetgate.core.types import Usage
from fleetgate.gateway.collect import capped, charged_usage
from fleetgate.gateway.errors import safe_message
from fleetgate.gateway.sse import to_come
from fleetgate.gateway.streaming import StreamOutcome

log = logging.getLogger("fleetgate.gateway.upstream")

DELTA_SLACK = 16
ENGINE_ERROR = "the engine reported an error; details are in the gateway log"
ERRORS = ("error", "response.failed")  # the engine's error events (the Messages and Responses APIs)


def sse(name: str, obj: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def _read(name: str | None, data: bytes) -> tuple[str, dict[str, Any]] | None:
    """One event's kind (its `type`, else its SSE name) and JSON object; None when it is not an object. Raises
    `orjson.JSONDecodeError` for an invalid one."""
    obj = orjson.loads(data)
    if not isinstance(obj, dict):
        return None
    given = obj.get("type")
    return (given if isinstance(given, str) else name or ""), obj


class ApiEvents:
    """Base of the per-API rewriters; subclasses define the hooks below."""

    def __init__(self, *, endpoint_id: str, cap: int | None, collect: bool) -> None:
        self.outcome = StreamOutcome()
        self.ended = False
        self.known_prompt: int | None = None  # the prompt tokens the engine said it read, before the final usage
        self._endpoint_id = endpoint_id
        self._cap = cap
        self._cut_off = 2 * cap + DELTA_SLACK if cap is not None else None
        self._collect = collect
        self.on_first_token: Callable[[], None] | None = None  # the router's queued-prefill load (set by the caller)

    # ---- hooks ------------------------------------------------------------------------------------------

    def is_delta(self, kind: str, obj: dict[str, Any]) -> bool:
        raise NotImplementedError

    def observe(self, kind: str, obj: dict[str, Any]) -> None:
        """Read usage, assemble, rewrite `obj` in place (model name)."""
        raise NotImplementedError

    def terminal(self, kind: str, obj: dict[str, Any]) -> bool:
        raise NotImplementedError

    def error_event(self, message: str, *, code: str) -> bytes:
        raise NotImplementedError

    # ---- the rewriter -----------------------------------------------------------------------------------

    def event(self, name: str | None, data: bytes) -> bytes | None:
        if data == b"[DONE]":  # not part of these APIs; the terminal event (or its absence) decides
            return None
        try:
            read = _read(name, data)
        except orjson.JSONDecodeError:
            return self.fail("midstream", "the engine sent an invalid event", "bad_gateway")
        if read is None:
            return None
        kind, obj = read
        if kind in ERRORS:
            return self._engine_error(obj, data)
        if not self._take(kind, obj):
            return self.fail("overrun", "the engine generated more than the completion tokens requested; "
                             "the stream was ended there", "max_tokens_exceeded")
        out = self.outcome
        if self.terminal(kind, obj):
            self.ended = True
            out.ok = out.error_kind is None
        if self._collect:
            return None
        return sse(name or kind, obj)

    def absorb(self, name: str | None, data: bytes) -> bool:
        """An event nobody will see (the client left, or the stream already ended) is still counted: its output
        and usage, as `event` would, but nothing is relayed and the outcome's ending is left as it is. True when
        nothing more is worth reading: the engine's terminal event or error, or output past the cut-off."""
        try:
            read = _read(name, data)
        except orjson.JSONDecodeError:
            return False  # a broken event: the usage, if any, is in a later one
        if read is None:
            return False
        kind, obj = read
        return kind in ERRORS or not self._take(kind, obj) or self.terminal(kind, obj)

    def to_come(self) -> int | None:
        """The completion tokens the reservation still allows, as far as the gateway can tell mid-stream (None
        without a cap): vLLM's Responses and Messages streams report usage only in their last events, so until
        then the count so far is one token per output delta. An estimate, used only to decide whether to let the
        engine finish for a client that left (`stream_drain.EngineDrain.finishes`), never charged: a delta can
        hold more than one token (outputs the API server had not sent yet are merged into one), and one engine
        step can yield two deltas (reasoning turning into text), so it is never below 0 (the cut-off, not this,
        catches an engine that runs past its reservation)."""
        left = to_come(self.outcome, self._cap)
        return None if left is None else max(left, 0)

    def _take(self, kind: str, obj: dict[str, Any]) -> bool:
        """Count one event: an output delta is a chunk (first/last token times); then `observe`. False (and not
        observed) when the delta is past the cut-off."""
        out = self.outcome
        if self.is_delta(kind, obj):
            out.chunks += 1
            out.output_chunks += 1
            now = time.perf_counter()
            if out.first_token_at is None:
                out.first_token_at = now
                if self.on_first_token is not None:
                    self.on_first_token()
            out.last_token_at = now
            if self._cut_off is not None and out.output_chunks > self._cut_off:
                return False
        self.observe(kind, obj)
        return True

    def _engine_error(self, obj: dict[str, Any], data: bytes) -> bytes:
        self.outcome.error_kind = "engine_error"
        self.ended = True
        log.warning("engine error event", extra={"endpoint": self._endpoint_id,
                                                 "body": data[:2000].decode("utf-8", "replace")})
        inner = obj.get("error")
        if not isinstance(inner, dict):
            inner = (obj.get("response") or {}).get("error") if isinstance(obj.get("response"), dict) else obj
        message = inner.get("message") if isinstance(inner, dict) else None
        safe = safe_message(message) if isinstance(message, str) else None
        return self.error_event(safe or ENGINE_ERROR, code="engine_error")

    def fail(self, kind: str, message: str, code: str) -> bytes:
        """End the stream with the API's error event; the message names no endpoint (that goes to the log)."""
        log.warning("engine stream failed", extra={"endpoint": self._endpoint_id, "kind": kind, "detail": message})
        self.outcome.error_kind = kind
        self.ended = True
        return self.error_event(message, code=code)


def charged_events(out: StreamOutcome, *, known_prompt: int | None, prompt_estimate: int,
                   completion_cap: int | None) -> Usage:
    """What an event stream is charged: the engine's final usage when it came (`outcome.usage`); else the prompt
    the engine said it read (or the request's prompt estimate) and one token per output delta seen."""
    if out.usage is not None and not out.bad_usage:
        return charged_usage(out, prompt_estimate=prompt_estimate, completion_cap=completion_cap)
    prompt = known_prompt if known_prompt is not None else prompt_estimate
    return capped(Usage(prompt_tokens=prompt, completion_tokens=out.output_chunks, estimated=known_prompt is None),
                  completion_cap)
