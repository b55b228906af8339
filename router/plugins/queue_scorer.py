"""Scorer: prefer endpoints with short engine queues (`vllm:num_requests_waiting`, scraped).

Input: the last scraped waiting count per endpoint (sees load from every gateway replica, but is up
to one scrape interval old). Formula: inverse min-max over candidates, score_e = 1 - (w_e - min_w) / span,
span = max(max_w - min_w, relativeSpan x max_w), 1 when all equal (`load_score.inverse_minmax`).
Parameters: relativeSpan (0, as the inflight scorer's).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fleetgate.core.types import Endpoint
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.plugins.base import CycleState, PluginContext, param
from fleetgate.router.plugins.load_score import inverse_minmax
from fleetgate.router.types import RoutingRequest


class QueueDepthScorer:
    def __init__(self, *, name: str, state: FleetState, relative_span: float = 0.0) -> None:
        if relative_span < 0:
            raise ValueError("relativeSpan must be >= 0")
        self.name = name
        self.state = state
        self.relative_span = relative_span

    def score(self, req: RoutingRequest, cycle: CycleState, endpoints: Sequence[Endpoint]) -> list[float]:
        stats = self.state.stats
        return inverse_minmax([stats[e.id].waiting if e.id in stats else 0.0 for e in endpoints], self.relative_span)


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> QueueDepthScorer:
    return QueueDepthScorer(name=name, state=ctx.state, relative_span=param(parameters, "relativeSpan", 0.0, float))
