"""The HTTP routes: thin adapters between Starlette requests and the pipeline.

The hot routes are plain Starlette routes taking the raw `Request` (no pydantic body model, no
dependency injection): the pipeline validates what it needs, and this measured faster.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import Response

from fleetgate.core.errors import FleetGateError, PayloadTooLargeError
from fleetgate.gateway.context import GatewayResponse, request_id_from
from fleetgate.gateway.errors import error_body
from fleetgate.gateway.parsing import Kind
from fleetgate.gateway.pipeline import Pipeline
from fleetgate.gateway.responses import StreamResponse

JSON = "application/json"


async def read_limited(request: Request, *, limit: int) -> bytes:
    """The body, or `PayloadTooLargeError` as soon as Content-Length or the bytes read pass `limit`."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"request body of {declared} bytes is over the limit of {limit} bytes")
    parts: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise PayloadTooLargeError(f"request body is over the limit of {limit} bytes")
        parts.append(chunk)
    return b"".join(parts)


def to_response(result: GatewayResponse) -> Any:
    if result.stream is not None:
        return StreamResponse(result.stream, status=result.status, headers=result.headers, media_type=result.media_type)
    return Response(result.body, status_code=result.status, headers=result.headers, media_type=result.media_type)


def install_routes(
    app: FastAPI,
    *,
    pipeline: Pipeline,
    registry: CollectorRegistry,
    max_body_bytes: int,
    readiness: Callable[[], str | None],
) -> None:
    def completion_route(kind: Kind) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Any:
            try:
                raw = await read_limited(request, limit=max_body_bytes)
            except FleetGateError as exc:
                headers = {"x-request-id": request_id_from(request.headers)}
                return Response(error_body(exc), status_code=exc.status, headers=headers, media_type=JSON)
            return to_response(await pipeline.handle(kind=kind, raw=raw, headers=request.headers))

        return endpoint

    async def models(request: Request) -> Any:
        return to_response(await pipeline.list_models(headers=request.headers))

    async def healthz(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type=JSON)

    async def readyz(request: Request) -> Response:
        problem = readiness()
        if problem is None:
            return Response(b'{"status":"ready"}', media_type=JSON)
        return Response(orjson.dumps({"status": "not ready", "reason": problem}), status_code=503, media_type=JSON)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.router.add_route("/v1/chat/completions", completion_route("chat"), methods=["POST"])
    app.router.add_route("/v1/completions", completion_route("completions"), methods=["POST"])
    app.router.add_route("/v1/models", models, methods=["GET"])
    app.router.add_route("/healthz", healthz, methods=["GET"])
    app.router.add_route("/readyz", readyz, methods=["GET"])
    app.router.add_route("/metrics", metrics, methods=["GET"])
