"""`TieredResolver` and `build_tiers`: alias vs explicit names, thresholds, cascades, fallbacks, embeddings."""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.router.tiers.build import build_tiers
from fleetgate.router.tiers.config import TierConfig
from fleetgate.router.tiers.embedding import EMBEDDING_DIM
from fleetgate.router.tiers.features import STRUCTURAL_FEATURES, normalize_embedding
from fleetgate.router.tiers.resolver import TieredResolver, fallback_order
from fleetgate.router.tiers.scorer import ScorerArtifact, TierScorer
from fleetgate.router.tiers.types import PassThroughTiers

SMALL = {"name": "small", "model": "m-small", "relative_cost": 1.0}
MID = {"name": "mid", "model": "m-mid", "relative_cost": 3.0}
LARGE = {"name": "large", "model": "m-large", "relative_cost": 10.0}
ARTIFACT = ScorerArtifact.load()
W = ARTIFACT.full.weights[len(STRUCTURAL_FEATURES) :]


def unit(v: np.ndarray) -> np.ndarray:
    out = normalize_embedding(v)
    assert out is not None
    return out


TOWARD_LARGE, TOWARD_SMALL = unit(W), unit(-W)


class RecordingEmbedder:
    """Returns a fixed vector and records the thread it ran on (must not be the event loop's)."""

    def __init__(self, vector: np.ndarray, *, fail: bool = False) -> None:
        self.vector, self.fail = vector, fail
        self.threads: list[int] = []
        self.texts: list[str] = []

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        self.threads.append(threading.get_ident())
        self.texts.extend(texts)
        if self.fail:
            raise RuntimeError("model files missing")
        return np.vstack([self.vector for _ in texts])


def resolver(alias: dict[str, Any], *, embedder: Any = None, **cfg: Any) -> TieredResolver:
    config = TierConfig.model_validate({"aliases": {"auto": alias}, **cfg})
    return TieredResolver(config=config, scorer=TierScorer(artifact=ARTIFACT), embedder=embedder)


async def test_explicit_model_names_pass_through() -> None:
    r = resolver({"tiers": [SMALL, LARGE]})
    decision = await r.resolve("m-large", "Prove Fermat's last theorem.")
    assert (decision.model, decision.tier, decision.reason, decision.score) == ("m-large", None, "explicit", None)
    unknown = await r.resolve("no-such-model", "hi")
    assert unknown.model == "no-such-model" and unknown.reason == "explicit"
    assert r.aliases() == ["auto"] and r.models() == ["m-small", "m-large"]


async def test_alias_follows_the_score_and_the_calibrated_threshold() -> None:
    r = resolver({"tiers": [SMALL, LARGE]})
    hard = await r.resolve("auto", "Tell me.", embedding=TOWARD_LARGE)
    easy = await r.resolve("auto", "Tell me.", embedding=TOWARD_SMALL)
    assert (hard.model, hard.tier, hard.alias, hard.reason) == ("m-large", "large", "auto", "score")
    assert (easy.model, easy.tier) == ("m-small", "small")
    assert hard.score is not None and easy.score is not None
    assert hard.score >= ARTIFACT.full.threshold > easy.score


async def test_configured_threshold_overrides_the_artifact() -> None:
    embedding = TOWARD_LARGE
    score = TierScorer(artifact=ARTIFACT).score("Tell me.", embedding=embedding).value
    assert 0.0 < score < 1.0
    # Half-way to 1 and to 0: just above and below the score, however confident the shipped model is.
    above = resolver({"tiers": [SMALL, LARGE], "threshold": score + (1.0 - score) / 2})
    below = resolver({"tiers": [SMALL, LARGE], "threshold": score / 2})
    assert (await above.resolve("auto", "Tell me.", embedding=embedding)).tier == "small"
    assert (await below.resolve("auto", "Tell me.", embedding=embedding)).tier == "large"


async def test_three_tiers_split_by_cut_points() -> None:
    r = resolver({"tiers": [SMALL, MID, LARGE], "thresholds": [0.3, 0.7]})
    scorer = TierScorer(artifact=ARTIFACT)
    for emb in (TOWARD_LARGE, TOWARD_SMALL, unit(W + np.random.default_rng(0).normal(size=EMBEDDING_DIM) * 0.2)):
        s = scorer.score("Explain this.", embedding=emb).value
        expected = "small" if s < 0.3 else "mid" if s < 0.7 else "large"
        assert (await r.resolve("auto", "Explain this.", embedding=emb)).tier == expected


async def test_cache_embedding_is_reused_and_none_is_computed_off_the_loop() -> None:
    embedder = RecordingEmbedder(TOWARD_LARGE)
    r = resolver({"tiers": [SMALL, LARGE]}, embedder=embedder)
    reused = await r.resolve("auto", "Tell me.", embedding=TOWARD_SMALL)
    assert reused.tier == "small" and embedder.threads == []
    computed = await r.resolve("auto", "Tell me.")
    assert computed.tier == "large" and computed.reason == "score"
    assert embedder.threads and embedder.threads[0] != threading.get_ident()
    wrong_size = await r.resolve("auto", "Tell me.", embedding=np.ones(768))  # another model's vector
    assert wrong_size.reason == "score" and len(embedder.threads) == 2


