"""The plugin scheduler: producers -> filters -> weighted scorers -> picker, then observers.

For each request: every producer runs (async; an exception is logged, counted and ignored), the
filters narrow the candidates, each scorer's per-endpoint score is clamped to [0, 1] and multiplied
by its weight, the totals are summed and the picker orders the endpoints. The first is the
decision, the second the fallback for the gateway's single connect-failure retry. `reasons` holds
each scorer's weighted score for the chosen endpoint (the gateway's debug header). Every plugin
call and the whole decision are timed in histograms.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

from fleetgate.core.errors import UpstreamUnavailableError
from fleetgate.core.types import Endpoint, Usage
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.load_sync import FleetLoadSync
from fleetgate.router.metrics import RouterMetrics
from fleetgate.router.plugins.base import (
    Closable,
    CycleState,
    Filter,
    FirstTokenObserver,
    Observer,
    Picker,
    Producer,
    Scorer,
    Startable,
    Syncable,
)
from fleetgate.router.types import Decision, RoutingRequest

log = logging.getLogger(__name__)

MAX_OPEN_CYCLES = 10_000
# Cycles of calls that failed, kept for a retry of the same request (on another endpoint, or the same one
# after an adapter reload), which the caller starts at once or after an adapter load: a short memory suffices.
MAX_FAILED_CYCLES = 1_024


@dataclass(slots=True)
class Profile:
    name: str
    picker: Picker
    producers: list[Producer] = field(default_factory=list)
    filters: list[Filter] = field(default_factory=list)
    scorers: list[tuple[Scorer, float]] = field(default_factory=list)
    observers: list[Observer] = field(default_factory=list)
    first_token: list[FirstTokenObserver] = field(default_factory=list)
    closables: list[Closable] = field(default_factory=list)
    startables: list[Startable] = field(default_factory=list)
    syncables: list[Syncable] = field(default_factory=list)


class PluginScheduler:
    """Implements `fleetgate.router.types.Scheduler`; built by `fleetgate.router.build`."""

    def __init__(
        self, *, profile: Profile, state: FleetState, metrics: RouterMetrics, scraper: Any = None, source: Any = None,
        load_sync: FleetLoadSync | None = None,
    ) -> None:
        self.profile = profile
        self.load_sync = load_sync
        self.source = source
        self.state = state
        self.metrics = metrics
        self.scraper = scraper
        self._cycles: OrderedDict[str, CycleState] = OrderedDict()
        self._failed: OrderedDict[str, CycleState] = OrderedDict()
        hist = metrics.plugin_seconds
        self._t_prod = [hist.labels(p.name, "produce") for p in profile.producers]
        self._t_filter = [hist.labels(f.name, "filter") for f in profile.filters]
        self._t_score = [hist.labels(s.name, "score") for s, _ in profile.scorers]
        self._t_pick = hist.labels(profile.picker.name, "pick")
        self._t_decision = metrics.decision_seconds.labels(profile.name)

    async def pick(self, req: RoutingRequest, candidates: Sequence[Endpoint]) -> Decision:
        t_start = perf_counter()
        if self.load_sync is not None:
            self.load_sync.ensure_started()  # needs the running loop, which the first decision has
        cycle: CycleState = {}
        endpoints = list(candidates)
        for producer, timer in zip(self.profile.producers, self._t_prod, strict=True):
            t0 = perf_counter()
            try:
                await producer.produce(req, cycle, endpoints)
            except Exception:
                self.metrics.plugin_errors.labels(producer.name).inc()
                log.warning("routing producer failed; routing without it", exc_info=True,
                            extra={"plugin": producer.name, "request_id": req.request_id})
            timer.observe(perf_counter() - t0)
        for flt, timer in zip(self.profile.filters, self._t_filter, strict=True):
            t0 = perf_counter()
            endpoints = flt.filter(req, cycle, endpoints)
            timer.observe(perf_counter() - t0)
        if not endpoints:
            raise UpstreamUnavailableError(f"no usable endpoint serves model {req.model!r}")
        n = len(endpoints)
        totals = [0.0] * n
        per_scorer: list[tuple[str, list[float]]] = []
        for (scorer, weight), timer in zip(self.profile.scorers, self._t_score, strict=True):
            t0 = perf_counter()
            raw = scorer.score(req, cycle, endpoints)
            timer.observe(perf_counter() - t0)
            weighted = [weight * (1.0 if s > 1.0 else 0.0 if s < 0.0 or s != s else s) for s in raw]
            for i in range(n):
                totals[i] += weighted[i]
            per_scorer.append((scorer.name, weighted))
        t0 = perf_counter()
        order = self.profile.picker.pick(endpoints, totals) if n > 1 else [0]
        self._t_pick.observe(perf_counter() - t0)
        best = order[0]
        reasons = {name: round(w[best], 3) for name, w in per_scorer}
        if per_scorer:
            reasons["total"] = round(totals[best], 3)
        decision = Decision(
            endpoint=endpoints[best],
            fallbacks=[endpoints[i] for i in order[1:2]],
            reasons=reasons,
            profile=self.profile.name,
        )
        self._cycles[req.key] = cycle
        if len(self._cycles) > MAX_OPEN_CYCLES:
            self._cycles.popitem(last=False)
        self._t_decision.observe(perf_counter() - t_start)
        return decision

    def on_start(self, req: RoutingRequest, endpoint: Endpoint) -> None:
        self.state.started(endpoint.id)
        self.metrics.picks.labels(endpoint.id).inc()
        cycle = self._cycles.get(req.key)
        if cycle is None:  # a retry resumes what the pick computed (cached shares, counted tokens)
            cycle = self._cycles[req.key] = self._failed.pop(req.key, {})
        for obs in self.profile.observers:
            obs.on_start(req, cycle, endpoint)

    def on_first_token(self, req: RoutingRequest, endpoint: Endpoint) -> None:
        if not self.profile.first_token:
            return
        cycle = self._cycles.get(req.key)
        if cycle is None:
            return  # completed already, or evicted from the open cycles
        for obs in self.profile.first_token:
            obs.on_first_token(req, cycle, endpoint)

    def on_complete(self, req: RoutingRequest, endpoint: Endpoint, *, ok: bool, usage: Usage | None) -> None:
        self.state.finished(endpoint.id)
        if usage is not None and not usage.estimated:  # the engine's own count of the prompt the router saw
            self.state.chars_per_token.observe(req.model, len(req.prompt_text), usage.prompt_tokens)
        if ok:
            self.state.health.record_success(endpoint.id)
            self.metrics.ejected.labels(endpoint.id).set(0)
        cycle = self._cycles.pop(req.key, {})
        for obs in self.profile.observers:
            obs.on_complete(req, cycle, endpoint, ok=ok, usage=usage)
        if not ok and cycle:
            self._failed[req.key] = cycle
            if len(self._failed) > MAX_FAILED_CYCLES:
                self._failed.popitem(last=False)

    def on_connect_error(self, endpoint: Endpoint) -> None:
        backoff = self.state.health.record_failure(endpoint.id)
        self.metrics.ejections.labels(endpoint.id, "connect").inc()
        self.metrics.ejected.labels(endpoint.id).set(1)
        log.warning("endpoint ejected after a connect error",
                    extra={"endpoint": endpoint.id, "url": endpoint.url, "backoff_s": backoff})

    async def start(self, source: Any = None) -> None:
        """Begin scraping `/metrics` and polling `/health` of the endpoints `source` lists (an object
        with `models()` and `endpoints(model)`; default: the source given to `build_scheduler`), and
        start the plugins that follow endpoints themselves (`Startable`: the KV-event subscribers)."""
        src = source if source is not None else self.source
        if self.scraper is not None and src is not None:
            await self.scraper.start(src)
        if src is not None:
            for plugin in self.profile.startables:
                await plugin.start(src)

    async def sync_now(self) -> bool:
        """Run every sync with the other gateway replicas once (in-flight counts, then each plugin's), as their
        background tasks do every interval; True when each succeeded or shares nothing."""
        ok = await self.load_sync.sync_now() if self.load_sync is not None else True
        for plugin in self.profile.syncables:
            ok = await plugin.sync_now() and ok
        return ok

    async def aclose(self) -> None:
        if self.load_sync is not None:
            await self.load_sync.aclose()
        if self.scraper is not None:
            await self.scraper.aclose()
        for c in self.profile.closables:
            await c.aclose()
