"""A gateway on a uvicorn server in a thread, for the end-to-end tests' synchronous fixtures."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from fleetgate.gateway.serve import build_server
from fleetgate.gateway.settings import GatewaySettings


@contextmanager
def gateway_in_thread(settings: GatewaySettings) -> Iterator[str]:
    """Serve `settings` (its `server.port`, any free metrics port) until the block ends; yields the base URL."""
    server = build_server(settings, metrics_port=0)
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the gateway did not start"
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{settings.server.port}"
    finally:
        server.should_exit = True
        thread.join(timeout=30)
