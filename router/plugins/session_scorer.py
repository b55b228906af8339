"""Scorer + observer: keep a conversation on the endpoint that served its previous turn.

Input: `RoutingRequest.session_key` (a session header such as `x-session-id`, or the OpenAI `user`
field, as the gateway sets it). Formula: score_e = 1 if e served this session last, else 0;
requests without a session key score 0 everywhere (no effect). State: session -> endpoint, an LRU
of at most `maxSessions` entries (default 100,000), local to this gateway replica (prefix affinity
covers the shared case: a conversation's history is its own prefix).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from fleetgate.core.types import Endpoint, Usage
from fleetgate.router.plugins.base import CycleState, PluginContext, param
from fleetgate.router.types import RoutingRequest


class SessionAffinityScorer:
    def __init__(self, *, name: str, max_sessions: int = 100_000) -> None:
        if max_sessions <= 0:
            raise ValueError("maxSessions must be positive")
        self.name = name
        self.max_sessions = max_sessions
        self._last: OrderedDict[str, str] = OrderedDict()

    def score(self, req: RoutingRequest, cycle: CycleState, endpoints: Sequence[Endpoint]) -> list[float]:
        target = self._last.get(req.session_key) if req.session_key else None
        return [1.0 if e.id == target else 0.0 for e in endpoints]

    def on_start(self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint) -> None:
        if not req.session_key:
            return
        self._last[req.session_key] = endpoint.id
        self._last.move_to_end(req.session_key)
        while len(self._last) > self.max_sessions:
            self._last.popitem(last=False)

    def on_complete(
        self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint, *, ok: bool, usage: Usage | None
    ) -> None:
        return None


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> SessionAffinityScorer:
    return SessionAffinityScorer(name=name, max_sessions=param(parameters, "maxSessions", 100_000, int))
