"""Fixtures for the gateway component tests: fake engines and a gateway on a real uvicorn server.

`start_gateway(settings, **stages)` runs `build_server` on a free loopback port inside the test's
event loop and returns a `RunningGateway` (base URL, the app, its pipeline); everything started is
stopped at the end of the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from fastapi import FastAPI

from fleetgate.core.localredis import free_port
from fleetgate.gateway.pipeline import Pipeline
from fleetgate.gateway.serve import build_server
from fleetgate.gateway.settings import GatewaySettings, ModelRoute
from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig


@dataclass
class RunningGateway:
    url: str
    app: FastAPI

    @property
    def metrics_url(self) -> str:
        """`/metrics` on the gateway's separate metrics port (never the client port)."""
        url: str = self.app.state.metrics_listener.url
        return url

    @property
    def pipeline(self) -> Pipeline:
        pipeline: Pipeline = self.app.state.pipeline
        return pipeline


def settings_for(models: dict[str, list[str]], **server: Any) -> GatewaySettings:
    return GatewaySettings.model_validate(
        {
            "server": {"auth": "open", **server},
            "models": [ModelRoute(name=n, endpoints=urls).model_dump() for n, urls in models.items()],
        }
    )


async def eventually(predicate: Callable[[], bool], *, timeout_s: float = 20.0) -> bool:
    """Poll `predicate` until it holds or `timeout_s` of wall time passes; returns its last value. The default is
    generous because it bounds only a failure: a background store (the cache's encoder, a Redis write) took over 5 s
    once in a full suite on the loaded 2-core machine. A test asserting that something does NOT happen passes its own
    short `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()


@pytest.fixture
async def start_engine() -> AsyncIterator[Callable[..., Awaitable[FakeEngine]]]:
    engines: list[FakeEngine] = []

    async def start(**config: Any) -> FakeEngine:
        engine = await FakeEngine(FakeEngineConfig(**config)).start()
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        await engine.stop()


@pytest.fixture
async def engine(start_engine: Callable[..., Awaitable[FakeEngine]]) -> FakeEngine:
    return await start_engine(model="m1")


@pytest.fixture
async def start_gateway() -> AsyncIterator[Callable[..., Awaitable[RunningGateway]]]:
    servers: list[tuple[Any, asyncio.Task[None]]] = []

    async def start(settings: GatewaySettings, **stages: Any) -> RunningGateway:
        port = free_port()
        server = build_server(settings, port=port, metrics_port=0, **stages)  # 0: no clash between runs
        task = asyncio.ensure_future(server.serve())
        for _ in range(500):
            if server.started or task.done():
                break
            await asyncio.sleep(0.01)
        if not server.started:
            raise RuntimeError("gateway did not start")
        servers.append((server, task))
        return RunningGateway(url=f"http://127.0.0.1:{port}", app=server.config.app)

    yield start
    for server, task in servers:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


@pytest.fixture
async def gateway(engine: FakeEngine, start_gateway: Callable[..., Awaitable[RunningGateway]]) -> RunningGateway:
    return await start_gateway(settings_for({"m1": [engine.url]}))
