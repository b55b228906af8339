"""A gateway on a uvicorn server in a thread, for the end-to-end tests' synchronous fixtures."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fleetgate.gateway.serve import build_server
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.local.engines import free_port


@contextmanager
def serving(settings: GatewaySettings) -> Iterator[tuple[str, Any]]:
    """An in-process gateway on a free loopback port, in its own thread: (base URL, its uvicorn server)."""
    port = free_port()
    server = build_server(settings.model_copy(update={"server": settings.server.model_copy(update={"port": port})}),
                          metrics_port=0)
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}", server
    finally:
        server.should_exit = True
        thread.join(timeout=30)


@contextmanager
def gateway_in_thread(settings: GatewaySettings) -> Iterator[str]:
    """`serving`, yielding the base URL alone."""
    with serving(settings) as (url, _server):
        yield url
