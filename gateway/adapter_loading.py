"""LoRA adapters on demand: an endpoint picked for an adapter it has not loaded is asked to load it first.

The scheduler picks among the base model's endpoints (the adapter-affinity scorer prefers those with the
adapter loaded, blended with load). When the pick has not loaded it (per `FleetState.adapters`, which the
scraper refreshes from each engine's `/v1/models`), `AdapterLoader.ensure` calls the engine's
`POST /v1/load_lora_adapter` (`fleetgate.engine.lora_api`) and waits at most `server.adapter_load_timeout_s`.

- Single flight: one load per (endpoint, adapter) at a time; a burst of requests waits on the same load.
- A waiter that leaves (the client went away, or its own wait ran out) stops waiting; the last waiter to
  leave cancels the load call, so nothing outlives the requests that wanted it. A load cancelled so counts
  as `timeout` (logged) when a wait ran out, `abandoned` when only clients left.
- Success is written to `FleetState` at once (the next scrape confirms it); failure raises
  `AdapterLoadFailed`, whose message names the endpoint for the log only.

`read_loaded_names` is the scraper's `AdapterReader` over the same client (the router may not import it).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from functools import partial

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Histogram

from fleetgate.core.adapters import AdapterSpec
from fleetgate.core.types import Endpoint
from fleetgate.engine.lora_api import AdapterApiError, load_adapter, loaded_adapters
from fleetgate.router.fleet_state import FleetState

log = logging.getLogger("fleetgate.gateway.adapters")
LOAD_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0)


class AdapterLoadFailed(Exception):
    """The endpoint did not load the adapter in time or refused it (the message names the endpoint)."""


async def read_loaded_names(session: aiohttp.ClientSession, url: str, timeout_s: float) -> Collection[str]:
    """The names of the adapters the engine at `url` has loaded; raises when its answer is not a model list."""
    return {a.name for a in await loaded_adapters(session, url, timeout_s=timeout_s, strict=True)}


@dataclass(slots=True)
class _Flight:
    task: asyncio.Task[None]
    waiters: int = 0
    timed_out: bool = False  # a waiter gave up on the bound (the engine stalled), not only clients that left


class AdapterLoader:
    def __init__(
        self,
        *,
        session: Callable[[], aiohttp.ClientSession],
        timeout_s: float,
        state: FleetState | None,
        registry: CollectorRegistry,
    ) -> None:
        self._session = session
        self._timeout_s = timeout_s
        # The scheduler's view when it has one; else this loader remembers its own loads.
        self._state = state if state is not None else FleetState()
        self._flights: dict[tuple[str, str], _Flight] = {}
        self.loads = Counter(
            "fleetgate_adapter_loads",
            "On-demand LoRA adapter loads the gateway asked an engine for, by adapter and result.",
            ["adapter", "result"],
            registry=registry,
        )
        self.load_seconds = Histogram(
            "fleetgate_adapter_load_seconds",
            "Time an engine took to load a LoRA adapter on demand.",
            buckets=LOAD_BUCKETS,
            registry=registry,
        )

    def loaded(self, endpoint_id: str, name: str) -> bool:
        return self._state.has_adapter(endpoint_id, name)

    def forget(self, endpoint_id: str, name: str) -> None:
        """The endpoint turned out not to have `name` loaded."""
        self._state.drop_adapter(endpoint_id, name)

    def in_flight(self) -> int:
        """Loads being made now (tests and shutdown check that none is left behind)."""
        return len(self._flights)

    async def ensure(self, endpoint: Endpoint, spec: AdapterSpec) -> None:
        """Return once `endpoint` has `spec` loaded; raise `AdapterLoadFailed` when it cannot within the bound."""
        if self.loaded(endpoint.id, spec.name):
            return
        key = (endpoint.id, spec.name)
        flight = self._flights.get(key)
        if flight is None:
            task = asyncio.create_task(self._load(endpoint, spec), name=f"load-adapter-{spec.name}")
            flight = self._flights[key] = _Flight(task=task)
            task.add_done_callback(partial(self._landed, key, flight))
        flight.waiters += 1
        try:
            await asyncio.wait_for(asyncio.shield(flight.task), timeout=self._timeout_s)
        except TimeoutError:
            flight.timed_out = True
            waited = f"{self._timeout_s:g}s"
            raise AdapterLoadFailed(f"{endpoint.id} did not load adapter {spec.name!r} in {waited}") from None
        except AdapterApiError as exc:
            raise AdapterLoadFailed(f"{endpoint.id}: {exc}") from None
        finally:
            flight.waiters -= 1
            if flight.waiters == 0 and not flight.task.done():
                flight.task.cancel()  # nobody waits for it any more
                if self._flights.get(key) is flight:
                    del self._flights[key]

    async def _load(self, endpoint: Endpoint, spec: AdapterSpec) -> None:
        t0 = time.perf_counter()
        try:
            await load_adapter(
                self._session(), endpoint.url, name=spec.name, source=spec.source, timeout_s=self._timeout_s
            )
        except AdapterApiError as exc:
            # the call's own deadline (the same bound as the waiters') may fire first: a stall all the same
            stalled = isinstance(exc.__cause__, TimeoutError)
            self.loads.labels(spec.name, "timeout" if stalled else "error").inc()
            log.warning("adapter load failed", exc_info=True, extra={"endpoint": endpoint.id, "adapter": spec.name})
            raise
        self.load_seconds.observe(time.perf_counter() - t0)
        self.loads.labels(spec.name, "loaded").inc()
        self._state.add_adapter(endpoint.id, spec.name)
        log.info(
            "adapter loaded",
            extra={"endpoint": endpoint.id, "adapter": spec.name, "seconds": round(time.perf_counter() - t0, 3)},
        )

    def _landed(self, key: tuple[str, str], flight: _Flight, task: asyncio.Task[None]) -> None:
        if self._flights.get(key) is flight:
            del self._flights[key]
        if task.cancelled():  # its waiters all left: the engine stalled past the bound, or clients went away
            endpoint_id, name = key
            self.loads.labels(name, "timeout" if flight.timed_out else "abandoned").inc()
            if flight.timed_out:
                log.warning("adapter load timed out", extra={"endpoint": endpoint_id, "adapter": name,
                                                             "seconds": self._timeout_s})
        else:
            task.exception()  # retrieved: a failure nobody waited for is logged in `_load`, not by asyncio

    async def aclose(self) -> None:
        """Cancel loads still in flight (shutdown)."""
        tasks = [f.task for f in self._flights.values()]
        self._flights.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
