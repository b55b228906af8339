"""`charsPerToken: auto`: the per-model estimator, how the scheduler feeds it from engine usage, and the scorers that
follow it (the prefix index's capacity, the prefill queue's token estimate), plus its gauge."""

from __future__ import annotations

import random

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fleetgate.core.types import Endpoint, Usage
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import RoutingConfig, preset
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.hashing import chained_block_hashes
from fleetgate.router.plugins import prefill_queue_scorer, prefix_scorer
from fleetgate.router.plugins.base import PluginContext
from fleetgate.router.token_ratio import CharsPerToken, chars_per_token_param
from fleetgate.router.types import RoutingRequest
from fleetgate.sim.engine import SimEngine
from fleetgate.sim.profile import SimProfile

EP = Endpoint(id="e", url="http://e", model="m")


def feed(est: CharsPerToken, ratio: float, n: int, *, model: str = "m", tokens: int = 500) -> None:
    for _ in range(n):
        est.observe(model, round(tokens * ratio), tokens)


# ---- the estimator ------------------------------------------------------------------------------------------------

def test_the_fallback_stands_until_enough_requests_were_seen() -> None:
    est = CharsPerToken(min_samples=20)
    feed(est, 6.5, 19)
    assert est.get("m", 4.0) == 4.0 and est.learned() == {}
    feed(est, 6.5, 1)
    assert est.get("m", 4.0) == pytest.approx(6.5)
    assert est.get("other", 4.0) == 4.0  # one estimate per model


def test_it_converges_on_a_noisy_stream_weighing_long_prompts_more() -> None:
    rng = random.Random(7)
    est = CharsPerToken()
    chars = tokens = 0
    for _ in range(2_000):
        t = rng.randint(16, 4_000)
        c = round(t * rng.uniform(5.5, 7.5))
        est.observe("m", c, t)
        chars, tokens = chars + c, tokens + t
    assert est.get("m", 4.0) == pytest.approx(chars / tokens, rel=0.03) == pytest.approx(6.5, rel=0.03)


def test_old_requests_decay_with_a_half_life_counted_in_requests() -> None:
    est = CharsPerToken(half_life=200)
    feed(est, 4.0, 1_000)
    feed(est, 8.0, 200)  # one half-life of the new text: the old weighs as much as the new
    assert est.get("m", 1.0) == pytest.approx((4 + 8) / 2, rel=0.02)
    feed(est, 8.0, 1_400)  # seven more: the old weighs 1/256
    assert est.get("m", 1.0) == pytest.approx(8.0, rel=0.01)


def test_it_is_clamped_and_ignores_short_prompts() -> None:
    est = CharsPerToken(min_samples=1, min_tokens=16)
    feed(est, 40.0, 5)
    assert est.get("m", 4.0) == 16.0
    feed(est, 0.2, 5_000, model="n")
    assert est.get("n", 4.0) == 1.0
    est.observe("s", 10_000, 15)  # under 16 tokens: mostly template, ignored
    est.observe("s", 0, 500)  # nothing routed by text
    assert est.samples("s") == 0 and est.get("s", 4.0) == 4.0


def test_one_hostile_prompt_does_not_carry_the_models_ratio() -> None:
    est = CharsPerToken()
    feed(est, 6.5, 200, tokens=1_000)
    est.observe("m", 1_000_000, 2_000)  # a megabyte of whitespace counted as 2,000 tokens: 500 chars a token
    assert abs(est.get("m", 4.0) - 6.5) < 0.3  # unclamped per request it jumped to 13.3
    feed(est, 6.5, 50, tokens=1_000)
    assert abs(est.get("m", 4.0) - 6.5) < 0.2


def test_the_parameter_is_auto_or_a_positive_number() -> None:
    assert chars_per_token_param("auto", int) is None
    assert chars_per_token_param(6, int) == 6 and chars_per_token_param("6.5", float) == 6.5
    for bad in (0, -1, "six", True, None, [4]):
        with pytest.raises(ValueError, match="charsPerToken"):
            chars_per_token_param(bad, float)


# ---- the scheduler feeds it from engine usage, and exports it -----------------------------------------------------

def completed(sched, text: str, usage: Usage | None, *, model: str = "m") -> None:  # type: ignore[no-untyped-def]
    req = RoutingRequest(request_id="r", model=model, prompt_text=text)
    sched.on_start(req, EP)
    sched.on_complete(req, EP, ok=True, usage=usage)


async def test_the_scheduler_learns_from_engine_usage_only_and_exports_the_gauge() -> None:
    registry = CollectorRegistry()
    sched = build_scheduler(RoutingConfig(), scrape=False, registry=registry)
    text = "y" * 650
    for _ in range(30):
        completed(sched, text, None)  # no usage (a connect failure)
        completed(sched, text, Usage(prompt_tokens=200, completion_tokens=5, estimated=True))  # the gateway's guess
    assert sched.state.chars_per_token.learned() == {}
    assert "fleetgate_router_chars_per_token{" not in generate_latest(registry).decode()
    for _ in range(20):
        completed(sched, text, Usage(prompt_tokens=100, completion_tokens=5))
    assert sched.state.chars_per_token.get("m", 4.0) == pytest.approx(6.5)
    assert 'fleetgate_router_chars_per_token{model="m"} 6.5' in generate_latest(registry).decode()


