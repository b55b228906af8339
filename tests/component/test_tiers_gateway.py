"""Tier routing through the real gateway (`settings.tiers` -> `build_tiers`) in front of fake engines.

The cache is off, so no embedding reaches the tier router; `embedding: reuse_only` makes the shipped
structural scorer decide (the MiniLM path is covered in test_tiers_minilm.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from fleetgate.core.localredis import free_port
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.router.tiers.features import scoring_text
from fleetgate.router.tiers.scorer import ScorerArtifact, TierScorer
from fleetgate.sim.fake_engine import FakeEngine

from .conftest import RunningGateway

EASY = "Hi! How are you today?"
HARD = (
    "Design a multi-region, strongly consistent key-value store: explain step by step how you would handle "
    "leader election, network partitions and clock skew, analyze the trade-offs, and prove that reads are "
    "linearizable under your design."
)
SMALL = {"name": "small", "model": "m-small", "input_usd_per_mtok": 0.1, "output_usd_per_mtok": 0.4}
LARGE = {"name": "large", "model": "m-large", "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 4.0}

Start = Callable[..., Awaitable[Any]]


def chat(model: str, text: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 3, **extra}


def settings(small_url: str, large_url: str, aliases: dict[str, Any]) -> GatewaySettings:
    return GatewaySettings.model_validate(
        {
            "server": {"auth": "open"},
            "models": [{"name": "m-small", "endpoints": [small_url]}, {"name": "m-large", "endpoints": [large_url]}],
            "tiers": {"aliases": aliases, "embedding": "reuse_only"},
        }
    )


async def engines(start_engine: Start) -> tuple[FakeEngine, FakeEngine]:
    return await start_engine(model="m-small"), await start_engine(model="m-large")


def expected_tier(text: str) -> str:
    artifact = ScorerArtifact.load()
    score = TierScorer(artifact=artifact).score(scoring_text(text), embedding=None)
    return "large" if score.value >= artifact.structural.threshold else "small"


def test_the_example_prompts_fall_on_both_sides_of_the_threshold() -> None:
    assert (expected_tier(EASY), expected_tier(HARD)) == ("small", "large")


@pytest.mark.parametrize("stream", [False, True])
async def test_alias_routes_by_score_and_says_which_model_and_tier(
    start_engine: Start, start_gateway: Start, stream: bool
) -> None:
    small, large = await engines(start_engine)
    gw: RunningGateway = await start_gateway(settings(small.url, large.url, {"auto": {"tiers": [SMALL, LARGE]}}))
    async with httpx.AsyncClient(base_url=gw.url) as client:
        easy = await client.post("/v1/chat/completions", json=chat("auto", EASY, stream=stream))
        hard = await client.post("/v1/chat/completions", json=chat("auto", HARD, stream=stream))
    assert easy.status_code == hard.status_code == 200
    assert (easy.headers["x-fleetgate-model"], easy.headers["x-fleetgate-tier"]) == ("m-small", "small")
    assert (hard.headers["x-fleetgate-model"], hard.headers["x-fleetgate-tier"]) == ("m-large", "large")
    if not stream:
        assert (easy.json()["model"], hard.json()["model"]) == ("m-small", "m-large")
    else:
        assert '"model":"m-small"' in easy.text.replace(" ", "")
    assert [r.body["model"] for r in small.received] == ["m-small"]
    assert [r.body["model"] for r in large.received] == ["m-large"]


async def test_explicit_names_bypass_tiering_and_unknown_names_get_404(
    start_engine: Start, start_gateway: Start
) -> None:
    small, large = await engines(start_engine)
    gw = await start_gateway(settings(small.url, large.url, {"auto": {"tiers": [SMALL, LARGE]}}))
    async with httpx.AsyncClient(base_url=gw.url) as client:
        explicit = await client.post("/v1/chat/completions", json=chat("m-small", HARD))
        unknown = await client.post("/v1/chat/completions", json=chat("autoo", EASY))
        models = await client.get("/v1/models")
    assert explicit.status_code == 200 and explicit.json()["model"] == "m-small"
    assert "x-fleetgate-tier" not in explicit.headers
    assert unknown.status_code == 404
    message = unknown.json()["error"]["message"]
    assert all(name in message for name in ("auto", "m-small", "m-large"))
    assert {"auto", "m-small", "m-large"} <= {m["id"] for m in models.json()["data"]}


async def test_cascade_escalates_a_cut_off_cheap_answer(start_engine: Start, start_gateway: Start) -> None:
    # The fake engine always stops for length: with `on_length` the cheap answer escalates, without it it serves.
    small, large = await engines(start_engine)
    aliases = {
        "cascade": {"tiers": [SMALL, LARGE], "route": "cheapest", "cascade": {"enabled": True}},
        "lenient": {"tiers": [SMALL, LARGE], "route": "cheapest", "cascade": {"enabled": True, "on_length": False}},
    }
    gw = await start_gateway(settings(small.url, large.url, aliases))
    async with httpx.AsyncClient(base_url=gw.url) as client:
        escalated = await client.post("/v1/chat/completions", json=chat("cascade", EASY))
        assert (len(small.received), len(large.received)) == (1, 1)
        kept = await client.post("/v1/chat/completions", json=chat("lenient", EASY))
    assert escalated.status_code == 200
    assert escalated.json()["model"] == "m-large" and escalated.headers["x-fleetgate-tier"] == "large"
    assert len(escalated.json()["choices"]) == 1  # the client sees one answer
    assert kept.json()["model"] == "m-small" and kept.headers["x-fleetgate-tier"] == "small"
    assert (len(small.received), len(large.received)) == (2, 1)
    text = await _metrics(gw)
    assert 'fleetgate_cascade_escalations_total{' in text
    assert 'fleetgate_tier_escalation_checks_total{alias="cascade",outcome="length"} 1.0' in text
    assert 'fleetgate_tier_decisions_total{alias="lenient",reason="cheapest",tier="small"} 1.0' in text


async def _metrics(gw: RunningGateway) -> str:
    async with httpx.AsyncClient(base_url=gw.url) as client:
        return (await client.get(gw.metrics_url)).text


@pytest.mark.parametrize("cheap_endpoints", ["dead", "none"])
async def test_fallback_to_the_next_tier_when_the_cheap_tier_has_no_endpoint(
    start_engine: Start, start_gateway: Start, cheap_endpoints: str
) -> None:
    large = await start_engine(model="m-large")
    dead = f"http://127.0.0.1:{free_port()}"
    cfg = settings(dead, large.url, {"auto": {"tiers": [SMALL, LARGE]}})
    if cheap_endpoints == "none":
        cfg.models[0].endpoints = []
    gw = await start_gateway(cfg)
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post("/v1/chat/completions", json=chat("auto", EASY))
    assert r.status_code == 200
    assert (r.json()["model"], r.headers["x-fleetgate-tier"]) == ("m-large", "large")
    assert len(large.received) == 1


async def test_no_fallback_policy_reports_the_cheap_tier_unavailable(start_engine: Start, start_gateway: Start) -> None:
    large = await start_engine(model="m-large")
    dead = f"http://127.0.0.1:{free_port()}"
    gw = await start_gateway(settings(dead, large.url, {"auto": {"tiers": [SMALL, LARGE], "fallback": "none"}}))
    async with httpx.AsyncClient(base_url=gw.url) as client:
        r = await client.post("/v1/chat/completions", json=chat("auto", EASY))
    assert r.status_code == 503
    assert len(large.received) == 0


@pytest.mark.parametrize(("embedder", "shared"), [("minilm", True), ("hashing", False)])
def test_the_tier_router_shares_the_cache_minilm_model(embedder: str, shared: bool) -> None:
    from prometheus_client import CollectorRegistry

    from fleetgate.core.kvstore import MemoryKVStore
    from fleetgate.gateway.wiring import build_stages
    from fleetgate.router.tiers.resolver import TieredResolver

    cfg = GatewaySettings.model_validate(
        {"cache": {"enabled": True, "semantic": {"embedder": embedder}}, "tiers": {"aliases": {"auto": {
            "tiers": [SMALL, LARGE]}}}}
    )
    stages = build_stages(cfg, registry=CollectorRegistry(), kvstore=MemoryKVStore())
    assert isinstance(stages.tiers, TieredResolver)
    cache_embedder = getattr(stages.cache, "embedder", None)
    assert cache_embedder is not None
    assert (stages.tiers._embedder is cache_embedder) is shared  # a 256-d hashing vector is no MiniLM
