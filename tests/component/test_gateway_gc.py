"""A finished request leaves no reference cycle: its state is freed by reference counting as it ends, never left
for the cyclic garbage collector. Why it matters: under streaming load (100 streams, 4,000 tokens/s,
`scripts/bench_stream_cpu.py --step-sync --loop-probe`) each request's ~75 objects in a cycle made the gateway's
full collections walk and free hundreds of dead requests at once, stopping its event loop ~120 ms five times in
25 s; every stream stalled and every request arriving then waited.

Each case runs requests with the collector off and `DEBUG_SAVEALL`, then collects: what the collector finds is
garbage only it could free; none of it may be the gateway's per-request objects."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from fleetgate.sim.fake_engine import FakeEngine

from .conftest import RunningGateway, settings_for

# the objects one request owns, from its context to its relay: none may end in a cycle
PER_REQUEST = {"RequestContext", "RelayStream", "EventRelay", "ClientWatch", "SseRewriter", "StreamReads",
               "ClientResponse", "Attempt", "TimedResponse", "TimedRequest"}  # the gateway's session's own classes


@contextmanager
def cyclic_garbage() -> Iterator[list[str]]:
    """The type names of the per-request objects that only the cyclic GC would have freed, filled on exit."""
    found: list[str] = []
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        yield found
        gc.collect()
        found.extend(sorted(type(o).__qualname__ for o in gc.garbage if type(o).__qualname__ in PER_REQUEST))
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()


async def stream(client: httpx.AsyncClient, path: str, body: dict[str, Any], *, leave_after: int | None = None
                 ) -> int:
    """Stream `body` to `path`; with `leave_after`, hang up after that many lines. Returns the lines read."""
    lines = 0
    async with client.stream("POST", path, json=body) as r:
        assert r.status_code == 200, await r.aread()
        async for _ in r.aiter_lines():
            lines += 1
            if leave_after is not None and lines >= leave_after:
                break
    return lines


def chat(*, stream: bool = True, max_tokens: int = 8) -> dict[str, Any]:
    return {"model": "m1", "messages": [{"role": "user", "content": "a b c"}], "max_tokens": max_tokens,
            "stream": stream}


async def run_requests(gw: RunningGateway, send: Callable[[httpx.AsyncClient], Awaitable[Any]], n: int = 6) -> None:
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as client:
        await send(client)  # warm: lazily built state is not per request
        with cyclic_garbage() as found:
            for _ in range(n):
                await send(client)
            await asyncio.sleep(0.3)  # the settle/record tasks and drains of the last requests end
        assert found == [], f"per-request objects left in reference cycles: {found}"


async def test_streamed_chat_leaves_no_cycle(gateway: RunningGateway) -> None:
    await run_requests(gateway, lambda c: stream(c, "/v1/chat/completions", chat()))


async def test_unstreamed_chat_leaves_no_cycle(gateway: RunningGateway) -> None:
    async def send(client: httpx.AsyncClient) -> None:
        r = await client.post("/v1/chat/completions", json=chat(stream=False))
        assert r.status_code == 200

    await run_requests(gateway, send)


async def test_client_leaving_mid_stream_leaves_no_cycle(start_engine: Callable[..., Awaitable[FakeEngine]],
                                                         start_gateway: Callable[..., Awaitable[RunningGateway]]
                                                         ) -> None:
    engine = await start_engine(model="m1", inter_token_delay_s=0.01)
    gw = await start_gateway(settings_for({"m1": [engine.url]}, cancel_drain_s=0.2))
    await run_requests(gw, lambda c: stream(c, "/v1/chat/completions", chat(max_tokens=40), leave_after=6))


RESPONSES = {"model": "m1", "input": "a b c", "max_output_tokens": 8, "stream": True}


@pytest.mark.parametrize(("path", "body"), [("/v1/chat/completions", chat()), ("/v1/responses", RESPONSES)])
async def test_engine_breaking_off_leaves_no_cycle(start_engine: Callable[..., Awaitable[FakeEngine]],
                                                   start_gateway: Callable[..., Awaitable[RunningGateway]],
                                                   path: str, body: dict[str, Any]) -> None:
    engine = await start_engine(model="m1", drop_after_chunks=3)
    gw = await start_gateway(settings_for({"m1": [engine.url]}))
    await run_requests(gw, lambda c: stream(c, path, body))


@pytest.mark.parametrize(("path", "body"), [
    ("/v1/responses", RESPONSES),
    ("/v1/messages", {"model": "m1", "messages": [{"role": "user", "content": "a b c"}], "max_tokens": 8,
                      "stream": True}),
])
async def test_event_apis_leave_no_cycle(gateway: RunningGateway, path: str, body: dict[str, Any]) -> None:
    await run_requests(gateway, lambda c: stream(c, path, body))
