"""`fleetgate epp --config FILE`: FleetGate's router served as a Gateway API Inference Extension Endpoint Picker.

One gRPC server (grpc.aio) on `epp.host:epp.port` (9002, the GIE convention) serves:
- `envoy.service.ext_proc.v3.ExternalProcessor/Process`: one stream per proxied request (`exchange`);
- the gRPC health services the protocol names: `liveness` (SERVING while the process answers), `readiness`
  and `envoy.service.ext_proc.v3.ExternalProcessor` (SERVING once every stage has started: endpoints
  discovered, scrapers and Redis connected; NOT_SERVING while stopping), and the overall "" service.
The stages are the gateway's own (`wiring.build_stages` from the same YAML: tenants, limits, cache, tiers,
routing profile, discovery, `redis_url` for state shared across replicas), held by a `Pipeline` that never
forwards a client request itself: its engine client only loads LoRA adapters and asks the cache's sampled
answer checks. Prometheus metrics are on `server.metrics_port`, as the gateway's.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as ext_proc_grpc
from grpc_health.v1 import _async as health_async
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import CollectorRegistry

from fleetgate.core.kvstore import KVStore, make_kvstore
from fleetgate.gateway.epp import messages
from fleetgate.gateway.epp.envoyconfig import FailureMode, envoy_yaml
from fleetgate.gateway.epp.exchange import Door, Exchange
from fleetgate.gateway.epp.lifetime import StreamLife
from fleetgate.gateway.epp.metrics import EppMetrics
from fleetgate.gateway.metrics import GatewayMetrics
from fleetgate.gateway.metrics_listener import MetricsListener
from fleetgate.gateway.pipeline import Pipeline
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.stageset import Stages, start_stages, stop_stages
from fleetgate.gateway.upstream import make_session
from fleetgate.gateway.wiring import build_stages

log = logging.getLogger("fleetgate.gateway.epp")
EXT_PROC_SERVICE = "envoy.service.ext_proc.v3.ExternalProcessor"
READY_SERVICES = ("readiness", EXT_PROC_SERVICE, "")


class ExternalProcessor(ext_proc_grpc.ExternalProcessorServicer):
    def __init__(self, door: Door) -> None:
        self._door = door

    async def Process(
        self, request_iterator: AsyncIterator[messages.ProcessingRequest], context: grpc.aio.ServicerContext[Any, Any]
    ) -> None:
        door = self._door
        life = StreamLife(door.settings.server.stream_deadline_s)
        exchange = Exchange(door, life)
        streams, activity = door.metrics.streams, door.activity
        streams.inc()
        activity.begin()
        try:
            try:
                async with life:
                    activity.opened(life)  # from here the drain can end it (at once when it already began)
                    while not exchange.done:
                        req = await context.read()
                        if req is grpc.aio.EOF:
                            break
                        for resp in await exchange.on_message(req):
                            await context.write(resp)
            except TimeoutError:
                if not life.expired():
                    raise
                for resp in exchange.expire(life.ending):  # the request's last answer; then the stream closes
                    await context.write(resp)
        finally:  # also when the proxy resets the stream (the client left): the handler is cancelled
            activity.closed(life)
            exchange.close()
            streams.dec()
            activity.end()


class EppServer:
    """The picker's stages, gRPC server and metrics listener; `start()` / `stop()` in a running loop."""

    def __init__(
        self, settings: GatewaySettings, *, stages: Stages, registry: CollectorRegistry, kvstore: KVStore,
        host: str, port: int, metrics_port: int | None,
    ) -> None:
        self.settings = settings
        self.stages = stages
        self._registry = registry
        self._kvstore = kvstore
        self._host = host
        self._port = port
        self._session: aiohttp.ClientSession | None = None
        self.pipeline = Pipeline(settings=settings, stages=stages, metrics=GatewayMetrics(registry),
                                 session=self._get_session)
        self.door = Door(pipeline=self.pipeline, settings=settings, metrics=EppMetrics(registry))
        self.health = health_async.HealthServicer()
        self.listener = (MetricsListener(registry, host=settings.server.metrics_host or host, port=metrics_port)
                         if metrics_port is not None else None)
        self._server: grpc.aio.Server | None = None
        self._started: list[Any] = []
        self._stopping = False
        self.port: int = port

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("the Endpoint Picker is not started")
        return self._session

    async def start(self) -> None:
        self._session = make_session(self.settings.server)
        server = self._server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
        ext_proc_grpc.add_ExternalProcessorServicer_to_server(ExternalProcessor(self.door), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        self.port = server.add_insecure_port(f"{self._host}:{self._port}")
        if self.port == 0:
            raise RuntimeError(f"the Endpoint Picker cannot listen on {self._host}:{self._port}")
        await self.health.set("liveness", health_pb2.HealthCheckResponse.SERVING)
        for name in READY_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await server.start()
        if self.listener is not None:
            self.listener.start()
        await start_stages(self.stages, self._started)
        for name in READY_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        log.info("endpoint picker listening", extra={"address": f"{self._host}:{self.port}"})

    async def stop(self, *, drain_s: float | None = None) -> None:
        """The drain, as the gateway's (`serve.GatewayServer`): readiness NOT_SERVING and new streams refused at
        once (the proxy's health check and its ext_proc calls see it; a FailOpen pool then routes around the
        picker), the streams in flight get up to `drain_s` (default `server.drain_s`) to finish by themselves, those
        still open are ended (`lifetime`: an error event and `[DONE]`, or a 503; settled and recorded) and get
        `server.drain_close_s` to flush; then the stages stop. Idempotent."""
        if self._stopping:
            return
        self._stopping = True
        server_settings = self.settings.server
        wait_s = server_settings.drain_s if drain_s is None else drain_s
        for name in READY_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        activity = self.door.activity
        if self._server is not None:
            # refuses new RPCs now; cancels what is still open once the whole drain is over
            stopping = asyncio.ensure_future(self._server.stop(wait_s + server_settings.drain_close_s))
            log.info("draining", extra={"streams": activity.active, "drain_s": wait_s})
            if not await activity.wait_idle(timeout_s=wait_s):
                ended = activity.interrupt()
                log.warning("drain time over: open streams ended", extra={"streams": ended})
                await activity.wait_idle(timeout_s=server_settings.drain_close_s)
            await stopping
        await self.pipeline.shutdown(timeout_s=server_settings.settle_s)
        await stop_stages(self._started, log=log)
        if self._session is not None:
            await self._session.close()
            self._session = None
        await self._kvstore.close()
        if self.listener is not None:
            self.listener.stop()

    @property
    def metrics_url(self) -> str | None:
        return self.listener.url if self.listener is not None else None


def build_epp(
    settings: GatewaySettings, *, host: str | None = None, port: int | None = None, metrics_port: int | None = None,
    registry: CollectorRegistry | None = None, kvstore: KVStore | None = None, **stage_overrides: Any,
) -> EppServer:
    """An Endpoint Picker for `settings` (the gateway's YAML); explicit stages replace the configured ones, as in
    `create_app`. `port` 0: any free port (`EppServer.port` says which once started)."""
    registry = registry if registry is not None else CollectorRegistry()
    store = kvstore if kvstore is not None else make_kvstore(settings.redis_url)
    stages = build_stages(settings, registry=registry, kvstore=store, **stage_overrides)
    epp = settings.epp
    return EppServer(settings, stages=stages, registry=registry, kvstore=store, host=host or epp.host,
                     port=epp.port if port is None else port,
                     metrics_port=settings.server.metrics_port if metrics_port is None else metrics_port)


def envoy_bootstrap(settings: GatewaySettings, *, host: str | None, port: int | None, listen: str,
                    failure_mode: FailureMode) -> str:
    """`fleetgate epp --envoy-config`: Envoy in front of this picker; the static models' endpoints are the pool."""
    listen_host, _, listen_port = listen.rpartition(":")
    epp_host = host or settings.epp.host
    pool = [(u.hostname or "", u.port or 80) for m in settings.models for u in map(urlsplit, m.endpoints)]
    return envoy_yaml(listen=(listen_host or "0.0.0.0", int(listen_port)),
                      epp=("127.0.0.1" if epp_host in ("0.0.0.0", "") else epp_host,
                           settings.epp.port if port is None else port),
                      pool=pool, failure_mode=failure_mode)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", help="gateway YAML file: the same stages as `fleetgate gateway` (default: "
                        "embedded defaults)")
    parser.add_argument("--host", help="gRPC listen address (default: epp.host)")
    parser.add_argument("--port", type=int, help="gRPC port for ext_proc and health (default: epp.port, 9002)")
    parser.add_argument("--metrics-port", type=int, help="/metrics listen port (default: server.metrics_port)")
    parser.add_argument("--envoy-config", action="store_true",
                        help="print a plain Envoy bootstrap that routes through this picker, and exit")
    parser.add_argument("--listen", default="0.0.0.0:8081", help="with --envoy-config: Envoy's client address")
    parser.add_argument("--failure-mode", choices=["FailClose", "FailOpen"], default="FailClose",
                        help="with --envoy-config: the pool's failureMode (FailOpen: the static models' endpoints)")


def run(args: argparse.Namespace) -> int:
    import signal

    import uvloop

    from fleetgate.core.config import load_model
    from fleetgate.core.telemetry import configure_logging
    from fleetgate.gateway.serve import freeze_startup_heap

    settings = load_model(GatewaySettings, args.config)
    if args.envoy_config:
        print(envoy_bootstrap(settings, host=args.host, port=args.port, listen=args.listen,
                              failure_mode=args.failure_mode), end="")
        return 0
    configure_logging(level=settings.server.log_level)

    async def serve() -> None:
        server = build_epp(settings, host=args.host, port=args.port, metrics_port=args.metrics_port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await server.start()
        freeze_startup_heap()  # the same full-collection stalls as the gateway's (fleetgate.gateway.serve)
        try:
            await stop.wait()
        finally:
            await server.stop()

    uvloop.run(serve())
    return 0
