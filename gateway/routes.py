"""The HTTP routes other than the completions (those are bare ASGI handlers: `fastpath`).

Plain Starlette routes taking the raw `Request`: models, health and readiness (`/readyz` counts engines for
anyone and names ejected ones only to the admin key: their addresses are pod IPs). `/metrics` is not here:
it is served on its own port (`metrics_listener`), so tenants cannot read each other's spend.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response

from fleetgate.gateway.pipeline import Pipeline

JSON = "application/json"


def install_routes(
    app: FastAPI,
    *,
    pipeline: Pipeline,
    readiness: Callable[..., tuple[bool, dict[str, Any]]],
) -> None:
    """`readiness(addresses=...)`: (ready, body); engine addresses only when `addresses` (the admin key)."""

    async def models(request: Request) -> Response:
        result = await pipeline.list_models(headers=request.headers)
        return Response(result.body, status_code=result.status, headers=result.headers, media_type=result.media_type)

    async def healthz(request: Request) -> Response:
        return Response(b'{"status":"ok"}', media_type=JSON)

    async def readyz(request: Request) -> Response:
        ready, info = readiness(addresses=await pipeline.is_admin(headers=request.headers))
        return Response(orjson.dumps(info), status_code=200 if ready else 503, media_type=JSON)

    app.router.add_route("/v1/models", models, methods=["GET"])
    app.router.add_route("/healthz", healthz, methods=["GET"])
    app.router.add_route("/readyz", readyz, methods=["GET"])
