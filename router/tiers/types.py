"""The tier-resolution contract between the gateway and the tier router."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(slots=True)
class TierDecision:
    model: str  # the concrete model to serve the request
    tier: str | None = None  # tier name, e.g. "small" / "large"; None for explicit models
    alias: str | None = None  # the alias the client asked for, if any
    score: float | None = None  # need for the strong tier in [0, 1]
    reason: str = "explicit"


class TierResolver(Protocol):
    def aliases(self) -> list[str]: ...

    async def resolve(self, requested_model: str, prompt_text: str, *, embedding: Any | None = None) -> TierDecision:
        """Map a requested model or alias to a concrete model. Explicit model names pass through
        (reason "explicit"). Unknown names are the gateway's concern (404 with valid names)."""
        ...


class PassThroughTiers:
    """No aliases: every requested model is served as named."""

    def aliases(self) -> list[str]:
        return []

    async def resolve(self, requested_model: str, prompt_text: str, *, embedding: Any | None = None) -> TierDecision:
        return TierDecision(model=requested_model)
