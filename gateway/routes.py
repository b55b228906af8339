"""The HTTP routes other than the completions (those are bare ASGI handlers: `fastpath`).

Plain Starlette routes taking the raw `Request`: models, health, readiness and metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.requests import Request
from starlette.responses import Response

from fleetgate.gateway.pipeline import Pipeline

JSON = "application/json"


def install_routes(
    app: FastAPI,
    *,
    pipeline: Pipeline,
    registry: CollectorRegistry,
    readiness: Callable[[], tuple[bool, dict[str, Any]]],
) -> None:
    async def models(request: Request) -> Response:
        result = await pipeline.list_models(headers=request.headers)
        return Response(result.body, status_code=result.status, headers=result.headers, media_type=result.media_type)

    async def healthz(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type=JSON)

    async def readyz(request: Request) -> Response:
        ready, info = readiness()
        return Response(orjson.dumps(info), status_code=200 if ready else 503, media_type=JSON)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)

    app.router.add_route("/v1/models", models, methods=["GET"])
    app.router.add_route("/healthz", healthz, methods=["GET"])
    app.router.add_route("/readyz", readyz, methods=["GET"])
    app.router.add_route("/metrics", metrics, methods=["GET"])
