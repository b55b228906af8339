"""The set of pluggable stages one gateway app runs with (built by `fleetgate.gateway.wiring`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from fleetgate.cache.types import ResponseCache
from fleetgate.gateway.discovery import EndpointSource
from fleetgate.gateway.stages import Accountant, Authenticator, Limiter
from fleetgate.router.tiers.types import TierResolver
from fleetgate.router.types import Scheduler


@dataclass(slots=True)
class Stages:
    scheduler: Scheduler
    cache: ResponseCache
    tiers: TierResolver
    auth: Authenticator
    limiter: Limiter
    accountant: Accountant
    endpoint_source: EndpointSource

    def unique(self) -> Iterator[Any]:
        """Each stage object once (one object may implement several stages)."""
        seen: set[int] = set()
        for stage in (
            self.endpoint_source, self.scheduler, self.cache, self.tiers, self.auth, self.limiter, self.accountant
        ):
            if id(stage) not in seen:
                seen.add(id(stage))
                yield stage
