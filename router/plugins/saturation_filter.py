"""Filter: shed load when every candidate engine is saturated (the Endpoint Picker's 429), else drop saturated ones.

Input: each endpoint's last scrape (`vllm:num_requests_waiting`, `vllm:kv_cache_usage_perc`) and its age.
An endpoint is saturated when its scrape is fresh (younger than `maxStaleS`) and waiting >= `queueDepth` or
KV-cache usage >= `kvCacheUsage`. Never-scraped and stale endpoints count as not saturated: without data the
filter fails open, as the health filter does. Output: the unsaturated candidates; when there were candidates
and every one is saturated, `FleetSaturatedError` (429 with Retry-After `retryAfterS`): the engines would only
queue the request, so the client is told to come back instead (llm-d's saturation detector, which sheds
sheddable requests, uses the same two signals). Opt-in: not in the shipped profile, whose engines queue.
Parameters: queueDepth (default 5), kvCacheUsage (0.95), maxStaleS (2.0), retryAfterS (1.0).
"""

from __future__ import annotations

from typing import Any

from fleetgate.core.errors import FleetSaturatedError
from fleetgate.core.types import Endpoint
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.plugins.base import CycleState, PluginContext, param
from fleetgate.router.types import RoutingRequest


class SaturationFilter:
    def __init__(
        self, *, name: str, state: FleetState, queue_depth: float, kv_usage: float, max_stale_s: float,
        retry_after_s: float,
    ) -> None:
        if queue_depth <= 0 or not 0 < kv_usage <= 1 or max_stale_s <= 0 or retry_after_s <= 0:
            raise ValueError("queueDepth, maxStaleS and retryAfterS must be > 0 and kvCacheUsage in (0, 1]")
        self.name = name
        self.state = state
        self.queue_depth = queue_depth
        self.kv_usage = kv_usage
        self.max_stale_s = max_stale_s
        self.retry_after_s = retry_after_s

    def saturated(self, endpoint: Endpoint, *, now: float) -> bool:
        st = self.state.stats.get(endpoint.id)
        if st is None or st.scraped_at <= 0 or now - st.scraped_at > self.max_stale_s:
            return False
        return st.waiting >= self.queue_depth or st.kv_usage >= self.kv_usage

    def filter(self, req: RoutingRequest, cycle: CycleState, endpoints: list[Endpoint]) -> list[Endpoint]:
        now = self.state.clock()
        kept = [e for e in endpoints if not self.saturated(e, now=now)]
        if endpoints and not kept:
            raise FleetSaturatedError(
                f"every engine of model {req.model!r} is saturated; retry later", retry_after_s=self.retry_after_s
            )
        return kept


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> SaturationFilter:
    return SaturationFilter(
        name=name, state=ctx.state, queue_depth=param(parameters, "queueDepth", 5, float),
        kv_usage=param(parameters, "kvCacheUsage", 0.95, float), max_stale_s=param(parameters, "maxStaleS", 2.0, float),
        retry_after_s=param(parameters, "retryAfterS", 1.0, float),
    )
