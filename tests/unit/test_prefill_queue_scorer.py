"""The queued-prefill scorer: what it counts, when an entry leaves, and that the scheduler wires it up."""

from __future__ import annotations

import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.core.types import Endpoint
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import RoutingConfig
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.plugins.base import CACHED_SHARE, PROMPT_TOKENS
from fleetgate.router.plugins.prefill_queue_scorer import PrefillQueueScorer
from fleetgate.router.scheduler import PluginScheduler
from fleetgate.router.types import RoutingRequest

EPS = [Endpoint(id=f"e{i}", url=f"http://e{i}", model="m") for i in range(2)]


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def req(rid: str, chars: int) -> RoutingRequest:
    return RoutingRequest(request_id=rid, model="m", prompt_text="x" * chars)


def scorer(clock: Clock | None = None, **kw: object) -> PrefillQueueScorer:
    return PrefillQueueScorer(name="prefill", state=FleetState(clock=clock or Clock()), **kw)  # type: ignore[arg-type]


def test_a_queued_long_prompt_is_a_full_vote_and_a_short_one_a_small_vote() -> None:
    s = scorer(include_own=False)
    assert s.score(req("a", 100), {}, EPS) == [1.0, 1.0]
    s.on_start(req("long", 8_192 * 4), {}, EPS[0])  # 8,192 tokens at 4 chars per token
    assert s.score(req("b", 100), {}, EPS) == [0.0, 1.0]
    s2 = scorer(include_own=False)
    s2.on_start(req("short", 512 * 4), {}, EPS[0])  # 512 tokens: a quarter of the 2,048-token scale
    assert s2.score(req("b", 100), {}, EPS) == pytest.approx([0.75, 1.0])


def test_the_entry_leaves_at_the_first_token_not_at_completion() -> None:
    s = scorer(include_own=False)
    r = req("r", 4_000)
    s.on_start(r, {}, EPS[1])
    assert s.queued == {"e1": 1_000.0}
    s.on_first_token(r, {}, EPS[1])
    assert s.queued == {}
    s.on_complete(r, {}, EPS[1], ok=True, usage=None)  # nothing left to drop: no double subtraction
    assert s.queued == {}
    assert s.score(req("n", 100), {}, EPS) == [1.0, 1.0]


def test_completion_without_a_first_token_and_a_retry_elsewhere_both_clear_the_entry() -> None:
    s = scorer(include_own=False)
    r = req("r", 4_000)
    s.on_start(r, {}, EPS[0])
    s.on_start(r, {}, EPS[1])  # connect failure, retried on the fallback: the first try never ran
    assert s.queued == {"e1": 1_000.0}
    s.on_complete(r, {}, EPS[1], ok=False, usage=None)
    assert s.queued == {}


def test_entries_whose_first_token_never_comes_expire() -> None:
    clock = Clock()
    s = scorer(clock, include_own=False, max_pending_s=30.0)
    s.on_start(req("old", 4_000), {}, EPS[0])
    clock.t += 20
    s.on_start(req("new", 4_000), {}, EPS[0])
    clock.t += 15  # "old" is 35 s old, "new" 15 s
    assert s.score(req("n", 100), {}, EPS) == pytest.approx([1.0 - 1_000 / 2_048, 1.0])
    assert s.queued == {"e0": 1_000.0}


def test_only_uncached_tokens_are_queued_and_a_counted_prompt_beats_the_estimate() -> None:
    s = scorer(include_own=False)
    cycle = {CACHED_SHARE: {"e0": 0.75, "e1": 0.0}, PROMPT_TOKENS: 2_000}
    s.on_start(req("hit", 40), cycle, EPS[0])  # the text is short, but the tokenizer counted 2,000 tokens
    assert s.queued == {"e0": 500.0}


def test_own_uncached_tokens_make_a_cache_hit_worth_waiting_behind_less_than_its_size() -> None:
    s = scorer()  # includeOwn on: W_e = queued at e + this request's uncached tokens at e
    s.on_start(req("other", 4 * 1_500), {}, EPS[0])  # 1,500 tokens of someone else's prefill queued at e0
    hit_at_e0 = {CACHED_SHARE: {"e0": 0.9, "e1": 0.0}}
    # 2,000-token prompt: e0 = 1,500 + 200 = 1,700; e1 = 2,000 -> e0 wins
    assert s.score(req("q", 8_000), dict(hit_at_e0), EPS) == pytest.approx([1.0, 1.0 - 300 / 2_048])
    s.on_start(req("more", 4 * 1_000), {}, EPS[0])  # e0 = 2,500 + 200 = 2,700 > e1 = 2,000 -> e1 wins
    assert s.score(req("q", 8_000), dict(hit_at_e0), EPS) == pytest.approx([1.0 - 700 / 2_048, 1.0])


def test_a_hot_endpoints_cache_stops_counting_past_the_hotspot_margin() -> None:
    s = scorer(hotspot_margin=2.0)
    for _ in range(4):  # e0 carries 4 more requests than e1: its cached share is faded out entirely
        s.state.started("e0")
    cycle = {CACHED_SHARE: {"e0": 1.0, "e1": 0.0}}
    assert s.score(req("q", 8_000), cycle, EPS) == [1.0, 1.0]  # both would prefill the whole prompt


@pytest.mark.parametrize(("parameters", "named"), [
    ({"scaleTokens": 0}, "scaleTokens"), ({"hotspotMargin": 0}, "hotspotMargin"), ({"warmShare": 1.5}, "warmShare"),
    ({"warmShare": 0}, "warmShare"), ({"includeOwn": "false"}, "includeOwn")])
