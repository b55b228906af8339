"""The tier-resolution contract between the gateway and the tier router."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(slots=True)
class TierDecision:
    model: str  # the concrete model to serve the request
    tier: str | None = None  # tier name, e.g. "small" / "large"; None for explicit models
    alias: str | None = None  # the alias the client asked for, if any
    score: float | None = None  # need for the strong tier in [0, 1]
    reason: str = "explicit"
    # Cascade: serve from `model`, and if `TierResolver.should_escalate` says the answer failed,
    # serve again from `escalate_to` (non-streaming requests; both calls are accounted).
    escalate_to: str | None = None
    escalate_tier: str | None = None
    # Fallbacks: (model, tier) pairs to try in order when `model` has no healthy endpoint or is saturated.
    fallbacks: list[tuple[str, str]] = field(default_factory=list)


class TierResolver(Protocol):
    def aliases(self) -> list[str]: ...

    async def resolve(
        self, requested_model: str, prompt_text: str, *, embedding: Any | None = None,
        allowed_models: frozenset[str] | None = None,
    ) -> TierDecision:
        """Map a requested model or alias to a concrete model. Explicit model names pass through
        (reason "explicit"). Unknown names are the gateway's concern (404 with valid names).
        `allowed_models` (passed only for a tenant with a model list): an alias picks among these only,
        and raises `PermissionDeniedError` when none of its tiers is allowed."""
        ...

    def should_escalate(self, response: dict[str, Any]) -> str | None:
        """For a cascade: a reason to escalate the cheap tier's complete response, or None."""
        ...


class PassThroughTiers:
    """No aliases: every requested model is served as named."""

    def aliases(self) -> list[str]:
        return []

    async def resolve(
        self, requested_model: str, prompt_text: str, *, embedding: Any | None = None,
        allowed_models: frozenset[str] | None = None,
    ) -> TierDecision:
        return TierDecision(model=requested_model)

    def should_escalate(self, response: dict[str, Any]) -> str | None:
        return None
