"""Scorer: adapter affinity. Send a LoRA adapter request where the adapter is already loaded.

Input: `RoutingRequest.adapter` (set by the gateway when the requested model is a LoRA adapter; the
candidates are then its base model's endpoints), `FleetState.adapters` (what each engine has loaded:
its `/v1/models`, refreshed by the scraper, plus the loads the gateway made) and `FleetState.load`.
Formula, with a_e = 1 if e has the adapter loaded else 0, x_e = load_e - min over candidates of load
(e's excess load) and margin = `hotspotMargin`:

    score_e = a_e * g_e,     g_e = 1                                   if x_e <= margin
                             g_e = max(0, 1 - (x_e - margin) / margin)  otherwise

A loaded endpoint saves the load (an engine round trip and a wait) and keeps each engine's batches to
fewer distinct adapters. The guard g fades the preference out between `hotspotMargin` and twice that
excess, so one hot adapter does not pile every request onto the pod that has it: past that point the
profile's load scorers pick the least loaded pod, which the gateway then asks to load it too. When no
candidate has it loaded (or the request is for a base model) every endpoint scores the same and the
load scorers decide alone.
Parameters: hotspotMargin (4 requests; null disables the guard).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetgate.core.types import Endpoint
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.plugins.base import CycleState, PluginContext, param
from fleetgate.router.types import RoutingRequest


class AdapterAffinityScorer:
    def __init__(self, *, name: str, state: FleetState, hotspot_margin: float | None = 4.0) -> None:
        if hotspot_margin is not None and hotspot_margin <= 0:
            raise ValueError("hotspotMargin must be positive (or null to disable the guard)")
        self.name = name
        self.state = state
        self.hotspot_margin = hotspot_margin

    def score(self, req: RoutingRequest, cycle: CycleState, endpoints: Sequence[Endpoint]) -> list[float]:
        adapter = req.adapter
        if adapter is None:
            return [0.0] * len(endpoints)
        scores = [1.0 if self.state.has_adapter(e.id, adapter) else 0.0 for e in endpoints]
        margin = self.hotspot_margin
        if margin is not None and any(scores):
            loads = [self.state.load(e.id) for e in endpoints]
            least = min(loads)
            for i, load in enumerate(loads):
                excess = load - least
                if scores[i] and excess > margin:
                    scores[i] = max(0.0, 1.0 - (excess - margin) / margin)
        return scores


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> AdapterAffinityScorer:
    return AdapterAffinityScorer(
        name=name, state=ctx.state, hotspot_margin=param(parameters, "hotspotMargin", 4.0, float)
    )
