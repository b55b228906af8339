"""Scorer: prefer endpoints with less outstanding work, as this gateway counts it.

Input: `FleetState.load(e)` = max(requests this gateway has in flight to e (exact, updated on every
`on_start`/`on_complete`), running + waiting last scraped from e (covers other gateway replicas)).
Formula: inverse min-max over candidates, score_e = 1 - (l_e - min_l) / span, span = max(max_l - min_l,
relativeSpan x max_l), 1 when all equal (`load_score.inverse_minmax`). Alone with the max-score picker this is the
least-loaded policy. Parameters: relativeSpan (0: any difference is a full vote; r > 0: a difference small against
the load itself is a small vote, so past saturation a request or two of difference does not outvote prefix
affinity; docs/reports/routing-saturation.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetgate.core.types import Endpoint
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.plugins.base import CycleState, PluginContext, param
from fleetgate.router.plugins.load_score import inverse_minmax
from fleetgate.router.types import RoutingRequest


class InflightScorer:
    def __init__(self, *, name: str, state: FleetState, relative_span: float = 0.0) -> None:
        if relative_span < 0:
            raise ValueError("relativeSpan must be >= 0")
        self.name = name
        self.state = state
        self.relative_span = relative_span

    def score(self, req: RoutingRequest, cycle: CycleState, endpoints: Sequence[Endpoint]) -> list[float]:
        load = self.state.load
        return inverse_minmax([load(e.id) for e in endpoints], self.relative_span)


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> InflightScorer:
    return InflightScorer(name=name, state=ctx.state, relative_span=param(parameters, "relativeSpan", 0.0, float))
