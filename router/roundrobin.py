"""Round-robin over the candidates: the naive baseline and the gateway's minimal default."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from fleetgate.core.errors import UpstreamUnavailableError
from fleetgate.core.types import Endpoint, Usage
from fleetgate.router.types import Decision, RoutingRequest


class RoundRobinScheduler:
    def __init__(self) -> None:
        self._counter = itertools.count()

    async def pick(self, req: RoutingRequest, candidates: Sequence[Endpoint]) -> Decision:
        if not candidates:
            raise UpstreamUnavailableError(f"no endpoint serves model {req.model!r}")
        start = next(self._counter) % len(candidates)
        ordered = list(candidates[start:]) + list(candidates[:start])
        return Decision(endpoint=ordered[0], fallbacks=ordered[1:2], profile="round-robin")

    def on_start(self, req: RoutingRequest, endpoint: Endpoint) -> None:
        return None

    def on_first_token(self, req: RoutingRequest, endpoint: Endpoint) -> None:
        return None

    def on_complete(self, req: RoutingRequest, endpoint: Endpoint, *, ok: bool, usage: Usage | None) -> None:
        return None

    def on_connect_error(self, endpoint: Endpoint) -> None:
        return None
