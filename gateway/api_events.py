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
from fleetgate.gateway.streaming import StreamOutcome

log = logging.getLogger("fleetgate.gateway.upstream")

DELTA_SLACK = 16
ENGINE_ERROR = "the engine reported an error; details are in the gateway log"


def sse(name: str, obj: Any) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


class ApiEvents:
    """Base of the per-API rewriters; subclasses define the hooks below."""

    def __init__(self, *, endpoint_id: str, cap: int | None, collect: bool) -> None:
        self.outcome = StreamOutcome()
        self.ended = False
        self.known_prompt: int | None = None  # the prompt tokens the engine said it read, before the final usage
        self._endpoint_id = endpoint_id
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
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            return self.fail("midstream", "the engine sent an invalid event", "bad_gateway")
        if not isinstance(obj, dict):
            return None
        given = obj.get("type")
        kind: str = given if isinstance(given, str) else name or ""
        if kind in ("error", "response.failed"):
            return self._engine_error(obj, data)
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
                return self.fail("overrun", "the engine generated more than the completion tokens requested; "
                                 "the stream was ended there", "max_tokens_exceeded")
        self.observe(kind, obj)
        if self.terminal(kind, obj):
            self.ended = True
            out.ok = out.error_kind is None
        if self._collect:
            return None
        return sse(name or kind, obj)

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
    return capped(Usage(prompt_tokens=prompt, completion_tokens=out.output_chunks), completion_cap)