async def test_reuse_only_and_embedding_failure_use_the_structural_model() -> None:
    embedder = RecordingEmbedder(TOWARD_LARGE)
    only = resolver({"tiers": [SMALL, LARGE]}, embedder=embedder, embedding="reuse_only")
    d = await only.resolve("auto", "What is the capital of France?")
    assert d.reason == "score-structural" and embedder.threads == []
    failing = RecordingEmbedder(TOWARD_LARGE, fail=True)
    broken = resolver({"tiers": [SMALL, LARGE]}, embedder=failing)
    d2 = await broken.resolve("auto", "What is the capital of France?")
    assert d2.reason == "score-structural" and d2.score == d.score
    await broken.resolve("auto", "Another prompt.")
    assert len(failing.threads) == 1  # not retried after a failure


async def test_route_modes_and_single_tier() -> None:
    assert (await resolver({"tiers": [SMALL, LARGE], "route": "cheapest"}).resolve("auto", "x")).tier == "small"
    assert (await resolver({"tiers": [SMALL, LARGE], "route": "strongest"}).resolve("auto", "x")).tier == "large"
    single = await resolver({"tiers": [LARGE]}).resolve("auto", "x")
    assert (single.tier, single.reason, single.fallbacks, single.escalate_to) == ("large", "single-tier", [], None)


async def test_cascade_names_the_next_stronger_tier_only_when_enabled() -> None:
    on = resolver({"tiers": [SMALL, MID, LARGE], "route": "cheapest", "cascade": {"enabled": True}})
    d = await on.resolve("auto", "x")
    assert (d.model, d.escalate_to, d.escalate_tier) == ("m-small", "m-mid", "mid")
    top = await resolver({"tiers": [SMALL, LARGE], "route": "strongest", "cascade": {"enabled": True}}).resolve(
        "auto", "x"
    )
    assert top.escalate_to is None
    off = await resolver({"tiers": [SMALL, LARGE], "route": "cheapest"}).resolve("auto", "x")
    assert off.escalate_to is None


def test_fallback_orders() -> None:
    tiers = TierConfig.model_validate(
        {"aliases": {"a": {"tiers": [SMALL, MID, LARGE], "thresholds": [0.3, 0.6]}}}
    ).aliases["a"].tiers
    assert fallback_order(tiers=tiers, chosen=1, policy="stronger_then_weaker") == [
        ("m-large", "large"), ("m-small", "small"),
    ]
    assert fallback_order(tiers=tiers, chosen=1, policy="stronger") == [("m-large", "large")]
    assert fallback_order(tiers=tiers, chosen=0, policy="none") == []
    assert fallback_order(tiers=tiers, chosen=2, policy="stronger_then_weaker") == [
        ("m-mid", "mid"), ("m-small", "small"),
    ]


async def test_decision_carries_the_fallbacks() -> None:
    d = await resolver({"tiers": [SMALL, LARGE], "route": "cheapest"}).resolve("auto", "x")
    assert d.fallbacks == [("m-large", "large")]


def test_should_escalate_uses_the_alias_cascade() -> None:
    r = resolver({"tiers": [SMALL, LARGE], "cascade": {"enabled": True}})
    cut = {"model": "m-small", "choices": [{"finish_reason": "length", "message": {"content": "partial"}}]}
    good = {"model": "m-small", "choices": [{"finish_reason": "stop", "message": {"content": "Paris."}}]}
    assert r.should_escalate(cut) == "length"
    assert r.should_escalate(good) is None
    assert r.should_escalate({**cut, "model": "m-large"}) is None  # nothing above the strongest tier
    off = resolver({"tiers": [SMALL, LARGE]})
    assert off.should_escalate(cut) is None


async def test_should_escalate_with_the_decision() -> None:
    r = resolver({"tiers": [SMALL, LARGE], "route": "cheapest", "cascade": {"enabled": True}})
    decision = await r.resolve("auto", "x")
    refused = {"model": "served-name", "choices": [{"finish_reason": "stop", "message": {"content": "I can't."}}]}
    assert r.should_escalate(refused, decision=decision) == "refusal"
    assert r.should_escalate(refused) == "refusal"  # the alias resolved earlier in this task
    # Outside the resolving task only the served model can find the alias, and "served-name" is no tier.
    assert contextvars.Context().run(r.should_escalate, refused) is None


