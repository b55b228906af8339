"""`fleetgate gateway --config FILE`: run the gateway alone; `build_server` for in-process use.

The server is uvicorn with uvloop and httptools (with a header deadline and JSON parser errors:
`protocol`), access log off (the pipeline writes one structured line per request), and a bounded drain
on SIGTERM (`GatewayServer`). `fleetgate up` calls `build_server(...)` and awaits `serve()` next to its
engine management.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import socket
from typing import Any

import uvicorn

from fleetgate.core.config import load_model
from fleetgate.core.telemetry import configure_logging
from fleetgate.gateway.settings import GatewaySettings

log = logging.getLogger("fleetgate.gateway")
YOUNG_GC_THRESHOLD = 10_000  # net new container objects between young collections (CPython's default: 700)


class GatewayServer(uvicorn.Server):
    """uvicorn with a bounded drain on shutdown (SIGTERM, SIGINT or `should_exit`):

    1. stop accepting: the listening sockets close, idle keep-alive connections close, busy ones close
       after their response;
    2. wait up to `server.drain_s` for the requests in flight to finish by themselves;
    3. end the engine streams still open (`Pipeline.activity.interrupt`): each client gets an error event
       and `[DONE]`, a non-streaming answer still being collected a 503; each is settled and recorded with
       the engine's usage so far;
    4. uvicorn's own shutdown with `server.drain_close_s` as its grace: what has not ended by then (a client
       too slow to read its last bytes, a non-streaming call without a stream to end) is cancelled, which
       records it as a client that left; then the app's lifespan writes every pending settle and record, all at
       once, within `server.settle_s` (`Pipeline.shutdown`: what the store has not confirmed by then is logged
       and counted as unwritten, not waited for).
    So the process ends within about drain_s + drain_close_s + settle_s, under the pod's grace period
    (`charts/fleetgate`: terminationGracePeriodSeconds, checked against gateway.drainSeconds).
    """

    def __init__(
        self, config: uvicorn.Config, *, drain_s: float, drain_close_s: float, freeze_heap: bool = False
    ) -> None:
        config.timeout_graceful_shutdown = max(1, int(drain_close_s + 0.999))
        super().__init__(config)
        self.drain_s = drain_s
        self.freeze_heap = freeze_heap

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets=sockets)
        if self.freeze_heap and not self.should_exit:
            freeze_startup_heap()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        pipeline = getattr(getattr(self.config.app, "state", None), "pipeline", None)
        if pipeline is not None and not self.force_exit:
            for server in self.servers:
                server.close()
            for sock in sockets or []:
                sock.close()
            for connection in list(self.server_state.connections):
                connection.shutdown()
            activity = pipeline.activity
            log.info("draining", extra={"in_flight": activity.active, "drain_s": self.drain_s})
            if not await activity.wait_idle(timeout_s=self.drain_s):
                ended = activity.interrupt()
                log.warning("drain time over: open streams ended", extra={"streams": ended,
                                                                          "in_flight": activity.active})
            sockets = None
        await super().shutdown(sockets=sockets)


def freeze_startup_heap() -> None:
    """Move every object alive now (the imported modules, settings, stages: ~85,000 objects) out of the
    cyclic garbage collector's reach. Why: a full (generation-2) collection walks every tracked object and
    stops the event loop while it does, so every stream in flight stalls; measured in the gateway under
    streaming load (2,700-word prompts, 32 streams, `scripts/bench_stream_cpu.py` with gc callbacks), each
    full collection took 60-79 ms of CPU before and 15 ms after. What is frozen is never collected as cyclic
    garbage, so only a process that owns its heap for its whole life (`fleetgate gateway`, `fleetgate epp`,
    `fleetgate up`, the benchmark's gateway processes) calls this, once it serves; in-process servers (tests,
    embedded use) do not.

    It also raises the youngest generation's threshold to `YOUNG_GC_THRESHOLD`: a request leaves no reference
    cycle (`tests/component/test_gateway_gc.py`), so what the frequent young collections walk is the live state of
    the streams in flight, again and again, promoting it to older generations to be walked there too. Measured
    under streaming load (100 streams, 4,000 tokens/s, `bench_stream_cpu.py --step-sync --loop-probe`): at
    CPython's 700, ~24 young and ~2 middle collections a second (0.3 ms and 2-3 ms each, ~1.2% of a core, each
    one a stall of every stream); at 10,000, one young collection every ~5 s (~3 ms)."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_GC_THRESHOLD, *gc.get_threshold()[1:])
    log.info("start-up heap frozen", extra={"objects": gc.get_freeze_count(), "gc_thresholds": gc.get_threshold()})


def build_server(
    settings: GatewaySettings, *, host: str | None = None, port: int | None = None, metrics_port: int | None = None,
    freeze_heap: bool = False, **stage_overrides: Any,
) -> GatewayServer:
    """A uvicorn server for `create_app(settings, **stage_overrides)`; `host`/`port`/`metrics_port` override
    the settings (the metrics listener's address is `app.state.metrics_listener.url` once started);
    `freeze_heap`: `freeze_startup_heap()` once it listens (for a process that is only this server).

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
    return GatewayServer(config, drain_s=settings.server.drain_s, drain_close_s=settings.server.drain_close_s,
                         freeze_heap=freeze_heap)


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
    server = build_server(settings, host=args.host, port=args.port, metrics_port=args.metrics_port, freeze_heap=True)
    server.run()
    return 0
