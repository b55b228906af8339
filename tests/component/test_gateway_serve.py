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


@pytest.mark.parametrize("freeze", [False, True])
async def test_a_process_owning_gateway_freezes_its_start_up_heap_once_it_listens(
    monkeypatch: pytest.MonkeyPatch, freeze: bool
) -> None:
    import fleetgate.gateway.serve as serve

    calls: list[bool] = []
    # Not gc.freeze itself here: in the test process it would keep every object alive now from ever being
    # collected as cyclic garbage. That the real function freezes is checked in a child process below.
    monkeypatch.setattr(serve, "freeze_startup_heap", lambda: calls.append(True))
    port = free_port()
    server = build_server(OPEN, host="127.0.0.1", port=port, metrics_port=0, freeze_heap=freeze)
    task = await start_in_background(server)
    try:
        assert calls == ([True] if freeze else [])
    finally:
        server.should_exit = True
        await asyncio.wait_for(task, 10)


def test_freezing_the_start_up_heap_takes_it_out_of_full_collections() -> None:
    import subprocess
    import sys

    import fleetgate.gateway.serve as serve

    code = ("import gc; from fleetgate.gateway.serve import freeze_startup_heap; "
            "before = gc.get_freeze_count(); freeze_startup_heap(); "
            "print(before, gc.get_freeze_count(), *gc.get_threshold())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    before, after, young, *older = map(int, out.stdout.split())
    assert before == 0 and after > 10_000  # the gateway's imports alone are tens of thousands of objects
    # and the young generation is collected less often (its objects are live streams, not garbage); the older
    # generations keep CPython's thresholds
    assert young == serve.YOUNG_GC_THRESHOLD > 700 and older == [10, 10]
