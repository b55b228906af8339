"""`start_in_background`: the in-process gateway start the benchmarks share."""

from __future__ import annotations

import asyncio
import socket

import httpx
import pytest

from fleetgate.core.localredis import free_port
from fleetgate.gateway.serve import build_server, start_in_background
from fleetgate.gateway.settings import GatewaySettings

OPEN = GatewaySettings.model_validate({"server": {"auth": "open"}})


async def test_returns_once_the_gateway_listens_and_stops_cleanly() -> None:
    port = free_port()
    server = build_server(OPEN, host="127.0.0.1", port=port, metrics_port=0)
    task = await start_in_background(server)
    try:
        async with httpx.AsyncClient() as client:
            assert (await client.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


async def test_a_gateway_that_cannot_listen_raises_instead_of_waiting_forever() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = build_server(OPEN, host="127.0.0.1", port=taken.getsockname()[1], metrics_port=0)
        server.config.log_level = "critical"
        with pytest.raises(RuntimeError, match="could not start listening"):  # not uvicorn's SystemExit
            await asyncio.wait_for(start_in_background(server), 10)
