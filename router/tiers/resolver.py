"""`TieredResolver`: the `TierResolver` that maps an alias to one of its tiers per prompt.

For an alias with `route: scorer`, the prompt's score s (need for the strong tier, `scorer.TierScorer`) picks
tier i = number of cut points <= s (two tiers: s >= threshold -> strong). The cut points are the alias's
configured threshold(s), or the threshold calibrated into the artifact for the model that scored (the full
model when an embedding is available, the structural one otherwise). The embedding is the cache's when it
passed a valid 384-d MiniLM vector; otherwise it is computed off the event loop (`embedding:
reuse_or_compute`) or skipped in favour of the structural-only model (`embedding: reuse_only`, while the model
is still loading after `start()`, or once computing one has failed).
Fallbacks list the other tiers in the alias's fallback order; a cascade names the next stronger tier.
Names that are not aliases pass through unchanged (reason "explicit"). For chat requests the scored text is
the last user turn (`features.scoring_text`), the text the semantic cache embeds.
"""

from __future__ import annotations

import asyncio
import bisect
import contextvars
import logging
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from fleetgate.core.errors import PermissionDeniedError
from fleetgate.router.tiers.config import Alias, Tier, TierConfig
from fleetgate.router.tiers.escalation import compile_refusals, escalation_reason
from fleetgate.router.tiers.features import normalize_embedding, scoring_text
from fleetgate.router.tiers.metrics import TierMetrics
from fleetgate.router.tiers.scorer import Score, TierScorer
from fleetgate.router.tiers.types import TierDecision

log = logging.getLogger(__name__)


class Embedder(Protocol):
    """The semantic cache's embedder protocol: blocking, rows L2-normalised (so one instance can serve both)."""

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


@dataclass(frozen=True, slots=True)
class _AliasPlan:
    name: str
    alias: Alias
    refusals: re.Pattern[str]


def _log_load_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("tier router: loading the embedder failed; prompts use the structural scorer until it loads",
                  exc_info=task.exception())


def fallback_order(*, tiers: list[Tier], chosen: int, policy: str) -> list[tuple[str, str]]:
    """(model, tier) pairs to try after tier `chosen`, per the fallback policy."""
    if policy == "none":
        return []
    order = list(range(chosen + 1, len(tiers)))
    if policy == "stronger_then_weaker":
        order += list(range(chosen - 1, -1, -1))
    return [(tiers[i].model, tiers[i].name) for i in order]


