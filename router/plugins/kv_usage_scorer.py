"""Scorer: prefer endpoints with free KV cache (`vllm:kv_cache_usage_perc`, scraped, 0..1).

Formula: score_e = 1 - clamp(kv_usage_e, 0, 1): absolute, not relative, so a fleet that is
uniformly full does not get a spurious preference. Parameters: none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetgate.core.types import Endpoint
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.plugins.base import CycleState, PluginContext
from fleetgate.router.types import RoutingRequest


class KVCacheUsageScorer:
    def __init__(self, *, name: str, state: FleetState) -> None:
        self.name = name
        self.state = state

    def score(self, req: RoutingRequest, cycle: CycleState, endpoints: Sequence[Endpoint]) -> list[float]:
        stats = self.state.stats
        out = []
        for e in endpoints:
            st = stats.get(e.id)
            usage = st.kv_usage if st is not None else 0.0
            out.append(1.0 - min(1.0, max(0.0, usage)))
        return out


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> KVCacheUsageScorer:
    return KVCacheUsageScorer(name=name, state=ctx.state)
