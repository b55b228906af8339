"""The engine client: one pooled aiohttp session per app, sending OpenAI requests to an endpoint.

aiohttp was chosen by measurement (BENCHMARKS.md §1: ~6x the requests per second of httpx behind
the same server on this hardware). Failures are classified here so the pipeline can decide:
`ConnectFailed` (nothing reached the engine, safe to retry elsewhere), `UpstreamTimeoutError` (504),
`UpstreamBadResponseError` (502).
"""

from __future__ import annotations

import asyncio
import logging
from time import perf_counter_ns
from typing import Any

import aiohttp
from aiohttp.connector import Connection

from fleetgate.core.errors import UpstreamBadResponseError, UpstreamTimeoutError
from fleetgate.core.types import Endpoint
from fleetgate.gateway.settings import ServerSettings

log = logging.getLogger("fleetgate.gateway.upstream")


class ConnectFailed(Exception):
    """The request never reached the engine (refused, connect timeout, stale pooled connection)."""

    def __init__(self, endpoint: Endpoint, cause: BaseException) -> None:
        super().__init__(f"cannot connect to engine {endpoint.id} ({endpoint.url}): {cause or type(cause).__name__}")
        self.endpoint = endpoint
        self.timeout = isinstance(cause, asyncio.TimeoutError)


class TimedResponse(aiohttp.ClientResponse):
    """A response that knows when its request's bytes were written (`TimedRequest`)."""

    sent_ns = 0  # perf_counter_ns; 0 until the request's body was written


class TimedRequest(aiohttp.ClientRequest):
    """Notes the moment aiohttp's body writer has handed the request's bytes (headers coalesced with the body) to
    the connection's transport, on the response (`own_time`: the end of the gateway's `before_upstream`). aiohttp
    writes the body in `write_bytes`, a task of its own on Python < 3.12 (run at once, within `send`, on later
    ones: then the response does not exist yet and `send` copies the time over)."""

    _sent_ns = 0

    async def write_bytes(self, *args: Any, **kwargs: Any) -> None:
        await super().write_bytes(*args, **kwargs)
        now = perf_counter_ns()
        response = self.response
        if isinstance(response, TimedResponse):
            response.sent_ns = now
        else:
            self._sent_ns = now

    async def send(self, conn: Connection) -> aiohttp.ClientResponse:
        response = await super().send(conn)
        if self._sent_ns and isinstance(response, TimedResponse):
            response.sent_ns = self._sent_ns
        return response


def sent_ns(response: aiohttp.ClientResponse) -> int:
    """When the request of `response` was written (perf_counter_ns), 0 when unknown (a session without
    `TimedRequest`)."""
    return response.sent_ns if isinstance(response, TimedResponse) else 0


def make_session(server: ServerSettings) -> aiohttp.ClientSession:
    """Keep-alive pool over every engine; only the connect timeout is set here, read timeouts per call."""
    connector = aiohttp.TCPConnector(
        limit=server.max_upstream_connections,
        limit_per_host=0,
        keepalive_timeout=server.keepalive_timeout_s,
        ttl_dns_cache=60,
    )
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, sock_connect=server.connect_timeout_s),
        auto_decompress=False,  # we ask for identity encoding and relay bytes as they come
        request_class=TimedRequest,
        response_class=TimedResponse,
    )


async def send(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    path: str,
    body: bytes,
    *,
    request_id: str,
    headers_timeout_s: float,
) -> aiohttp.ClientResponse:
    """POST `body` to `endpoint` + `path` and return once the response headers arrived."""
    # Explicit User-Agent and Accept-Encoding: aiohttp then skips its default headers without the slow
    # `skip_auto_headers` path (measured: ~5% of the gateway's CPU per request).
    headers = {"Content-Type": "application/json", "X-Request-Id": request_id, "User-Agent": "fleetgate",
               "Accept-Encoding": "identity"}
    try:
        async with asyncio.timeout(headers_timeout_s):
            return await session.post(endpoint.url + path, data=body, headers=headers)
    except aiohttp.ClientConnectorError as exc:
        raise ConnectFailed(endpoint, exc) from exc
    except aiohttp.ConnectionTimeoutError as exc:
        raise ConnectFailed(endpoint, exc) from exc
    except aiohttp.ServerDisconnectedError as exc:
        # A pooled keep-alive connection the engine had closed, or an engine that died on accept:
        # no response byte came back, so another endpoint may try.
        raise ConnectFailed(endpoint, exc) from exc
    except TimeoutError as exc:
        raise UpstreamTimeoutError(
            f"the engine sent no response within {headers_timeout_s:g}s"
        ) from exc
    except aiohttp.ClientError as exc:
        log.warning("engine request failed", extra={"endpoint": endpoint.id, "error": repr(exc)})
        raise UpstreamBadResponseError("the engine failed to answer") from exc


async def read_body(response: aiohttp.ClientResponse, *, endpoint: Endpoint, timeout_s: float) -> bytes:
    try:
        async with asyncio.timeout(timeout_s):
            return await response.read()
    except TimeoutError as exc:
        response.close()
        raise UpstreamTimeoutError(f"the engine did not finish its response within {timeout_s:g}s") from exc
    except aiohttp.ClientError as exc:
        response.close()
        log.warning("engine response broke off", extra={"endpoint": endpoint.id, "error": repr(exc)})
        raise UpstreamBadResponseError("the engine broke off its response") from exc
    except asyncio.CancelledError:
        response.close()  # drop the connection: the engine aborts the request
        raise
    finally:
        response.release()
