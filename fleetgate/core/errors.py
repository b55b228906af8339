"""One error tree for FleetGate, rendered as OpenAI-shaped JSON by the gateway.

Every error carries its HTTP status and the OpenAI `type`/`code` so that the web layer needs a
single handler: `{"error": {"message", "type", "param", "code"}}`.
"""

from __future__ import annotations

from typing import Any


class FleetGateError(Exception):
    """Base of every error that should reach a client as a structured response."""

    status: int = 500
    type: str = "server_error"
    code: str | None = None

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        if code is not None:
            self.code = code
        self.headers: dict[str, str] = dict(headers or {})

    def to_openai(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class InvalidRequestError(FleetGateError):
    status = 400
    type = "invalid_request_error"
    code = "invalid_request"


class AuthenticationError(FleetGateError):
    status = 401
    type = "authentication_error"
    code = "invalid_api_key"


class PermissionDeniedError(FleetGateError):
    status = 403
    type = "permission_error"
    code = "model_not_allowed"


class NotFoundError(FleetGateError):
    status = 404
    type = "invalid_request_error"
    code = "model_not_found"


class PayloadTooLargeError(FleetGateError):
    status = 413
    type = "invalid_request_error"
    code = "request_too_large"


class RateLimitError(FleetGateError):
    """Over a rate limit or budget; `retry_after_s` becomes the `Retry-After` header."""

    status = 429
    type = "rate_limit_error"
    code = "rate_limit_exceeded"

    def __init__(self, message: str, *, retry_after_s: float, code: str | None = None,
                 limit: str | None = None) -> None:
        seconds = max(1, int(retry_after_s + 0.999))
        super().__init__(message, code=code, headers={"Retry-After": str(seconds)})
        self.retry_after_s = retry_after_s
        self.limit = limit  # which limit refused (rpm, tpm, daily_budget, ...), when a limiter says


class FleetSaturatedError(RateLimitError):
    """Every endpoint that could serve the request is saturated: the request is shed rather than queued
    (the Gateway API Inference Extension's 429 for dropped requests)."""

    code = "fleet_saturated"


class UpstreamUnavailableError(FleetGateError):
    """No engine could be reached (connect refused, no healthy endpoint)."""

    status = 503
    type = "server_error"
    code = "upstream_unavailable"


class UpstreamBadResponseError(FleetGateError):
    """The engine answered with something that is not a valid response."""

    status = 502
    type = "server_error"
    code = "bad_gateway"


class UpstreamTimeoutError(FleetGateError):
    status = 504
    type = "server_error"
    code = "upstream_timeout"


class ConfigError(Exception):
    """Invalid configuration: raised at start-up with a message that names the file and field."""
