"""Mounting the API routes beyond chat and completions, the stored-response routes, and the answer to any other.

- `POST /v1/responses`, `/v1/messages`, `/v1/embeddings`: bare ASGI handlers (`fastpath.body_handler`) around
  each route's `ApiPipeline`, as chat's.
- `GET` and `DELETE /v1/responses/{id}`: a stored response of the caller's tenant (`conversations`); another
  tenant's, an expired or an unknown one is the same 404.
- Anything else is answered by the gateway, never proxied: 405 (with `Allow`) for a known path and another
  method, else a 404 naming the path and the routes the gateway serves, in Anthropic's shape under
  `/v1/messages` and OpenAI's elsewhere.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import FastAPI
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Match

from fleetgate.core.errors import FleetGateError, NotFoundError
from fleetgate.core.kvstore import KVStore
from fleetgate.gateway.api_embeddings import EmbeddingsRoute
from fleetgate.gateway.api_messages import MessagesRoute, anthropic_error
from fleetgate.gateway.api_pipeline import ApiPipeline
from fleetgate.gateway.api_responses import ResponsesRoute
from fleetgate.gateway.context import request_id_from
from fleetgate.gateway.conversations import ConversationStore, checked_id
from fleetgate.gateway.errors import error_body
from fleetgate.gateway.fastpath import Handler, body_handler
from fleetgate.gateway.pipeline import Pipeline
from fleetgate.gateway.settings import GatewaySettings

JSON = "application/json"
SERVED = ("POST /v1/chat/completions, POST /v1/completions, POST /v1/responses, GET|DELETE /v1/responses/{id}, "
          "POST /v1/messages, POST /v1/embeddings, GET /v1/models")


class MethodNotAllowedError(FleetGateError):
    status = 405
    type = "invalid_request_error"
    code = "method_not_allowed"


def api_pipelines(pipeline: Pipeline, *, settings: GatewaySettings, kvstore: KVStore) -> list[ApiPipeline]:
    responses = settings.responses
    store = ConversationStore(kvstore, ttl_s=responses.store_ttl_s, max_bytes=responses.max_stored_bytes)
    return [ApiPipeline(pipeline=pipeline, route=route)
            for route in (ResponsesRoute(store=store), MessagesRoute(), EmbeddingsRoute())]


def api_handlers(apis: list[ApiPipeline], *, settings: GatewaySettings) -> dict[str, Handler]:
    limit, body_s = settings.server.max_body_bytes, settings.server.body_timeout_s
    return {api.route.path: body_handler(api, max_body_bytes=limit, body_timeout_s=body_s) for api in apis}


def _answer(request: Request, exc: FleetGateError) -> Response:
    render = anthropic_error if request.url.path.startswith("/v1/messages") else error_body
    headers = {"x-request-id": request_id_from(request.headers), **exc.headers}
    return Response(render(exc), status_code=exc.status, headers=headers, media_type=JSON)


def install_api_routes(app: FastAPI, *, apis: list[ApiPipeline], pipeline: Pipeline) -> None:
    """The stored-response routes; call `install_unknown_route` after every other route is mounted."""
    [responses] = [a for a in apis if isinstance(a.route, ResponsesRoute)]
    route = responses.route
    assert isinstance(route, ResponsesRoute)

    async def stored(request: Request) -> Response:
        try:
            tenant = await responses.authenticate(headers=request.headers)
            response_id = checked_id(request.path_params["response_id"], param="response_id")
            if request.method == "DELETE":
                found = await route.store.delete(tenant=tenant.id, response_id=response_id)
                body: Any = {"id": response_id, "object": "response", "deleted": True}
            else:
                record = await route.store.load(tenant=tenant.id, response_id=response_id)
                found, body = record is not None, record.response if record is not None else None
            if not found:
                raise NotFoundError(f"No response found with id {response_id!r}.", param="response_id",
                                    code="response_not_found")
        except FleetGateError as exc:
            return _answer(request, exc)
        return Response(orjson.dumps(body), headers={"x-request-id": request_id_from(request.headers)},
                        media_type=JSON)

    app.router.add_route("/v1/responses/{response_id}", stored, methods=["GET", "DELETE"])


def install_unknown_route(app: FastAPI, *, hot_paths: set[str]) -> None:
    """The answer to any request no route takes: 405 for a known path, else a 404; never a proxy."""

    async def unknown(request: Request) -> Response:
        path = request.url.path
        allowed = {"POST"} if path in hot_paths else set()
        for other in app.router.routes:
            if other is not catch_all and other.matches(request.scope)[0] == Match.PARTIAL:
                allowed |= set(getattr(other, "methods", None) or ())
        allowed.discard("HEAD")
        if allowed:
            methods = ", ".join(sorted(allowed))
            return _answer(request, MethodNotAllowedError(f"{request.method} is not allowed on {path}; use {methods}",
                                                          headers={"Allow": methods}))
        shown = path if len(path) <= 100 else path[:100] + "..."
        return _answer(request, NotFoundError(f"no route {request.method} {shown} on this gateway; it serves {SERVED}",
                                              code="unknown_route"))

    app.router.add_route("/{path:path}", unknown, methods=["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"])
    catch_all = app.router.routes[-1]
