"""`fleetgate gateway --config FILE`: run the gateway alone; `build_server` for in-process use.

The server is uvicorn with uvloop and httptools (with a header deadline and JSON parser errors:
`protocol`), access log off (the pipeline writes one
structured line per request). `fleetgate up` calls `build_server(...)` and awaits `serve()`
next to its engine management.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import uvicorn

from fleetgate.core.config import load_model
from fleetgate.core.telemetry import configure_logging
from fleetgate.gateway.settings import GatewaySettings


def build_server(
    settings: GatewaySettings, *, host: str | None = None, port: int | None = None, metrics_port: int | None = None,
    **stage_overrides: Any,
) -> uvicorn.Server:
    """A uvicorn server for `create_app(settings, **stage_overrides)`; `host`/`port`/`metrics_port` override
    the settings (the metrics listener's address is `app.state.metrics_listener.url` once started).

    Run it with `await server.serve()` (in a running loop) or `server.run()`; `server.should_exit =
    True` stops it gracefully; `server.started` turns true once it listens.
    """
    from fleetgate.gateway.app import create_app
    from fleetgate.gateway.protocol import guarded_protocol

    if metrics_port is not None:
        settings = settings.model_copy(
            update={"server": settings.server.model_copy(update={"metrics_port": metrics_port})}
        )
    app = create_app(settings, **stage_overrides)
    config = uvicorn.Config(
        app,
        host=host or settings.server.host,
        port=settings.server.port if port is None else port,
        loop="uvloop",
        http=guarded_protocol(header_timeout_s=settings.server.header_timeout_s),
        lifespan="on",
        access_log=False,
        log_config=None,
        server_header=False,
        proxy_headers=False,  # no client addresses are used; saves a middleware per request
        timeout_keep_alive=30,
        backlog=2048,
    )
    return uvicorn.Server(config)


async def start_in_background(server: uvicorn.Server, *, poll_s: float = 0.02) -> asyncio.Task[None]:
    """Start `server.serve()` as a task and return it once the server listens; a server that stops before
    listening (a port taken, a bad setting) raises its error here instead of leaving the caller polling."""

    async def serve() -> None:
        try:
            await server.serve()
        except SystemExit as exc:  # uvicorn exits the process when it cannot bind: make it this task's error
            raise RuntimeError(f"the gateway could not start listening (uvicorn exit {exc.code})") from None

    task = asyncio.create_task(serve())
    while not server.started:
        if task.done():
            task.result()  # its exception, if any
            raise RuntimeError("the gateway stopped before it started listening")
        await asyncio.sleep(poll_s)
    return task


def metrics_url(server: uvicorn.Server) -> str | None:
    """The started server's `/metrics` URL (its own port), or None when the metrics listener is off."""
    from fleetgate.gateway.metrics_listener import MetricsListener

    listener = getattr(getattr(server.config.app, "state", None), "metrics_listener", None)
    return listener.url if isinstance(listener, MetricsListener) else None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="gateway YAML file (default: embedded defaults)")
    parser.add_argument("--host", help="listen address (default: server.host)")
    parser.add_argument("--port", type=int, help="listen port (default: server.port)")
    parser.add_argument("--metrics-port", type=int, help="/metrics listen port (default: server.metrics_port)")


def run(args: argparse.Namespace) -> int:
    settings = load_model(GatewaySettings, args.config)
    configure_logging(level=settings.server.log_level)
    server = build_server(settings, host=args.host, port=args.port, metrics_port=args.metrics_port)
    server.run()
    return 0
