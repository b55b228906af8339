"""Many simulated engines in one process, each on its own loopback port.

`start_sim_fleet` is the in-process API behind `fleetgate sim` and `fleetgate up --engine sim`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from aiohttp import web

from fleetgate.sim.engine import SimEngine
from fleetgate.sim.profile import PROFILES, SimProfile


@dataclass(slots=True)
class SimFleet:
    urls: list[str]  # base URLs, no trailing slash and no /v1 (the `Endpoint.url` convention)
    engines: list[SimEngine]
    model: str
    _runners: list[web.AppRunner] = field(default_factory=list, repr=False)

    async def aclose(self) -> None:
        for runner in self._runners:
            await runner.cleanup()
        self._runners.clear()

    async def __aenter__(self) -> SimFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


async def start_sim_fleet(
    *,
    replicas: int,
    host: str = "127.0.0.1",
    base_port: int = 0,
    profile: SimProfile | None = None,
) -> SimFleet:
    """Start `replicas` simulated engines. `base_port=0` picks free ports; otherwise replica i
    listens on `base_port + i`. The fleet serves `profile.model`."""
    from fleetgate.sim.server import build_app

    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    prof = profile or PROFILES["vllm-cpu-gemma3-270m"]
    fleet = SimFleet(urls=[], engines=[], model=prof.model)
    try:
        for i in range(replicas):
            engine = SimEngine(profile=prof, name=f"sim-{i}")
            # handler_cancellation: a client that leaves cancels its generation, as in vLLM (an abandoned request
            # must not keep the engine busy, nor hold `fleetgate up`'s stop until it finishes).
            runner = web.AppRunner(build_app(engine), access_log=None, handle_signals=False, handler_cancellation=True)
            await runner.setup()
            fleet._runners.append(runner)
            site = web.TCPSite(runner, host, base_port + i if base_port else 0)
            await site.start()
            port = runner.addresses[0][1]
            fleet.urls.append(f"http://{host}:{port}")
            fleet.engines.append(engine)
    except BaseException:
        await fleet.aclose()
        raise
    return fleet
