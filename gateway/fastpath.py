"""The completion routes as bare ASGI handlers, dispatched before FastAPI's middleware and router.

Measured on this machine (py-spy over 6,000 requests, 16 connections): Starlette's middleware
stack, router and `Request` object took about a sixth of the gateway's CPU per request. The POST
routes with a body (chat, completions, and the other APIs' `api_pipeline`) do not need any of it (the
pipeline parses and validates itself), so `GatewayApp.__call__` hands them to these handlers; every other
route goes through FastAPI.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Protocol

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from fleetgate.core.errors import FleetGateError, PayloadTooLargeError
from fleetgate.gateway.context import GatewayResponse, request_id_from
from fleetgate.gateway.errors import error_body
from fleetgate.gateway.parsing import Kind
from fleetgate.gateway.pipeline import Pipeline
from fleetgate.gateway.responses import ClientWatch, StreamResponse
from fleetgate.gateway.stages import Tenant

Handler = Callable[[Scope, Receive, Send], Awaitable[None]]


class ClientLeft(Exception):
    """The client disconnected while sending its body."""


class BodyTimeoutError(FleetGateError):
    status = 408
    type = "invalid_request_error"
    code = "request_timeout"


async def read_body(
    scope: Scope, receive: Receive, headers: dict[str, str], *, limit: int, timeout_s: float | None = None
) -> bytes:
    """The request body; `PayloadTooLargeError` as soon as Content-Length or the bytes read pass `limit`,
    `BodyTimeoutError` when the whole body has not arrived within `timeout_s` (a slow client must not
    hold a connection and a task indefinitely)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await _read_body(receive, headers, limit=limit)
    except TimeoutError:
        raise BodyTimeoutError(f"the request body did not arrive within {timeout_s:g} s") from None


async def _read_body(receive: Receive, headers: dict[str, str], *, limit: int) -> bytes:
    declared = headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise PayloadTooLargeError(f"request body of {declared} bytes is over the limit of {limit} bytes")
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientLeft
        chunk = message.get("body", b"")
        if chunk:
            size += len(chunk)
            if size > limit:
                raise PayloadTooLargeError(f"request body is over the limit of {limit} bytes")
            parts.append(chunk)
        if not message.get("more_body", False):
            return parts[0] if len(parts) == 1 else b"".join(parts)


UNREAD_BODY_BYTES = 64 * 1024  # a refused request's body up to this size is drained; past it, the connection closes


def _small(headers: dict[str, str]) -> bool:
    declared = headers.get("content-length")
    return declared is not None and declared.isdigit() and int(declared) <= UNREAD_BODY_BYTES


async def send_json(send: Send, result: GatewayResponse) -> None:
    headers = [
        (b"content-type", result.media_type.encode()),
        (b"content-length", str(len(result.body)).encode()),
        *((k.encode("latin-1"), v.encode("latin-1")) for k, v in result.headers.items()),
    ]
    await send({"type": "http.response.start", "status": result.status, "headers": headers})
    await send({"type": "http.response.body", "body": result.body})


class BodyRoute(Protocol):
    """A POST route whose body the pipeline reads: chat and completions here, the other APIs' `ApiPipeline`."""

    def render_error(self, exc: FleetGateError) -> bytes: ...

    async def authenticate(self, *, headers: Mapping[str, str]) -> Tenant: ...

    def refuse(self, *, headers: Mapping[str, str], exc: FleetGateError) -> GatewayResponse: ...

    async def handle(self, *, raw: bytes, headers: Mapping[str, str], tenant: Tenant | None = None,
                     arrived_ns: int = 0) -> GatewayResponse:
        ...


@dataclass(frozen=True, slots=True)
class CompletionRoute:
    kind: Kind
    pipeline: Pipeline

    def render_error(self, exc: FleetGateError) -> bytes:
        return error_body(exc)

    async def authenticate(self, *, headers: Mapping[str, str]) -> Tenant:
        return await self.pipeline.authenticate(headers=headers)

    def refuse(self, *, headers: Mapping[str, str], exc: FleetGateError) -> GatewayResponse:
        return self.pipeline.refuse(headers=headers, exc=exc)

    async def handle(self, *, raw: bytes, headers: Mapping[str, str], tenant: Tenant | None = None,
                     arrived_ns: int = 0) -> GatewayResponse:
        return await self.pipeline.handle(kind=self.kind, raw=raw, headers=headers, tenant=tenant,
                                          arrived_ns=arrived_ns)


def completion_handler(
    kind: Kind, *, pipeline: Pipeline, max_body_bytes: int, body_timeout_s: float | None = None
) -> Handler:
    return body_handler(CompletionRoute(kind, pipeline), max_body_bytes=max_body_bytes, body_timeout_s=body_timeout_s)


def body_handler(route: BodyRoute, *, max_body_bytes: int, body_timeout_s: float | None = None) -> Handler:
    async def handle(scope: Scope, receive: Receive, send: Send) -> None:
        arrived_ns = perf_counter_ns()  # the gateway's own time starts here (`own_time`)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        # The key first, from the header alone: an unauthenticated body is never read into memory or
        # parsed (the server discards its bytes), so it costs no more than a 401.
        try:
            tenant = await route.authenticate(headers=headers)
        except FleetGateError as exc:
            refused = route.refuse(headers=headers, exc=exc)
            if not _small(headers):  # close rather than receive (and discard) megabytes we will never use
                refused.headers["connection"] = "close"
            await send_json(send, refused)
            return
        try:
            raw = await read_body(scope, receive, headers, limit=max_body_bytes, timeout_s=body_timeout_s)
        except (PayloadTooLargeError, BodyTimeoutError) as exc:
            answer = {"x-request-id": request_id_from(headers)}
            if isinstance(exc, BodyTimeoutError):  # a slow sender would keep dribbling: close its connection
                answer["connection"] = "close"
            await send_json(send, GatewayResponse(exc.status, answer, route.render_error(exc)))
            return
        except ClientLeft:
            return
        # A client that leaves cancels the request, and so the engine call: an abandoned generation,
        # streamed or not, must not keep a GPU busy.
        watch = ClientWatch(receive)
        try:
            result = await route.handle(raw=raw, headers=headers, tenant=tenant, arrived_ns=arrived_ns)
            if result.stream is None:
                await send_json(send, result)
            else:
                response = StreamResponse(result.stream, status=result.status, headers=result.headers,
                                          media_type=result.media_type)
                await response.relay(send, watch)
        except asyncio.CancelledError:
            if not watch.absorb():
                raise
        finally:
            watch.stop()

    return handle


class GatewayApp(FastAPI):
    """FastAPI with a dispatch table of bare ASGI handlers for hot `POST` paths."""

    hot_routes: dict[str, Handler]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            handler = self.hot_routes.get(scope["path"])
            if handler is not None:
                await handler(scope, receive, send)
                return
        await super().__call__(scope, receive, send)
