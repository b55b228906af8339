"""`create_app`: one gateway application with its stages, engine client, metrics and routes.

Everything is built here per app (no module-level singletons), so tests and benchmarks can run
several gateways in one process. The lifespan owns the aiohttp session and starts and stops every
stage that has `start()` / `aclose()`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import aiohttp
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from prometheus_client import CollectorRegistry
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from fleetgate.cache.types import ResponseCache
from fleetgate.core.errors import FleetGateError, InvalidRequestError, UpstreamUnavailableError
from fleetgate.core.kvstore import KVStore, make_kvstore
from fleetgate.gateway.api_wiring import api_handlers, api_pipelines, install_api_routes, install_unknown_route
from fleetgate.gateway.context import request_id_from
from fleetgate.gateway.discovery import EndpointSource
from fleetgate.gateway.errors import error_body, internal_error_body
from fleetgate.gateway.fastpath import GatewayApp, completion_handler
from fleetgate.gateway.metrics import GatewayMetrics
from fleetgate.gateway.metrics_listener import MetricsListener
from fleetgate.gateway.parsing import Kind
from fleetgate.gateway.pipeline import Pipeline
from fleetgate.gateway.routes import JSON, install_routes
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.stages import Accountant, Authenticator, Limiter
from fleetgate.gateway.stageset import start_stages, stop_stages
from fleetgate.gateway.upstream import make_session
from fleetgate.gateway.wiring import build_routers, build_stages
from fleetgate.router.tiers.types import TierResolver
from fleetgate.router.types import Scheduler

if TYPE_CHECKING:
    from fastapi import APIRouter

log = logging.getLogger("fleetgate.gateway")


class _Runtime:
    """What the lifespan creates and the pipeline uses."""

    def __init__(self) -> None:
        self.session: aiohttp.ClientSession | None = None
        self.ready = False

    def get_session(self) -> aiohttp.ClientSession:
        if self.session is None:
            raise UpstreamUnavailableError("the gateway is not started (no engine client yet)")
        return self.session


def _error_response(request: Request, exc: FleetGateError) -> Response:
    headers = {"x-request-id": request_id_from(request.headers), **exc.headers}
    return Response(error_body(exc), status_code=exc.status, headers=headers, media_type=JSON)


def _install_error_handlers(app: FastAPI) -> None:
    async def on_fleetgate(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, FleetGateError)
        return _error_response(request, exc)

    async def on_validation(request: Request, exc: Exception) -> Response:
        return _error_response(request, InvalidRequestError(f"invalid request: {exc}"))

    async def on_http(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        error = FleetGateError(str(exc.detail), code=f"http_{exc.status_code}", headers=dict(exc.headers or {}))
        error.status = exc.status_code
        error.type = "invalid_request_error" if exc.status_code < 500 else "server_error"
        return _error_response(request, error)

    async def on_unexpected(request: Request, exc: Exception) -> Response:
        # Starlette's default is a plain-text 500; clients get the OpenAI shape and no traceback.
        rid = request_id_from(request.headers)
        log.error("unexpected error", exc_info=exc, extra={"request_id": rid})
        return Response(internal_error_body(rid), status_code=500, headers={"x-request-id": rid}, media_type=JSON)

    app.add_exception_handler(FleetGateError, on_fleetgate)
    app.add_exception_handler(Exception, on_unexpected)
    app.add_exception_handler(RequestValidationError, on_validation)
    app.add_exception_handler(HTTPException, on_http)


def create_app(
    settings: GatewaySettings,
    *,
    scheduler: Scheduler | None = None,
    cache: ResponseCache | None = None,
    tiers: TierResolver | None = None,
    auth: Authenticator | None = None,
    limiter: Limiter | None = None,
    accountant: Accountant | None = None,
    endpoint_source: EndpointSource | None = None,
    registry: CollectorRegistry | None = None,
    kvstore: KVStore | None = None,
    routers: Sequence[APIRouter] = (),
) -> FastAPI:
    """Build a gateway app; explicit stages replace the configured ones, `routers` are mounted too."""
    registry = registry if registry is not None else CollectorRegistry()
    store = kvstore if kvstore is not None else make_kvstore(settings.redis_url)
    stages = build_stages(
        settings, registry=registry, kvstore=store, scheduler=scheduler, cache=cache, tiers=tiers, auth=auth,
        limiter=limiter, accountant=accountant, endpoint_source=endpoint_source,
    )
    runtime = _Runtime()
    metrics = GatewayMetrics(registry)
    server = settings.server
    listener = None
    if server.metrics_port is not None:
        listener = MetricsListener(registry, host=server.metrics_host or server.host, port=server.metrics_port)
    pipeline = Pipeline(settings=settings, stages=stages, metrics=metrics, session=runtime.get_session)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        runtime.session = make_session(settings.server)
        started: list[Any] = []
        try:
            if listener is not None:
                listener.start()
            await start_stages(stages, started)
            runtime.ready = True
            yield
        finally:
            runtime.ready = False
            await pipeline.shutdown(timeout_s=settings.server.settle_s)
            await stop_stages(started, log=log)
            await runtime.session.close()
            runtime.session = None
            await store.close()
            if listener is not None:
                listener.stop()

    def readiness(*, addresses: bool) -> tuple[bool, dict[str, Any]]:
        # Ready = this replica can answer (started, stages up). Engines are reported, not required: a
        # gateway with no engine answers 503s that say so, and engines scaled to zero must stay reachable.
        source = stages.endpoint_source
        models = source.models()
        endpoints = [e.id for m in models for e in source.endpoints(m)]
        # Ejected endpoints (failing health) are counted for anyone; their addresses (pod IPs under
        # Kubernetes discovery) only with the admin key, and on the metrics port (the ejected gauge).
        health = getattr(getattr(stages.scheduler, "state", None), "health", None)
        ejected = sorted(e for e in endpoints if health is not None and health.is_ejected(e))
        info: dict[str, Any] = {
            "status": "ready" if runtime.ready else "starting",
            "models": len(models),
            "endpoints": len(endpoints),
            "ejected": len(ejected),
            "all_ejected": bool(endpoints) and len(ejected) == len(endpoints),
        }
        if addresses:
            info["ejected_endpoints"] = ejected
        return runtime.ready, info

    app = GatewayApp(title="FleetGate", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    limit, body_s = settings.server.max_body_bytes, settings.server.body_timeout_s
    routes: tuple[tuple[str, Kind], ...] = (("/v1/chat/completions", "chat"), ("/v1/completions", "completions"))
    app.hot_routes = {
        path: completion_handler(kind, pipeline=pipeline, max_body_bytes=limit, body_timeout_s=body_s)
        for path, kind in routes
    }
    apis = api_pipelines(pipeline, settings=settings, kvstore=store)  # responses, messages, embeddings
    app.hot_routes.update(api_handlers(apis, settings=settings))
    _install_error_handlers(app)
    install_routes(app, pipeline=pipeline, readiness=readiness)
    install_api_routes(app, apis=apis, pipeline=pipeline)
    for router in [*build_routers(settings, stages=stages, registry=registry, kvstore=store), *routers]:
        app.include_router(router)
    install_unknown_route(app, hot_paths=set(app.hot_routes))  # last: what no route takes
    app.state.settings = settings
    app.state.stages = stages
    app.state.pipeline = pipeline
    app.state.metrics = metrics
    app.state.registry = registry
    app.state.metrics_listener = listener
    app.state.kvstore = store
    return app
