"""The set of pluggable stages one gateway app runs with (built by `fleetgate.gateway.wiring`)."""

from __future__ import annotations

import logging
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


async def start_stages(stages: Stages, started: list[Any]) -> None:
    """Start every stage that has `start()`, in order; each is appended to `started` once started (or when it
    has nothing to start), so a failure part-way leaves exactly what `stop_stages` must stop."""
    for stage in stages.unique():
        start = getattr(stage, "start", None)
        if start is not None:
            await start()
        started.append(stage)


async def stop_stages(started: list[Any], *, log: logging.Logger) -> None:
    """Close what `start_stages` started, in reverse; a stage that fails to close is logged, the rest still close."""
    for stage in reversed(started):
        close = getattr(stage, "aclose", None)
        if close is not None:
            try:
                await close()
            except Exception:
                log.exception("stopping stage %s failed", type(stage).__name__)
    started.clear()