def test_an_estimated_usage_stays_estimated_when_summed() -> None:
    assert (Usage(1, 2) + Usage(3, 4, estimated=True)).estimated
    assert not (Usage(1, 2) + Usage(3, 4)).estimated
    assert Usage(1, 2, estimated=True) == Usage(1, 2)  # a charge compares by its counts


# ---- the prefix index's capacity follows the learned ratio --------------------------------------------------------

BLOCK_CHARS = 512


def group_prompt(group: int, tokens: int, chars_per_token: float) -> str:
    return f"group {group:02d} " + "lorem ipsum " * int(tokens * chars_per_token / 12)


def first_prompt_held(parameters: dict[str, object], learned: float | None) -> tuple[int, int, int, int]:
    """Five 800-token prompts of different prefixes at 6.48 characters per token, through one simulated engine of
    4,096 tokens and the prefix scorer built with `parameters` (its capacity scraped from the engine); `learned`:
    the ratio the scheduler learned before. Returns the first prompt's KV blocks, those the engine still holds, its
    router blocks and those the scorer's index still matches."""
    profile = SimProfile(block_size=16, chars_per_token=6.48, num_blocks=256, max_num_seqs=8,
                         max_batched_tokens=4096, scheduler="vllm-v1")
    engine = SimEngine(profile=profile)
    state = FleetState()
    state.update(EP.id, waiting=0, running=0, kv_usage=0, kv_capacity_tokens=profile.capacity_tokens)
    if learned is not None:
        feed(state.chars_per_token, learned, 20)
    scorer = prefix_scorer.build(name="prefix", parameters=parameters, ctx=PluginContext(state=state))
    prompts = [group_prompt(g, 800, 6.48) for g in range(5)]
    for i, prompt in enumerate(prompts):
        engine.add(engine.make_request(request_id=str(i), prompt=prompt, max_tokens=1, now=0.0))
        req = RoutingRequest(request_id=str(i), model="m", prompt_text=prompt)
        scorer.on_start(req, {}, EP)
        while (step := engine.plan_step()) is not None:
            engine.finish_step(step, now=0.0)
    first = engine.make_request(request_id="again", prompt=prompts[0], max_tokens=1, now=0.0)
    router_hashes = chained_block_hashes(prompts[0], block_chars=BLOCK_CHARS)
    return (len(first.block_hashes), engine.kv.match(first.block_hashes), len(router_hashes),
            scorer.index.match(EP.id, router_hashes))


def test_at_auto_the_index_keeps_what_the_engine_holds_and_at_a_fixed_4_it_forgets() -> None:
    blocks, cached, router_blocks, matched = first_prompt_held({}, learned=6.48)
    assert cached == blocks >= 49 and router_blocks > 0
    assert matched == router_blocks  # auto, learned 6.48: the index believes what the engine holds
    _, cached4, _, matched4 = first_prompt_held({"charsPerToken": 4}, learned=6.48)
    assert cached4 == blocks and matched4 == 0  # fixed at 4: sized for 0.62 of it, the first prompt is forgotten
    _, _, _, unlearned = first_prompt_held({}, learned=None)
    assert unlearned == 0  # auto before 20 requests: the fallback 4, as before


def test_capacity_moves_only_past_5_percent_and_a_shrink_evicts_to_the_new_bound() -> None:
    state = FleetState()
    state.update(EP.id, waiting=0, running=0, kv_usage=0, kv_capacity_tokens=51_200)
    scorer = prefix_scorer.build(name="prefix", parameters={}, ctx=PluginContext(state=state))
    rng = random.Random(1)
    sent: list[list[int]] = []  # each prompt's 8 router blocks

    def send(n: int) -> None:
        for i in range(n):
            text = "".join(rng.choice("abcdefgh") for _ in range(BLOCK_CHARS * 8))
            scorer.on_start(RoutingRequest(request_id=str(i), model="m", prompt_text=text), {}, EP)
            sent.append(chained_block_hashes(text, block_chars=BLOCK_CHARS))

    send(1)
    assert scorer.index.capacity(EP.id) == 51_200 * 4 // BLOCK_CHARS == 400  # the fallback
    feed(state.chars_per_token, 8.0, 20)
    send(60)
    assert scorer.index.capacity(EP.id) == 800 and scorer.index.size(EP.id) == 61 * 8
    feed(state.chars_per_token, 7.7, 400)  # -3.75%: not worth a resize
    send(1)
    assert state.chars_per_token.get("m", 4) < 7.75 and scorer.index.capacity(EP.id) == 800
    feed(state.chars_per_token, 5.0, 2_000)  # text of 5: the index shrinks to 500 blocks, oldest tails first
    send(1)
    assert scorer.index.capacity(EP.id) == 500 and scorer.index.size(EP.id) == 500  # of 63 x 8 blocks sent
    matched = [scorer.index.match(EP.id, hashes) for hashes in sent]
    assert matched[-62:] == [8] * 62 and matched[0] == 4  # the oldest prompt lost its 4 deepest blocks


