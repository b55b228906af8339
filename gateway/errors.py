"""OpenAI-shaped error bodies, and the error that relays an engine's own 4xx/5xx to the client (sanitized)."""

from __future__ import annotations

import logging
import re
from typing import Any

import orjson

from fleetgate.core.errors import FleetGateError

log = logging.getLogger("fleetgate.gateway.engine_errors")

MAX_MESSAGE_CHARS = 300
TRACEBACK_MARKERS = ("Traceback (most recent call last)", 'File "', "\n  at ", "Exception:")
_URL = re.compile(r"[a-zA-Z][a-zA-Z0-9+.-]*://\S+")
_ADDRESS = re.compile(r"\b(?:\d{1,3}\.){3}\d{1,3}(?::\d+)?\b|\[[0-9a-fA-F:]+\](?::\d+)?")


class EngineStatusError(FleetGateError):
    """The engine answered with an error status: relayed with that status and the engine's message."""

    def __init__(
        self, *, status: int, message: str, type_: str | None = None, code: str | None = None, param: str | None = None
    ) -> None:
        super().__init__(message, param=param, code=code)
        self.status = status
        self.type = type_ or ("invalid_request_error" if status < 500 else "server_error")


def error_body(exc: FleetGateError) -> bytes:
    return orjson.dumps(exc.to_openai())


class InternalGatewayError(FleetGateError):
    """An unexpected failure inside the gateway: the client learns its request id, never the traceback."""

    code = "internal_error"

    def __init__(self, request_id: str) -> None:
        super().__init__(f"internal gateway error (request id {request_id}); see the gateway log")


def internal_error_body(request_id: str) -> bytes:
    return error_body(InternalGatewayError(request_id))


def safe_message(message: str) -> str | None:
    """An engine's message fit for a client: first line, addresses redacted, bounded; None if it holds
    a traceback (nothing of it is safe to show)."""
    if any(marker in message for marker in TRACEBACK_MARKERS):
        return None
    line = message.strip().splitlines()[0] if message.strip() else ""
    line = _ADDRESS.sub("<address>", _URL.sub("<url>", line))
    return line[:MAX_MESSAGE_CHARS] or None


def _retry_after(value: str | None) -> dict[str, str]:
    """The engine's `Retry-After` when it is sane (delta seconds or an HTTP date, short printable ASCII)."""
    if value and len(value) <= 64 and value.isascii() and value.isprintable():
        return {"Retry-After": value.strip()}
    return {}


def from_engine(status: int, raw: bytes, *, endpoint: str, retry_after: str | None = None) -> EngineStatusError:
    """The client's view of an engine's error answer. OpenAI's `{"error": {...}}` and vLLM's older flat
    `{"object": "error", "message": ...}` keep their message, type, code and param when those are safe
    (`safe_message`: no tracebacks, internal URLs or addresses); a 5xx or an unreadable body gets a
    generic message. The original body is logged, never relayed. A 429 or 503 keeps its `Retry-After`."""
    log.warning("engine error answer", extra={"endpoint": endpoint, "status": status,
                                              "body": raw[:2000].decode("utf-8", "replace")})
    info: dict[str, Any] = {}
    try:
        data = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        inner = data.get("error")
        info = inner if isinstance(inner, dict) else data
    message = info.get("message")
    safe = safe_message(message) if isinstance(message, str) and status < 500 else None
    if safe is None:
        kind = "refused the request" if status < 500 else "failed"
        safe = f"the engine {kind} (HTTP {status}); details are in the gateway log under this request id"
    code = info.get("code")
    param = info.get("param")
    type_ = info.get("type")
    error = EngineStatusError(
        status=status,
        message=safe,
        type_=type_ if isinstance(type_, str) and len(type_) <= 64 else None,
        code=str(code)[:64] if code is not None else None,
        param=param[:200] if isinstance(param, str) else None,
    )
    if status in (429, 503):
        error.headers.update(_retry_after(retry_after))
    return error
