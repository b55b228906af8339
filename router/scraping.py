"""Background scraping of each engine's `/metrics` and polling of its `/health`.

Every `scrape.intervalS` the scraper asks the endpoint source for the current endpoints (any
object with `models()` and `endpoints(model)`, sync or async, e.g. the gateway's discovery), GETs
`<url>/metrics` of each concurrently (timeout `scrape.timeoutS`) and stores waiting, running, KV
usage and KV capacity in `FleetState.stats`. Staleness is exported per endpoint as
`fleetgate_router_endpoint_metrics_age_seconds`. Every `scrape.healthIntervalS` it GETs
`<url>/health`: a failure or non-2xx ejects the endpoint with the usual back-off, a 2xx from an
ejected endpoint lifts the ejection. When the source knows LoRA adapters (an `adapters()` method that
returns some) and the scraper was given an `adapter_reader` (the gateway passes one over
`fleetgate.engine.lora_api`, which the router may not import), each engine's `/v1/models` is read at the
health cadence too and `FleetState.adapters` refreshed from it; a failed or malformed answer keeps what
was known (never clears it) and never stops the `/metrics` scrape. Uses aiohttp (no web framework).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import Awaitable, Callable, Collection, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar

from fleetgate.core.tasks import cancel_and_wait
from fleetgate.core.types import Endpoint
from fleetgate.router.config import ScrapeConfig
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.metrics import RouterMetrics
from fleetgate.router.vllm_metrics import parse_vllm_metrics

if TYPE_CHECKING:
    import aiohttp

log = logging.getLogger(__name__)
T = TypeVar("T")
# (session, engine base URL, timeout_s) -> names of the adapters loaded there; raises when it cannot tell.
AdapterReader = Callable[["aiohttp.ClientSession", str, float], Awaitable[Collection[str]]]


class EndpointSource(Protocol):
    """The shape of the gateway's endpoint discovery (router may not import the gateway)."""

    def models(self) -> Sequence[str] | Awaitable[Sequence[str]]: ...

    def endpoints(self, model: str) -> Sequence[Endpoint] | Awaitable[Sequence[Endpoint]]: ...


async def _maybe_await(value: T | Awaitable[T]) -> T:
    if inspect.isawaitable(value):
        return await value
    return value


async def list_endpoints(source: EndpointSource) -> list[Endpoint]:
    seen: dict[str, Endpoint] = {}
    for model in await _maybe_await(source.models()):
        for ep in await _maybe_await(source.endpoints(model)):
            seen.setdefault(ep.id, ep)
    return list(seen.values())


def knows_adapters(source: object) -> bool:
    """Whether the source serves LoRA adapters (an `AdapterCatalog` of the gateway with at least one)."""
    adapters = getattr(source, "adapters", None)
    if not callable(adapters):
        return False
    try:
        return bool(adapters())
    except Exception:  # a broken catalog must not stop the scrape loop
        log.warning("adapter catalog failed", exc_info=True)
        return False


class EndpointScraper:
    def __init__(
        self, *, state: FleetState, metrics: RouterMetrics, config: ScrapeConfig,
        adapter_reader: AdapterReader | None = None,
    ) -> None:
        self.state = state
        self.metrics = metrics
        self.config = config
        self.adapter_reader = adapter_reader
        self._task: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None

    async def start(self, source: EndpointSource) -> None:
        import aiohttp

        if self._task is not None:
            return
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.config.timeout_s))
        self._task = asyncio.create_task(self._loop(source), name="router-scraper")

    async def aclose(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def _loop(self, source: EndpointSource) -> None:
        last_health = -1e18
        while True:
            try:
                endpoints = await list_endpoints(source)
                await asyncio.gather(*(self.scrape(ep) for ep in endpoints))
                now = self.state.clock()
                if now - last_health >= self.config.health_interval_s:
                    last_health = now
                    polls = [self.poll_health(ep) for ep in endpoints]
                    if self.adapter_reader is not None and knows_adapters(source):
                        polls += [self.refresh_adapters(ep) for ep in endpoints]
                    await asyncio.gather(*polls)
                self._export_age(endpoints)
                ids = {ep.id for ep in endpoints}
                self.state.health.forget(ids)
                self.state.forget_adapters(ids)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("endpoint scrape round failed", exc_info=True)
            await asyncio.sleep(self.config.interval_s)

    async def scrape(self, ep: Endpoint) -> bool:
        assert self._session is not None, "start() the scraper first"
        try:
            async with self._session.get(f"{ep.url}/metrics") as resp:
                if resp.status != 200:
                    raise OSError(f"HTTP {resp.status}")
                text = await resp.text()
            parsed = parse_vllm_metrics(text)
        except (TimeoutError, OSError, ValueError) as exc:
            self.metrics.scrape_errors.labels(ep.id).inc()
            log.debug("metrics scrape failed", extra={"endpoint": ep.id, "error": str(exc)})
            return False
        self.state.update(ep.id, waiting=parsed.waiting, running=parsed.running, kv_usage=parsed.kv_usage,
                          kv_capacity_tokens=parsed.kv_capacity_tokens, active_adapters=parsed.active_adapters,
                          max_loras=parsed.max_loras)
        return True

    async def refresh_adapters(self, ep: Endpoint) -> bool:
        """Read the adapters the engine has loaded into `FleetState`; False (state kept) when it cannot tell."""
        assert self._session is not None, "start() the scraper first"
        if self.adapter_reader is None:
            return False
        asked_at = self.state.clock()
        try:
            names = await self.adapter_reader(self._session, ep.url, self.config.timeout_s)
        except Exception as exc:  # whatever the engine answered, what was known stays
            self.metrics.scrape_errors.labels(ep.id).inc()
            log.debug("adapter list failed", extra={"endpoint": ep.id, "error": str(exc)})
            return False
        self.state.set_adapters(ep.id, set(names), as_of=asked_at)
        return True

    async def poll_health(self, ep: Endpoint) -> bool:
        assert self._session is not None, "start() the scraper first"
        try:
            async with self._session.get(f"{ep.url}/health") as resp:
                ok = 200 <= resp.status < 300
        except (TimeoutError, OSError):
            ok = False
        health = self.state.health
        if ok:
            if health.is_ejected(ep.id):
                health.record_success(ep.id)
            self.metrics.ejected.labels(ep.id).set(0)
        else:
            health.record_failure(ep.id)
            self.metrics.ejections.labels(ep.id, "health").inc()
            self.metrics.ejected.labels(ep.id).set(1)
        return ok

    def _export_age(self, endpoints: Sequence[Endpoint]) -> None:
        now = self.state.clock()
        for ep in endpoints:
            st = self.state.stats.get(ep.id)
            age = now - st.scraped_at if st is not None and st.scraped_at > 0 else float("inf")
            self.metrics.metrics_age.labels(ep.id).set(age)
