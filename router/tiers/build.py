"""`build_tiers(config)`: the gateway's one entry point to tier routing."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from fleetgate.router.tiers.config import TierConfig
from fleetgate.router.tiers.metrics import TierMetrics
from fleetgate.router.tiers.resolver import Embedder, TieredResolver
from fleetgate.router.tiers.scorer import ScorerArtifact, TierScorer
from fleetgate.router.tiers.types import PassThroughTiers, TierResolver


def build_tiers(
    config: TierConfig | dict[str, Any] | None = None,
    *,
    embedder: Embedder | None = None,
    registry: CollectorRegistry | None = None,
) -> TierResolver:
    """A resolver for `config`; `PassThroughTiers` when no alias is declared.

    The scorer artifact is loaded (and checked) only when an alias routes by score, so a config error is
    raised at start-up. `embedder` defaults to a lazy MiniLM embedder (loaded on the first prompt that
    arrives without a cache embedding) unless `embedding: reuse_only`. Metrics go to `registry` (the app's).
    """
    cfg = TierConfig.model_validate(config) if isinstance(config, dict) else (config or TierConfig())
    if not cfg.aliases:
        return PassThroughTiers()
    needs_scorer = any(a.route == "scorer" and len(a.tiers) > 1 for a in cfg.aliases.values())
    scorer = TierScorer(artifact=ScorerArtifact.load(cfg.scorer_path)) if needs_scorer else None
    if embedder is None and needs_scorer and cfg.embedding == "reuse_or_compute":
        from fleetgate.router.tiers.embedding import MiniLMEmbedder

        embedder = MiniLMEmbedder()
    return TieredResolver(config=cfg, scorer=scorer, embedder=embedder, metrics=TierMetrics(registry))