class TieredResolver:
    def __init__(
        self, *, config: TierConfig, scorer: TierScorer | None, embedder: Embedder | None = None,
        metrics: TierMetrics | None = None,
    ) -> None:
        if scorer is None and any(a.route == "scorer" and len(a.tiers) > 1 for a in config.aliases.values()):
            raise ValueError("an alias routes by score, so a scorer is required")
        self._config = config
        self._scorer = scorer
        self._embedder = embedder
        self._warming: asyncio.Task[Any] | None = None
        self._metrics = metrics or TierMetrics()
        self._embedder_broken = False  # set on the first failure (e.g. sentence-transformers not installed)
        self._plans = {
            name: _AliasPlan(name=name, alias=alias, refusals=compile_refusals(alias.cascade.refusal_patterns))
            for name, alias in config.aliases.items()
        }
        # The alias of the request being served, for `should_escalate` later in the same task: the contract's
        # call passes only the response, and two aliases may cascade from one model with different settings.
        self._request_alias: contextvars.ContextVar[str | None] = contextvars.ContextVar(
            f"fleetgate-tier-alias-{id(self)}", default=None
        )
        # Last resort, for a response seen outside the resolving task: the first alias cascading from its model.
        self._by_model: dict[str, _AliasPlan] = {}
        for plan in self._plans.values():
            if plan.alias.cascade.enabled:
                for tier in plan.alias.tiers[:-1]:
                    self._by_model.setdefault(tier.model, plan)

    async def start(self) -> None:
        """Gateway lifespan hook: load the embedder in a thread without holding up start-up, so the first
        prompt that arrives without a cache embedding does not wait for the model."""
        load = getattr(self._embedder, "load", None)
        if load is not None and self._config.embedding == "reuse_or_compute" and self._warming is None:
            self._warming = asyncio.create_task(asyncio.to_thread(load), name="tier-embedder-load")
            self._warming.add_done_callback(_log_load_failure)

    async def aclose(self) -> None:
        if self._warming is not None and not self._warming.done():
            # A thread cannot be interrupted: wait for the load so the process exits cleanly.
            await asyncio.gather(self._warming, return_exceptions=True)

    def aliases(self) -> list[str]:
        return list(self._plans)

    def models(self) -> list[str]:
        """Every concrete model a tier names (for the gateway's list of valid names)."""
        return self._config.models()

    async def resolve(
        self, requested_model: str, prompt_text: str, *, embedding: Any | None = None,
        allowed_models: frozenset[str] | None = None,
    ) -> TierDecision:
        plan = self._plans.get(requested_model)
        self._request_alias.set("" if plan is None else requested_model)  # "": explicit name
        if plan is None:
            return TierDecision(model=requested_model)
        start = time.perf_counter()
        vector: np.ndarray | None = None
        source = "none"
        text = scoring_text(prompt_text)
        if plan.alias.route == "scorer" and len(plan.alias.tiers) > 1:
            vector = normalize_embedding(embedding)
            source = "reused" if vector is not None else "none"
            warming = self._warming is not None and not self._warming.done()
            compute = self._config.embedding == "reuse_or_compute" and not warming and not self._embedder_broken
            if vector is None and compute and self._embedder is not None:
                try:
                    rows = await asyncio.to_thread(self._embedder.embed, [text])
                    vector = normalize_embedding(rows[0])
                    source = "computed"
                except Exception:  # fail open, once: the structural model decides from now on
                    self._embedder_broken = True
                    log.exception("tier router: computing prompt embeddings failed; using the structural scorer")
        decision = self.decide(alias=requested_model, prompt_text=text, embedding=vector,
                               allowed_models=allowed_models)
        m = self._metrics
        m.decision_seconds.labels(requested_model, source).observe(time.perf_counter() - start)
        m.decisions.labels(requested_model, decision.tier or "", decision.reason).inc()
        if decision.score is not None:
            m.scores.labels(requested_model).observe(decision.score)
        return decision

    def decide(
        self, *, alias: str, prompt_text: str, embedding: np.ndarray | None,
        allowed_models: frozenset[str] | None = None,
    ) -> TierDecision:
        """Synchronous decision for an alias, given the text to score and a normalised embedding (or None).
        With `allowed_models`, only tiers serving one of those models are chosen, escalated to or fallen back to:
        a disallowed choice becomes the strongest allowed tier below it, else the weakest allowed above it."""
        plan = self._plans[alias]
        tiers = plan.alias.tiers
        usable = [i for i, t in enumerate(tiers) if allowed_models is None or t.model in allowed_models]
        if not usable:
            raise PermissionDeniedError(f"no tier of alias {alias!r} serves a model this tenant may use",
                                        param="model")
        score: Score | None = None
        if len(tiers) == 1:
            index, reason = 0, "single-tier"
        elif plan.alias.route == "cheapest":
            index, reason = 0, "cheapest"
        elif plan.alias.route == "strongest":
            index, reason = len(tiers) - 1, "strongest"
        else:
            try:
                assert self._scorer is not None  # checked in __init__
                score = self._scorer.score(prompt_text, embedding=embedding)
                cuts = plan.alias.cut_points(default=score.threshold) or []
                index = bisect.bisect_right(cuts, score.value)
                reason = "score" if score.model == "full" else "score-structural"
            except Exception:
                log.exception("tier router: scoring failed for alias %s", alias)
                index = len(tiers) - 1 if self._config.on_scorer_error == "strongest" else 0
                reason = "scorer-error"
        if index not in usable:
            below = [i for i in usable if i < index]
            index = below[-1] if below else usable[0]
            reason += "+allowed"
        tier = tiers[index]
        above = [i for i in usable if i > index]
        escalate = tiers[above[0]] if plan.alias.cascade.enabled and above else None
        return TierDecision(
            model=tier.model,
            tier=tier.name,
            alias=alias,
            score=None if score is None else round(score.value, 6),
            reason=reason,
            escalate_to=escalate.model if escalate else None,
            escalate_tier=escalate.name if escalate else None,
            fallbacks=[(m, name) for m, name in fallback_order(tiers=tiers, chosen=index, policy=plan.alias.fallback)
                       if allowed_models is None or m in allowed_models],
        )

    def should_escalate(self, response: dict[str, Any], *, decision: TierDecision | None = None) -> str | None:
        """A reason to escalate the cheap tier's complete answer, or None. The alias comes from `decision`
        (optional, additive to the contract), else from the `resolve` call earlier in the same task, else from
        the response's `model` field."""
        alias = decision.alias if decision is not None else self._request_alias.get()
        plan = self._plans.get(alias) if alias else None
        if plan is None and decision is None and alias is None:
            plan = self._by_model.get(str(response.get("model", "")))
        if plan is None or not plan.alias.cascade.enabled:
            return None
        reason = escalation_reason(response, cascade=plan.alias.cascade, refusals=plan.refusals)
        self._metrics.escalation_checks.labels(plan.name, reason or "kept").inc()
        return reason