def test_a_model_not_learned_yet_on_the_same_engine_does_not_shrink_its_index() -> None:
    state = FleetState()
    state.update(EP.id, waiting=0, running=0, kv_usage=0, kv_capacity_tokens=51_200)
    scorer = prefix_scorer.build(name="prefix", parameters={}, ctx=PluginContext(state=state))
    feed(state.chars_per_token, 8.0, 20)  # the base model: 800 blocks
    rng = random.Random(2)
    for i in range(120):  # the base model and a new adapter's name (no usage seen yet) in turn
        text = "".join(rng.choice("abcdefgh") for _ in range(BLOCK_CHARS * 8))
        model = "m" if i % 2 == 0 else "m-adapter"
        scorer.on_start(RoutingRequest(request_id=str(i), model=model, prompt_text=text), {}, EP)
        assert scorer.index.capacity(EP.id) == 800, i  # at the fallback 4 it flipped to 400, evicting half
    assert scorer.index.size(EP.id) == 800


def test_an_unscraped_engine_gets_the_default_capacity_at_the_learned_ratio() -> None:
    state = FleetState()
    scorer = prefix_scorer.build(name="prefix", parameters={"defaultCapacityTokens": 10_240},
                                 ctx=PluginContext(state=state))
    feed(state.chars_per_token, 6.5, 20)
    scorer.on_start(RoutingRequest(request_id="r", model="m", prompt_text="z" * 2_000), {}, EP)
    assert scorer.index.capacity(EP.id) == int(10_240 * 6.5 // BLOCK_CHARS)
    fixed = prefix_scorer.build(name="prefix", parameters={"charsPerToken": 4, "defaultCapacityTokens": 10_240},
                                ctx=PluginContext(state=state))
    fixed.on_start(RoutingRequest(request_id="r", model="m", prompt_text="z" * 2_000), {}, EP)
    assert fixed.index.capacity(EP.id) == 10_240 * 4 // BLOCK_CHARS


# ---- the prefill queue's token estimate ---------------------------------------------------------------------------

def test_the_prefill_queue_estimates_tokens_at_the_learned_ratio() -> None:
    state = FleetState()
    auto = prefill_queue_scorer.build(name="q", parameters={}, ctx=PluginContext(state=state))
    fixed = prefill_queue_scorer.build(name="q4", parameters={"charsPerToken": 4}, ctx=PluginContext(state=state))
    req = RoutingRequest(request_id="r", model="m", prompt_text="x" * 6_500)
    auto.on_start(req, {}, EP)
    assert auto.queued == {"e": pytest.approx(6_500 / 4)}  # the fallback until learned
    auto.on_complete(req, {}, EP, ok=True, usage=None)
    feed(state.chars_per_token, 6.5, 20)
    auto.on_start(req, {}, EP)
    fixed.on_start(req, {}, EP)
    assert auto.queued == {"e": pytest.approx(1_000)} and fixed.queued == {"e": pytest.approx(6_500 / 4)}


def test_the_shipped_default_and_the_precise_fallback_are_auto() -> None:
    sched = build_scheduler(RoutingConfig(), scrape=False)
    plugins = {type(s).__name__: s for s, _ in sched.profile.scorers}
    assert plugins["PrefixAffinityScorer"].chars_per_token is None
    assert plugins["PrefillQueueScorer"].chars_per_token is None
    precise = build_scheduler(preset("precise-prefix"), scrape=False)
    scorers = {s.name: s for s, _ in precise.profile.scorers}
    assert scorers["prefix"].approx.chars_per_token is None  # type: ignore[attr-defined]  # the fallback index
    assert scorers["history"].chars_per_token is None  # type: ignore[attr-defined]


def test_the_gpu_ab_profile_is_the_shipped_default_with_4_fixed() -> None:
    from pathlib import Path

    from fleetgate.core.config import load_model

    cpt4 = load_model(RoutingConfig, Path(__file__).parents[2] / "scripts/gpu/profiles/default-cpt4.yaml")
    expected = RoutingConfig().model_copy(deep=True)
    for plugin in expected.plugins:
        if plugin.type in ("prefix-affinity-scorer", "prefill-queue-scorer"):
            plugin.parameters["charsPerToken"] = 4
    assert cpt4 == expected
    sched = build_scheduler(cpt4, scrape=False)
    assert {s.name: getattr(s, "chars_per_token", None) for s, _ in sched.profile.scorers
            if s.name in ("prefix", "prefill")} == {"prefix": 4, "prefill": 4.0}
