"""Tier routing configuration: aliases, their tiers (cheap -> strong), thresholds, cascades and fallbacks.

Example (YAML, under the gateway's `tiers:` key):

    aliases:
      auto:
        tiers:
          - {name: small, model: gemma-3-270m, input_usd_per_mtok: 0.05, output_usd_per_mtok: 0.10}
          - {name: large, model: llama-3.1-70b, input_usd_per_mtok: 0.60, output_usd_per_mtok: 1.80}
        # threshold: 0.5        # default: the calibrated threshold shipped in the scorer artifact
        cascade: {enabled: true, min_mean_logprob: -2.5}
        fallback: stronger_then_weaker
    scorer_path: null           # default: the shipped scorer (router/tiers/scorer.json)
    embedding: reuse_or_compute # or reuse_only: no embedding from the cache -> structural-only scorer
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class Tier(BaseModel):
    """One tier: a concrete model the fleet serves, and its price (list $ per 1M tokens or a relative cost)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1)
    model: str = Field(min_length=1)
    input_usd_per_mtok: float | None = Field(default=None, ge=0)
    output_usd_per_mtok: float | None = Field(default=None, ge=0)
    relative_cost: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one_price_kind(self) -> Tier:
        dollars = self.input_usd_per_mtok is not None or self.output_usd_per_mtok is not None
        if dollars and self.relative_cost is not None:
            raise ValueError("give either $ per 1M tokens or relative_cost, not both")
        return self

    def call_cost(self, *, input_tokens: float, output_tokens: float) -> float | None:
        """Estimated cost of one call in this tier's unit ($ or relative), None if no price is set."""
        if self.relative_cost is not None:
            return self.relative_cost
        if self.input_usd_per_mtok is None and self.output_usd_per_mtok is None:
            return None
        return (
            input_tokens * (self.input_usd_per_mtok or 0.0) + output_tokens * (self.output_usd_per_mtok or 0.0)
        ) / 1e6


class Cascade(BaseModel):
    """Serve from the chosen tier; if its complete answer shows it failed, serve again from the next tier."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    on_length: bool = True  # finish_reason == "length"
    on_empty: bool = True  # no content and no tool calls
    on_refusal: bool = True  # the answer opens with a refusal ("I can't", "I'm not able to", ...)
    refusal_patterns: list[str] = Field(default_factory=list)  # extra regexes, matched at the answer's start
    min_mean_logprob: float | None = Field(default=-2.5, le=0)  # escalate below this mean token log-prob

    @field_validator("refusal_patterns")
    @classmethod
    def _valid_regexes(cls, value: list[str]) -> list[str]:
        import re

        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"refusal pattern {pattern!r} is not a valid regex: {exc}") from exc
        return value


Fallback = Literal["stronger_then_weaker", "stronger", "none"]
Route = Literal["scorer", "cheapest", "strongest"]


class Alias(BaseModel):
    """An alias clients name as `model` (e.g. `auto`), resolved per prompt to one of its tiers."""

    model_config = ConfigDict(extra="forbid")

    tiers: list[Tier] = Field(min_length=1)
    route: Route = "scorer"  # "cheapest" with a cascade enabled is a pure cascade
    threshold: float | None = Field(default=None, gt=0, lt=1)  # two tiers: score >= threshold -> strong
    thresholds: list[float] | None = None  # N tiers: N-1 increasing cut points
    cascade: Cascade = Field(default_factory=Cascade)
    fallback: Fallback = "stronger_then_weaker"

    @model_validator(mode="after")
    def _consistent(self) -> Alias:
        names = [t.name for t in self.tiers]
        models = [t.model for t in self.tiers]
        if len(set(names)) != len(names):
            raise ValueError(f"tier names must be unique, got {names}")
        if len(set(models)) != len(models):
            raise ValueError(f"each tier must name a different model, got {models}")
        if self.threshold is not None and self.thresholds is not None:
            raise ValueError("give threshold (two tiers) or thresholds (N tiers), not both")
        cuts = self.cut_points(default=None)
        if cuts is not None:
            if len(cuts) != len(self.tiers) - 1:
                raise ValueError(f"{len(self.tiers)} tiers need {len(self.tiers) - 1} thresholds, got {len(cuts)}")
            if any(not 0 < c < 1 for c in cuts) or any(b <= a for a, b in itertools.pairwise(cuts)):
                raise ValueError(f"thresholds must be strictly increasing within (0, 1), got {cuts}")
        elif self.route == "scorer" and len(self.tiers) > 2:
            raise ValueError("an alias with more than two tiers needs explicit thresholds")
        return self

    def cut_points(self, *, default: float | None) -> list[float] | None:
        """The score cut points between consecutive tiers (the calibrated `default` for two tiers)."""
        if self.thresholds is not None:
            return list(self.thresholds)
        if self.threshold is not None:
            return [self.threshold]
        if len(self.tiers) == 2 and default is not None:
            return [default]
        if len(self.tiers) == 1:
            return []
        return None


class TierConfig(BaseModel):
    """The `tiers` section of the gateway config."""

    model_config = ConfigDict(extra="forbid")

    aliases: dict[str, Alias] = Field(default_factory=dict)
    scorer_path: Path | None = None  # None: the scorer shipped with FleetGate
    embedding: Literal["reuse_or_compute", "reuse_only"] = "reuse_or_compute"
    on_scorer_error: Literal["strongest", "cheapest"] = "strongest"

    @model_validator(mode="after")
    def _aliases_are_not_models(self) -> TierConfig:
        models = {t.model for a in self.aliases.values() for t in a.tiers}
        clash = sorted(models & set(self.aliases))
        if clash:
            raise ValueError(f"alias names must differ from concrete model names: {clash}")
        if any(not name.strip() for name in self.aliases):
            raise ValueError("alias names must not be empty")
        return self

    def models(self) -> list[str]:
        """Every concrete model named by a tier, in config order, without duplicates."""
        return list(dict.fromkeys(t.model for a in self.aliases.values() for t in a.tiers))