def test_bad_parameters_are_config_errors(parameters: dict[str, object], named: str) -> None:
    cfg = RoutingConfig.model_validate({
        "plugins": [{"type": "prefill-queue-scorer", "name": "p", "parameters": parameters},
                    {"type": "max-score-picker", "name": "pick"}],
        "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "p"}, {"pluginRef": "pick"}]}],
    })
    with pytest.raises(ConfigError, match=named):
        build_scheduler(cfg, scrape=False)


def prefill_scheduler() -> tuple[PluginScheduler, PrefillQueueScorer]:
    """A scheduler of the queued-prefill scorer alone, and that scorer."""
    cfg = RoutingConfig.model_validate({
        "plugins": [{"type": "prefill-queue-scorer", "name": "prefill"}, {"type": "max-score-picker", "name": "pick"}],
        "schedulingProfiles": [{"name": "default", "plugins": [{"pluginRef": "prefill"}, {"pluginRef": "pick"}]}],
    })
    sched = build_scheduler(cfg, scrape=False, seed=1)
    [plugin] = sched.profile.first_token
    assert isinstance(plugin, PrefillQueueScorer)
    return sched, plugin


async def test_the_scheduler_reports_first_tokens_to_the_scorer() -> None:
    sched, plugin = prefill_scheduler()
    first = req("first", 8_000)
    decision = await sched.pick(first, EPS)
    sched.on_start(first, decision.endpoint)
    second = await sched.pick(req("second", 8_000), EPS)
    assert second.endpoint != decision.endpoint  # the first's 2,000 prefill tokens are queued there
    sched.on_first_token(first, decision.endpoint)
    assert plugin.queued == {}
    sched.on_complete(first, decision.endpoint, ok=True, usage=None)
    sched.on_first_token(first, decision.endpoint)  # late or repeated: the cycle is gone, nothing happens
    assert plugin.queued == {}


def test_with_warm_share_it_abstains_for_a_prompt_someone_holds_and_places_cold_ones() -> None:
    s = scorer(warm_share=0.5)
    s.on_start(req("other", 4 * 3_000), {}, EPS[0])
    warm = {CACHED_SHARE: {"e0": 0.6, "e1": 0.0}}
    assert s.score(req("q", 8_000), warm, EPS) == [1.0, 1.0]  # prefix affinity decides
    cold = {CACHED_SHARE: {"e0": 0.1, "e1": 0.0}}
    assert s.score(req("q", 8_000), cold, EPS)[0] < s.score(req("q", 8_000), cold, EPS)[1]


async def test_requests_that_reuse_one_client_request_id_keep_their_own_state() -> None:
    """A tenant that sends every request with one `x-request-id` must not move another request's state: each
    request's cycle and queued-prefill entry are its own (`RoutingRequest.key`), whatever id the client gave."""
    sched, plugin = prefill_scheduler()
    victim, hostile = req("same-id", 8_000), req("same-id", 4_000)
    sched.on_start(victim, (await sched.pick(victim, EPS)).endpoint)
    sched.on_start(hostile, (await sched.pick(hostile, EPS)).endpoint)
    assert sorted(plugin.queued.values()) == [1_000.0, 2_000.0]  # both queued, neither replaced the other
    sched.on_complete(hostile, EPS[1], ok=False, usage=None)  # the hostile one leaves at once
    assert list(plugin.queued.values()) == [2_000.0]  # the victim's prefill is still counted where it waits
    s = scorer(include_own=False)
    s.on_start(req("x", 4_000), {}, EPS[0])
    s.on_first_token(req("x", 4_000), {}, EPS[0])  # another request with the same client id: not this one's token
    assert s.queued == {"e0": 1_000.0}


async def test_a_retry_after_a_failed_call_starts_with_what_the_pick_computed() -> None:
    """The gateway's connect-failure retry (`Forwarder.open`) and the picker's (`Exchange._retarget`): on_start on
    the pick, on_complete(ok=False) and on_connect_error there, on_start on the fallback with the same request.
    The fallback holds the prompt's prefix: only its uncached tail is queued there, as on a first try."""
    sched = build_scheduler(RoutingConfig(), scrape=False, seed=1)
    (plugin,) = sched.profile.first_token
    assert isinstance(plugin, PrefillQueueScorer)
    prompt = " ".join(f"word-{i}" for i in range(2_000))  # ~16 KB, ~4,000 estimated tokens
    for i, endpoint in enumerate(EPS):  # both hold the prefix
        warm = RoutingRequest(request_id=f"warm{i}", model="m", prompt_text=prompt)
        sched.on_start(warm, endpoint)
        sched.on_complete(warm, endpoint, ok=True, usage=None)
    retried = RoutingRequest(request_id="r", model="m", prompt_text=prompt + " and a question")
    decision = await sched.pick(retried, EPS)
    sched.on_start(retried, decision.endpoint)
    first_try = plugin.queued.get(decision.endpoint.id, 0.0)
    assert first_try < 500
    sched.on_complete(retried, decision.endpoint, ok=False, usage=None)
    sched.on_connect_error(decision.endpoint)
    (fallback,) = decision.fallbacks
    sched.on_start(retried, fallback)
    assert plugin.queued.get(fallback.id, 0.0) == pytest.approx(first_try, abs=50)
    sched.on_complete(retried, fallback, ok=True, usage=None)
    assert plugin.queued == {} and sched.state.inflight == {}
