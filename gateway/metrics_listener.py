"""The `/metrics` listener: Prometheus text on its own port, never on the client port.

The gateway's metrics show every tenant's spend, budgets and model mix, so they are not served where
tenants connect. They are served by prometheus_client's own WSGI server (`start_http_server`, a
well-kept implementation of the exposition format) in a daemon thread: rendering a large registry then
never blocks the event loop that serves completions. Bind it to a pod-internal address and let
Prometheus (the chart's ServiceMonitor) scrape that port; the client Service does not expose it.
"""

from __future__ import annotations

import threading
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server


class MetricsListener:
    def __init__(self, registry: CollectorRegistry, *, host: str, port: int) -> None:
        self._registry = registry
        self._host = host
        self._port = port
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve (port 0: any free port; `port` then tells which)."""
        self._server, self._thread = start_http_server(self._port, addr=self._host, registry=self._registry)

    @property
    def port(self) -> int:
        return self._server.server_port if self._server is not None else self._port

    @property
    def url(self) -> str:
        host = f"[{self._host}]" if ":" in self._host else self._host
        return f"http://{host}:{self.port}/metrics"

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None
