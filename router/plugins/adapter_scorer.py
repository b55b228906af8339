"""Scorer + observer: adapter affinity. Send a LoRA adapter request where the adapter is already loaded.

Input: `RoutingRequest.adapter` (set by the gateway when the requested model is a LoRA adapter; the
candidates are then its base model's endpoints), `FleetState.adapters` (what each engine has registered:
its `/v1/models`, refreshed by the scraper, plus the loads the gateway made), the scraped
`vllm:lora_requests_info` (`EndpointStats.active_adapters`: adapters of the engine's running and waiting
requests, i.e. resident in its GPU slots; `max_loras`: its slots), joined with the adapters of the requests
this gateway has in flight there now (observer: fresher than the last scrape, so a burst for a new adapter
sees where its first request went) and `FleetState.load`.
Affinity a_e, as in the Gateway API Inference Extension's LoRA-affinity scorer but also knowing what is
registered (a swap-in from host memory is cheap, a load from disk is not):

    a_e = 1.0   the adapter is active on e (its requests already batch there)
          0.9   e served the adapter's last request from this gateway (likely still in a GPU slot)
          0.5   registered on e and a GPU slot is free (swapped in without evicting anyone)
          0.3   not registered, a slot free (the gateway loads it; no eviction)
          0.15  registered, every slot busy with other adapters (the request waits for a slot)
          0     otherwise
    (an engine that reports no `lora_requests_info`: a_e = 1 if registered, else 0)

Then, with x_e = load_e - min over candidates of load (e's excess load) and margin = `hotspotMargin`:

    score_e = a_e * g_e,     g_e = 1                                   if x_e <= margin
                             g_e = max(0, 1 - (x_e - margin) / margin)  otherwise

Preferring where the adapter is active or has room keeps each engine's batches to fewer distinct adapters
and spreads the fine-tunes over the pods' slots. The guard g fades the preference out between
`hotspotMargin` and twice that excess, so one hot adapter does not pile every request onto the pod that has
it: past that point the profile's load scorers pick the least loaded pod, which the gateway then asks to
load it too. A base-model request scores 0 everywhere (no effect). At the default weight 3 a tier is worth
3 x a_e points against the inflight scorer's spread of 1 (inverse min-max, weight 1): active or last served
(2.7-3) beat every lower tier, and registered-free (1.5) beats the busy tiers (0-0.45), by more than any
load difference that scorer sees; the other gaps (0.3-0.6) only tip close calls. Tiers and weight tuned with
`fleetgate bench cost --lora` (fewer loads and slot swaps, lower TTFT p90 than closer tiers).
Parameters: hotspotMargin (4 requests; null disables the guard).
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence
from typing import Any

from fleetgate.core.types import Endpoint, Usage
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.plugins.base import CycleState, PluginContext, hotspot_guard, param
from fleetgate.router.types import RoutingRequest

ACTIVE, LAST_SERVED, REGISTERED_FREE, UNREGISTERED_FREE, REGISTERED_BUSY = 1.0, 0.9, 0.5, 0.3, 0.15
MAX_REMEMBERED = 10_000  # adapters whose last endpoint is remembered (bounded: names come from discovery)


class AdapterAffinityScorer:
    def __init__(self, *, name: str, state: FleetState, hotspot_margin: float | None = 4.0) -> None:
        if hotspot_margin is not None and hotspot_margin <= 0:
            raise ValueError("hotspotMargin must be positive (or null to disable the guard)")
        self.name = name
        self.state = state
        self.hotspot_margin = hotspot_margin
        self._inflight: dict[str, Counter[str]] = {}  # endpoint id -> adapter -> this gateway's requests there
        self._last: OrderedDict[str, str] = OrderedDict()  # adapter -> endpoint id of its last request

    def on_start(self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint) -> None:
        if req.adapter is not None:
            self._inflight.setdefault(endpoint.id, Counter())[req.adapter] += 1
            self._last[req.adapter] = endpoint.id
            self._last.move_to_end(req.adapter)
            if len(self._last) > MAX_REMEMBERED:
                self._last.popitem(last=False)

    def on_complete(
        self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint, *, ok: bool, usage: Usage | None
    ) -> None:
        counts = self._inflight.get(endpoint.id)
        if req.adapter is None or counts is None or counts[req.adapter] <= 0:
            return
        counts[req.adapter] -= 1
        if counts[req.adapter] == 0:
            del counts[req.adapter]
            if not counts:
                del self._inflight[endpoint.id]

    def inflight_adapters(self, endpoint_id: str) -> frozenset[str]:
        counts = self._inflight.get(endpoint_id)
        return frozenset(counts) if counts else frozenset()

    def score(self, req: RoutingRequest, cycle: CycleState, endpoints: Sequence[Endpoint]) -> list[float]:
        adapter = req.adapter
        if adapter is None:
            return [0.0] * len(endpoints)
        scores = [self._affinity(e.id, adapter) for e in endpoints]
        hotspot_guard(scores, endpoints, self.state, self.hotspot_margin)
        return scores

    def _affinity(self, endpoint_id: str, adapter: str) -> float:
        registered = self.state.has_adapter(endpoint_id, adapter)
        st = self.state.stats.get(endpoint_id)
        if st is None or st.active_adapters is None:
            return 1.0 if registered else 0.0
        active = st.active_adapters | self.inflight_adapters(endpoint_id)
        if adapter in active:
            return ACTIVE
        if self._last.get(adapter) == endpoint_id:
            return LAST_SERVED
        free = st.max_loras is None or len(active) < st.max_loras
        if free:
            return REGISTERED_FREE if registered else UNREGISTERED_FREE
        return REGISTERED_BUSY if registered else 0.0


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> AdapterAffinityScorer:
    return AdapterAffinityScorer(
        name=name, state=ctx.state, hotspot_margin=param(parameters, "hotspotMargin", 4.0, float)
    )
