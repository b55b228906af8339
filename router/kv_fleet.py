"""The KV-event subscribers of every engine the gateway routes to, and their state, in one place.

Where an endpoint publishes comes from its discovery labels (`kv_events`, `kv_events_replay`,
`kv_events_topic`: static `models[].kvEvents` or the engine pods' named ports in Kubernetes), else from
the scorer's `port`/`replayPort`/`topic` template applied to the endpoint's host. An endpoint with
neither has no state here: the scorer routes it on the approximate index.

`ensure(endpoints)` starts a subscriber for each new endpoint (cheap: a dict lookup per endpoint
when nothing is new, so the scorer calls it on every request); `start(source)` also follows the
gateway's discovery every `refresh_s`, starting subscribers for new engines and stopping those of
engines that left. Counters and gauges are rendered from the states when Prometheus scrapes
(`KvEventsCollector`), so the event path and the decision path never touch a metrics lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetgate.core.tasks import cancel_and_wait
from fleetgate.core.types import LABEL_KV_EVENTS, LABEL_KV_EVENTS_REPLAY, LABEL_KV_EVENTS_TOPIC, Endpoint
from fleetgate.router.kv_block_index import EndpointBlocks
from fleetgate.router.kv_subscriber import COALESCE_S, EndpointKvState, KvEventSource, KvEventSubscriber

if TYPE_CHECKING:
    import zmq.asyncio

log = logging.getLogger(__name__)


class KvEventFleet:
    def __init__(
        self, *, stale_s: float = 5.0, group: int | None = None, replay_timeout_s: float = 2.0,
        port: int | None = None, replay_port: int | None = None, topic: str = "", refresh_s: float = 5.0,
        coalesce_s: float = COALESCE_S, clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if stale_s <= 0 or replay_timeout_s <= 0 or refresh_s <= 0:
            raise ValueError("staleS, replayTimeoutS and refreshS must be positive")
        if not 0 <= coalesce_s <= 1:
            raise ValueError("eventCoalesceS must be in 0..1 seconds")
        for name, value in (("port", port), ("replayPort", replay_port)):
            if value is not None and not 1 <= value <= 65535:
                raise ValueError(f"{name} must be in 1..65535, got {value}")
        self.stale_s = stale_s
        self.group = group
        self.replay_timeout_s = replay_timeout_s
        self.port = port
        self.replay_port = replay_port
        self.topic = topic
        self.refresh_s = refresh_s
        self.coalesce_s = coalesce_s
        self.clock = clock
        self.states: dict[str, EndpointKvState] = {}
        self.fallbacks: dict[str, int] = {}  # reason -> endpoint scorings that used the approximate index
        self._subscribers: dict[str, KvEventSubscriber] = {}
        self._sources: dict[str, KvEventSource | None] = {}
        self._context: zmq.asyncio.Context | None = None
        self._task: asyncio.Task[None] | None = None

    def source_of(self, endpoint: Endpoint) -> KvEventSource | None:
        labels = endpoint.labels
        publisher = labels.get(LABEL_KV_EVENTS)
        if publisher:
            return KvEventSource(publisher=publisher, replay=labels.get(LABEL_KV_EVENTS_REPLAY) or None,
                                 topic=labels.get(LABEL_KV_EVENTS_TOPIC, self.topic))
        if self.port is None:
            return None
        host = urlsplit(endpoint.url).hostname
        if not host:
            return None
        host = f"[{host}]" if ":" in host else host
        replay = f"tcp://{host}:{self.replay_port}" if self.replay_port is not None else None
        return KvEventSource(publisher=f"tcp://{host}:{self.port}", replay=replay, topic=self.topic)

    def ensure(self, endpoints: Sequence[Endpoint]) -> None:
        """Start following each endpoint not followed yet (needs a running event loop)."""
        for endpoint in endpoints:
            if endpoint.id in self._subscribers:
                continue
            if endpoint.id in self._sources and LABEL_KV_EVENTS not in endpoint.labels:
                continue  # known to publish nowhere (the template depends on the URL only)
            # An endpoint id can be listed under several routes, some without the event labels (a probe route of
            # one engine): the labelled listing starts following even when an unlabelled one came first.
            source = self._sources[endpoint.id] = self.source_of(endpoint)
            if source is None:
                continue
            state = self.states[endpoint.id] = EndpointKvState(
                blocks=EndpointBlocks(group=self.group), stale_s=self.stale_s, clock=self.clock)
            subscriber = self._subscribers[endpoint.id] = KvEventSubscriber(
                name=endpoint.id, source=source, state=state, context=self._zmq(),
                replay_timeout_s=self.replay_timeout_s, coalesce_s=self.coalesce_s)
            subscriber.start()
            log.info("following KV events", extra={"endpoint": endpoint.id, "publisher": source.publisher,
                                                  "replay": source.replay})

    async def retain(self, keep: set[str]) -> None:
        """Stop following endpoints that discovery no longer lists."""
        for endpoint_id in [e for e in self._sources if e not in keep]:
            self._sources.pop(endpoint_id, None)
            self.states.pop(endpoint_id, None)
            subscriber = self._subscribers.pop(endpoint_id, None)
            if subscriber is not None:
                await subscriber.aclose()

    def state(self, endpoint_id: str) -> EndpointKvState | None:
        return self.states.get(endpoint_id)

    def note_fallback(self, reason: str) -> None:
        self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1

    async def start(self, source: Any) -> None:
        if self._task is None and source is not None:
            self._task = asyncio.create_task(self._follow_discovery(source), name="kv-events-discovery")

    async def _follow_discovery(self, source: Any) -> None:
        from fleetgate.router.scraping import list_endpoints

        while True:
            try:
                endpoints = await list_endpoints(source)
                self.ensure(endpoints)
                await self.retain({e.id for e in endpoints})
            except asyncio.CancelledError:
                raise
            except Exception:
                log.warning("listing endpoints for KV events failed", exc_info=True)
            await asyncio.sleep(self.refresh_s)

    def _zmq(self) -> zmq.asyncio.Context:
        if self._context is None:
            import zmq.asyncio

            self._context = zmq.asyncio.Context()
        return self._context

    async def aclose(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        await self.retain(set())
        if self._context is not None:
            self._context.destroy(linger=0)
            self._context = None


class KvEventsCollector(Collector):
    """Renders the fleet's KV-event counters and gauges at scrape time."""

    def __init__(self, fleet: KvEventFleet) -> None:
        self.fleet = fleet

    def collect(self) -> Iterator[Metric]:
        now = self.fleet.clock()
        batches = CounterMetricFamily("fleetgate_router_kv_events_batches", "KV event batches applied.",
                                      labels=["endpoint"])
        wakes = CounterMetricFamily("fleetgate_router_kv_events_wakes",
                                    "Wakes that applied KV event batches (batches over wakes: batches per wake).",
                                    labels=["endpoint"])
        problems = CounterMetricFamily(
            "fleetgate_router_kv_events_problems",
            "KV event stream problems: undecodable batches, sequence gaps, engine restarts, resyncs, failed "
            "replays, disconnects, and stored blocks that were orphaned (unknown parent) or skipped.",
            labels=["endpoint", "kind"])
        blocks = GaugeMetricFamily("fleetgate_router_kv_blocks", "Blocks the engine holds, as its events say.",
                                   labels=["endpoint"])
        usable = GaugeMetricFamily("fleetgate_router_kv_events_usable",
                                   "1 while the endpoint's block set is trusted (connected, synced, not stale).",
                                   labels=["endpoint"])
        for endpoint_id, state in list(self.fleet.states.items()):
            s = state.stats
            batches.add_metric([endpoint_id], s.batches)
            wakes.add_metric([endpoint_id], s.wakes)
            for kind, value in (("decode", s.decode_errors), ("gap", s.gaps), ("restart", s.restarts),
                                ("resync", s.resyncs), ("replay_failure", s.replay_failures),
                                ("disconnect", s.disconnects), ("orphan_block", s.applied.orphaned),
                                ("skipped_block", s.applied.skipped)):
                problems.add_metric([endpoint_id, kind], value)
            blocks.add_metric([endpoint_id], len(state.blocks))
            usable.add_metric([endpoint_id], 1.0 if state.usable(now) else 0.0)
        fallbacks = CounterMetricFamily(
            "fleetgate_router_precise_prefix_fallbacks",
            "Endpoint scorings the precise prefix scorer left to the approximate index, by reason.", labels=["reason"])
        for reason, count in sorted(self.fleet.fallbacks.items()):
            fallbacks.add_metric([reason], count)
        yield from (batches, wakes, problems, blocks, usable, fallbacks)