def test_build_tiers(tmp_path: Path) -> None:
    assert isinstance(build_tiers(None), PassThroughTiers)
    assert isinstance(build_tiers({"aliases": {}}), PassThroughTiers)
    built = build_tiers({"aliases": {"auto": {"tiers": [SMALL, LARGE]}}}, embedder=RecordingEmbedder(TOWARD_LARGE))
    assert built.aliases() == ["auto"]
    with pytest.raises(ConfigError, match="does not exist"):
        build_tiers({"aliases": {"auto": {"tiers": [SMALL, LARGE]}}, "scorer_path": str(tmp_path / "none.json")})
    # No scorer needed: a pure cascade loads no artifact.
    cascade = build_tiers(
        {"aliases": {"auto": {"tiers": [SMALL, LARGE], "route": "cheapest"}}, "scorer_path": str(tmp_path / "x")}
    )
    assert cascade.aliases() == ["auto"]


async def test_chat_prompts_are_scored_on_the_last_user_turn() -> None:
    embedder = RecordingEmbedder(TOWARD_SMALL)
    r = resolver({"tiers": [SMALL, LARGE]}, embedder=embedder)
    chat = "<|system|>You are terse.\n<|user|>Prove it.\n<|assistant|>No.\n<|user|>What is 2+2?\n"
    d = await r.resolve("auto", chat)
    alone = await r.resolve("auto", "What is 2+2?")
    assert embedder.texts == ["What is 2+2?", "What is 2+2?"]
    assert d.score == alone.score


async def test_should_escalate_follows_the_alias_resolved_in_the_same_task() -> None:
    """Two aliases cascade from one model with different settings: the request's own alias decides."""
    r = TieredResolver(
        config=TierConfig.model_validate({"aliases": {
            "strict": {"tiers": [SMALL, LARGE], "route": "cheapest", "cascade": {"enabled": True}},
            "lenient": {"tiers": [SMALL, LARGE], "route": "cheapest", "cascade": {"enabled": True, "on_length": False}},
        }}),
        scorer=None,
    )
    cut = {"model": "m-small", "choices": [{"finish_reason": "length", "message": {"content": "partial"}}]}

    async def serve(alias: str) -> str | None:
        await r.resolve(alias, "x")
        await asyncio.sleep(0)
        return r.should_escalate(cut)

    strict, lenient = await asyncio.gather(serve("strict"), serve("lenient"))
    assert (strict, lenient) == ("length", None)
    await r.resolve("m-small", "x")  # an explicit name: no cascade for this request
    assert r.should_escalate(cut) is None


class SlowLoadingEmbedder(RecordingEmbedder):
    def __init__(self, vector: np.ndarray) -> None:
        super().__init__(vector)
        self.release = threading.Event()
        self.loaded = False

    def load(self) -> None:
        assert self.release.wait(10)
        self.loaded = True


async def test_start_warms_the_embedder_without_blocking_and_scores_structurally_meanwhile() -> None:
    embedder = SlowLoadingEmbedder(TOWARD_LARGE)
    r = resolver({"tiers": [SMALL, LARGE]}, embedder=embedder)
    await r.start()  # returns at once although the load is blocked
    during = await r.resolve("auto", "Tell me.")
    assert during.reason == "score-structural" and embedder.threads == []
    embedder.release.set()
    await r.aclose()  # waits for the load thread
    assert embedder.loaded
    after = await r.resolve("auto", "Tell me.")
    assert after.reason == "score" and after.tier == "large"


async def test_metrics_count_decisions_scores_timings_and_cascade_checks() -> None:
    from prometheus_client import CollectorRegistry

    from fleetgate.router.tiers.metrics import TierMetrics

    registry = CollectorRegistry()
    config = TierConfig.model_validate({"aliases": {"auto": {"tiers": [SMALL, LARGE], "cascade": {"enabled": True}}}})
    r = TieredResolver(config=config, scorer=TierScorer(artifact=ARTIFACT), embedder=RecordingEmbedder(TOWARD_LARGE),
                       metrics=TierMetrics(registry))
    await r.resolve("auto", "x", embedding=TOWARD_SMALL)
    await r.resolve("auto", "y")
    r.should_escalate({"model": "m-small", "choices": [{"finish_reason": "length", "message": {"content": "a"}}]})
    await r.resolve("m-large", "z")  # explicit names are not tier decisions

    def value(name: str, **labels: str) -> float:
        v = registry.get_sample_value(name, labels)
        return 0.0 if v is None else v

    assert value("fleetgate_tier_decisions_total", alias="auto", tier="small", reason="score") == 1
    assert value("fleetgate_tier_decisions_total", alias="auto", tier="large", reason="score") == 1
    assert value("fleetgate_tier_decision_seconds_count", alias="auto", embedding="reused") == 1
    assert value("fleetgate_tier_decision_seconds_count", alias="auto", embedding="computed") == 1
    assert value("fleetgate_tier_score_count", alias="auto") == 2
    assert value("fleetgate_tier_score_bucket", alias="auto", le="1.0") == 2
    assert value("fleetgate_tier_escalation_checks_total", alias="auto", outcome="length") == 1
