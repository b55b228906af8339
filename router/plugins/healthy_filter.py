"""Filter: drop endpoints ejected after connect errors, timeouts or failed `/health` polls.

Input: the scheduler's `HealthTracker`. Formula: keep e if not ejected(e). Fail open: when every
candidate is ejected, keep the one whose ejection ends first (a model is never stranded because
all its endpoints blipped; the gateway's request then tells whether it is really down).
Parameters: none (back-off lives in the `ejection` section of the routing config).
"""

from __future__ import annotations

from typing import Any

from fleetgate.core.types import Endpoint
from fleetgate.router.health import HealthTracker
from fleetgate.router.plugins.base import CycleState, PluginContext
from fleetgate.router.types import RoutingRequest


class HealthyFilter:
    def __init__(self, *, name: str, health: HealthTracker) -> None:
        self.name = name
        self.health = health

    def filter(self, req: RoutingRequest, cycle: CycleState, endpoints: list[Endpoint]) -> list[Endpoint]:
        if not self.health.any_tracked:
            return endpoints
        now = self.health.clock()
        kept = [e for e in endpoints if not self.health.is_ejected(e.id, now=now)]
        if kept or not endpoints:
            return kept
        return [min(endpoints, key=lambda e: self.health.ejected_until(e.id))]


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> HealthyFilter:
    return HealthyFilter(name=name, health=ctx.state.health)
