"""OpenAI-shaped error bodies, and the error that relays an engine's own 4xx/5xx to the client."""

from __future__ import annotations

from typing import Any

import orjson

from fleetgate.core.errors import FleetGateError


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


def internal_error_body(request_id: str) -> bytes:
    return orjson.dumps(
        {
            "error": {
                "message": f"internal gateway error (request id {request_id}); see the gateway log",
                "type": "server_error",
                "param": None,
                "code": "internal_error",
            }
        }
    )


def from_engine(status: int, raw: bytes, *, endpoint: str) -> EngineStatusError:
    """Build the relayed error from an engine's error body: OpenAI's `{"error": {...}}`, vLLM's older
    flat `{"object": "error", "message": ...}`, or anything else (kept as text)."""
    info: dict[str, Any] = {}
    try:
        data = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        data = None
    if isinstance(data, dict):
        inner = data.get("error")
        info = inner if isinstance(inner, dict) else data
    message = info.get("message")
    if not isinstance(message, str) or not message:
        text = raw[:500].decode("utf-8", "replace").strip()
        message = f"engine {endpoint} answered HTTP {status}" + (f": {text}" if text else "")
    code = info.get("code")
    param = info.get("param")
    type_ = info.get("type")
    return EngineStatusError(
        status=status,
        message=message,
        type_=type_ if isinstance(type_, str) else None,
        code=str(code) if code is not None else None,
        param=param if isinstance(param, str) else None,
    )
