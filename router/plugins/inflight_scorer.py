"""Scorer: prefer endpoints with less outstanding work, as this gateway counts it.

Input: `FleetState.load(e)` = max(requests this gateway has in flight to e (exact, updated on every
`on_start`/`on_complete`), running + waiting last scraped from e (covers other gateway replicas)).
Formula: inverse min-max over candidates, score_e = (max_l - l_e) / (max_l - min_l), 1 when all
equal. Alone with the max-score picker this is the least-loaded policy. Parameters: none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetgate.core.types import Endpoint
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.plugins.base import CycleState, PluginContext
from fleetgate.router.plugins.load_score import inverse_minmax
from fleetgate.router.types import RoutingRequest


class InflightScorer:
    def __init__(self, *, name: str, state: FleetState) -> None:
        self.name = name
        self.state = state

    def score(self, req: RoutingRequest, cycle: CycleState, endpoints: Sequence[Endpoint]) -> list[float]:
        load = self.state.load
        return inverse_minmax([load(e.id) for e in endpoints])


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> InflightScorer:
    return InflightScorer(name=name, state=ctx.state)
