"""The precise prefix scorer's math, its per-endpoint fallback to the approximate index, and staleness."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.core.types import Endpoint, Usage
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import RoutingConfig, precise_prefix_config, preset
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.hashing import root_seed, token_block_hashes
from fleetgate.router.kv_block_index import EndpointBlocks
from fleetgate.router.kv_events import BlockStored, encode_batch
from fleetgate.router.kv_fleet import KvEventFleet
from fleetgate.router.kv_subscriber import EndpointKvState
from fleetgate.router.plugins.base import CycleState
from fleetgate.router.plugins.precise_prefix_scorer import PrecisePrefixScorer
from fleetgate.router.plugins.prefix_scorer import PrefixAffinityScorer
from fleetgate.router.types import RoutingRequest

BS = 16
TOKENS = list(range(5000, 5000 + 10 * BS + 3))  # 10 full blocks
EPS = [Endpoint(id=f"e{i}", url=f"http://127.0.0.1:{9000 + i}", model="m") for i in range(3)]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FakeTokenizer:
    def __init__(self, tokens: list[int] | None) -> None:
        self.result = tokens
        self.calls = 0

    async def tokens(self, req: RoutingRequest, endpoints: Sequence[Endpoint]) -> list[int] | None:
        self.calls += 1
        return self.result

    async def warm(self, timeout_s: float) -> None:
        return None

    async def aclose(self) -> None:
        return None


def held_state(clock: Clock, n_blocks: int, *, lora: str | None = None, seq: int = 0) -> EndpointKvState:
    """A connected, synced endpoint whose engine published the first `n_blocks` blocks of TOKENS."""
    state = EndpointKvState(blocks=EndpointBlocks(), stale_s=5.0, clock=clock)
    state.connected = state.synced = True
    if n_blocks:
        event = BlockStored(block_hashes=tuple(range(1, n_blocks + 1)), parent_block_hash=None,
                            token_ids=tuple(TOKENS[: n_blocks * BS]), block_size=BS, lora_name=lora, medium="GPU",
                            group_idx=0, spec_kind="full_attention")
        state.apply(encode_batch([event]), seq)
    return state


def make(clock: Clock, tokens: list[int] | None = TOKENS, *, margin: float | None = None
         ) -> tuple[PrecisePrefixScorer, FleetState, FakeTokenizer]:
    state = FleetState(clock=clock)
    fleet = KvEventFleet(stale_s=5.0, clock=clock)
    tokenizer = FakeTokenizer(tokens)
    approx = PrefixAffinityScorer(name="prefix.approximate", state=state, block_chars=64, hotspot_margin=None)
    scorer = PrecisePrefixScorer(name="prefix", state=state, fleet=fleet, tokenizer=tokenizer, approx=approx,
                                 hotspot_margin=margin)
    return scorer, state, tokenizer


def request(adapter: str | None = None) -> RoutingRequest:
    return RoutingRequest(request_id="r1", model="m", prompt_text="x" * 700, adapter=adapter, kind="completions",
                          body={"prompt": "ignored by the fake tokenizer"})


async def scored(scorer: PrecisePrefixScorer, req: RoutingRequest | None = None) -> tuple[list[float], CycleState]:
    req = req or request()
    cycle: CycleState = {}
    await scorer.produce(req, cycle, EPS)
    return scorer.score(req, cycle, EPS), cycle


async def test_score_is_the_share_of_blocks_held_over_the_least_cached() -> None:
    clock = Clock()
    scorer, _, _ = make(clock)
    for ep, n in zip(EPS, (8, 3, 0), strict=True):
        scorer.fleet.states[ep.id] = held_state(clock, n)
    scores, cycle = await scored(scorer)
    assert scores == pytest.approx([0.8, 0.3, 0.0])
    assert cycle["precise.used"] == [True, True, True]
    # A prefix every endpoint holds earns nothing: load decides.
    scorer.fleet.states[EPS[1].id] = held_state(clock, 5)
    scorer.fleet.states[EPS[2].id] = held_state(clock, 5)
    scores, _ = await scored(scorer)
    assert scores == pytest.approx([0.3, 0.0, 0.0])


async def test_hot_endpoints_lose_their_preference() -> None:
    clock = Clock()
    scorer, state, _ = make(clock, margin=2.0)
    for ep, n in zip(EPS, (10, 0, 0), strict=True):
        scorer.fleet.states[ep.id] = held_state(clock, n)
    for _ in range(5):  # 5 in flight on the holder: 3 over the margin of 2 -> guard max(0, 1 - 3/2) = 0
        state.started(EPS[0].id)
    scores, _ = await scored(scorer)
    assert scores == [0.0, 0.0, 0.0]
    state.finished(EPS[0].id)
    state.finished(EPS[0].id)  # 3 in flight: 1 over -> 1 - 1/2
    scores, _ = await scored(scorer)
    assert scores[0] == pytest.approx(0.5)


async def test_an_adapters_prompt_matches_only_the_adapters_blocks() -> None:
    clock = Clock()
    scorer, _, _ = make(clock)
    scorer.fleet.states[EPS[0].id] = held_state(clock, 10, lora="sql")
    scorer.fleet.states[EPS[1].id] = held_state(clock, 10)
    scorer.fleet.states[EPS[2].id] = held_state(clock, 0)
    scores, _ = await scored(scorer, request(adapter="sql"))
    assert scores == pytest.approx([1.0, 0.0, 0.0])
    _, cycle = await scored(scorer, request(adapter="sql"))
    assert cycle["precise.hashes"][BS] == token_block_hashes(TOKENS, block_size=BS, seed=root_seed("sql"))


async def test_each_unusable_endpoint_falls_back_to_the_approximate_index() -> None:
    clock = Clock()
    scorer, _, _ = make(clock)
    stale = held_state(clock, 0)
    stale.expect_since = clock.now - 6.0  # stored blocks, published nothing for 6 s > staleS 5
    scorer.fleet.states[EPS[0].id] = held_state(clock, 2)
    scorer.fleet.states[EPS[1].id] = stale
    # EPS[2] has no event address at all.
    req = request()
    scorer.approx.on_start(req, {}, EPS[1])  # the approximate index saw the whole prompt go to e1
    scores, cycle = await scored(scorer, req)
    assert cycle["precise.used"] == [True, False, False]
    assert scores == pytest.approx([0.2, 1.0, 0.0])
    assert scorer.fleet.fallbacks == {"stale": 1, "no-events": 1}
    stale.connected = False
    await scored(scorer, req)
    assert scorer.fleet.fallbacks["disconnected"] == 1


async def test_no_usable_endpoint_means_no_tokenization_and_all_approximate() -> None:
    clock = Clock()
    scorer, _, tokenizer = make(clock)
    syncing = held_state(clock, 4)
    syncing.synced = False
    scorer.fleet.states[EPS[0].id] = syncing
    scores, cycle = await scored(scorer)
    assert tokenizer.calls == 0 and cycle["precise.used"] == [False, False, False]
    assert scores == [0.0, 0.0, 0.0] and scorer.fleet.fallbacks["syncing"] == 1


async def test_a_failed_tokenization_routes_on_the_approximate_index() -> None:
    clock = Clock()
    scorer, _, tokenizer = make(clock, tokens=None)
    scorer.fleet.states[EPS[0].id] = held_state(clock, 10)
    scores, cycle = await scored(scorer)
    assert tokenizer.calls == 1 and cycle["precise.used"] == [False, False, False]
    assert scorer.fleet.fallbacks["tokenize"] == 1
    assert scores == [0.0, 0.0, 0.0]


async def test_silence_after_work_that_must_publish_makes_an_endpoint_stale() -> None:
    clock = Clock()
    scorer, _, _ = make(clock)
    holder = scorer.fleet.states[EPS[0].id] = held_state(clock, 3)
    req = request()
    _, cycle = await scored(scorer, req)
    scorer.on_start(req, cycle, EPS[0])  # it holds 3 of 10 blocks: the engine must store 7 more
    scorer.on_complete(req, cycle, EPS[0], ok=True, usage=Usage(prompt_tokens=163))
    assert holder.expect_since == clock.now and holder.usable()
    clock.now += 5.5
    assert not holder.usable() and holder.reason() == "stale"
    holder.apply(encode_batch([]), 1)  # the publisher speaks again
    assert holder.usable()


async def test_no_expectation_when_an_event_came_or_the_request_failed_or_all_was_cached() -> None:
    clock = Clock()
    scorer, _, _ = make(clock)
    holder = scorer.fleet.states[EPS[0].id] = held_state(clock, 3)
    req = request()
    _, cycle = await scored(scorer, req)
    scorer.on_start(req, cycle, EPS[0])
    holder.apply(encode_batch([]), 1)  # the engine published while the request ran
    scorer.on_complete(req, cycle, EPS[0], ok=True, usage=None)
    assert holder.expect_since is None
    _, cycle = await scored(scorer, req)
    scorer.on_start(req, cycle, EPS[0])
    scorer.on_complete(req, cycle, EPS[0], ok=False, usage=None)
    assert holder.expect_since is None
    full = scorer.fleet.states[EPS[1].id] = held_state(clock, 10)
    _, cycle = await scored(scorer, req)
    scorer.on_start(req, cycle, EPS[1])
    scorer.on_complete(req, cycle, EPS[1], ok=True, usage=None)
    assert full.expect_since is None


def test_the_precise_profile_is_the_default_with_its_prefix_scorer_swapped_and_the_approximate_index_beside() -> None:
    cfg = preset("precise-prefix")
    assert cfg == precise_prefix_config()
    assert cfg.profile().name == "precise-prefix"
    default = RoutingConfig()
    expected: list[tuple[str, str]] = []
    for p in default.plugins:
        if p.name == "prefix":
            expected += [("prefix-affinity-scorer", "history"), ("precise-prefix-scorer", "prefix")]
        else:
            expected.append((p.type, p.name))
    assert [(p.type, p.name) for p in cfg.plugins] == expected
    refs = [(r.plugin_ref, r.weight) for r in cfg.profile().plugins]
    default_refs = [(r.plugin_ref, r.weight) for r in default.profile().plugins]
    at = default_refs.index(("prefix", 2.0))
    assert refs == [*default_refs[:at], ("history", 1.0), *default_refs[at:]]
    sched = build_scheduler(cfg, scrape=False)
    names = [s.name for s, _ in sched.profile.scorers]
    # the approximate scorer runs first, so the cached shares the queued-prefill scorer reads are the precise ones
    assert names.index("history") < names.index("prefix") < names.index("prefill")
    prefix, weight = next((s, w) for s, w in sched.profile.scorers if s.name == "prefix")
    history, history_weight = next((s, w) for s, w in sched.profile.scorers if s.name == "history")
    assert isinstance(prefix, PrecisePrefixScorer) and weight == 2.0
    assert isinstance(history, PrefixAffinityScorer) and history_weight == 1.0
    assert prefix in sched.profile.startables and prefix in sched.profile.closables


@pytest.mark.parametrize("preset_name", ["precise-prefix", "precise-only"])
async def test_prompt_groups_stay_where_they_were_sent_while_the_engines_show_them_nowhere(preset_name: str) -> None:
    """Past saturation the engines evict shared prompts: every engine's event set is cold for a group whose
    earlier request the gateway sent to one of them. With load even, the preset's approximate index (`history`)
    sends the group's next request back there, every time; the precise scorer alone sees a tie and lets the
    picker split the groups across engines, each of which then recomputes and holds the prompt (more prefill:
    runs 7b and 8a-8d in docs/reports/gpu-routing.md)."""
    cfg = precise_prefix_config({"hotspotMargin": None})
    if preset_name == "precise-only":
        profile = cfg.profile()
        cfg = RoutingConfig(plugins=[p for p in cfg.plugins if p.name != "history"], scheduling_profiles=[
            profile.model_copy(update={"plugins": [r for r in profile.plugins if r.plugin_ref != "history"]})])
    clock = Clock()
    sched = build_scheduler(cfg, scrape=False, clock=clock, seed=1)
    precise = next(s for s, _ in sched.profile.scorers if isinstance(s, PrecisePrefixScorer))
    precise.tokenizer = FakeTokenizer(TOKENS)
    eps = EPS[:2]
    for ep in eps:
        precise.fleet.states[ep.id] = held_state(clock, 0)  # connected, synced, holding nothing (evicted)
    stayed = 0
    for group in range(20):
        system = f"group {group} system prompt. " * 40
        first = RoutingRequest(request_id=f"g{group}a", model="m", prompt_text=system + "first question",
                               kind="completions", body={"prompt": "x"})
        went = (await sched.pick(first, eps)).endpoint
        sched.on_start(first, went)
        sched.on_complete(first, went, ok=True, usage=None)  # done: both engines idle again
        second = RoutingRequest(request_id=f"g{group}b", model="m", prompt_text=system + "second question",
                                kind="completions", body={"prompt": "x"})
        decision = await sched.pick(second, eps)
        stayed += decision.endpoint.id == went.id
    if preset_name == "precise-prefix":
        assert stayed == 20
    else:
        assert 3 <= stayed <= 17  # a coin per group (seeded): the groups split across the engines


@pytest.mark.parametrize("params, message", [
    ({"tokenizer": "psychic"}, "engine or local"),
    ({"tokenizer": "local"}, "tokenizerPaths"),
    ({"tokenizer": "local", "tokenizerPaths": {"*": "/m"}, "tokenizeSegmentCacheMiB": -1}, "tokenizeSegmentCacheMiB"),
    ({"tokenizer": "local", "tokenizerPaths": {"*": "/m"}, "tokenizeThreadMinChars": -1}, "tokenizeThreadMinChars"),
    ({"tokenizer": "local", "tokenizerPaths": {"*": "/m"}, "tokenizeThreadMinChars": "many"}, "tokenizeThreadMinChars"),
    ({"kvGroup": -1}, "kvGroup"),
    ({"port": 70000}, "port"),
    ({"staleS": 0}, "staleS"),
    ({"eventCoalesceS": -0.1}, "eventCoalesceS"),
    ({"eventCoalesceS": 2}, "eventCoalesceS"),
    ({"topic": 5}, "topic"),
])
def test_bad_parameters_are_config_errors_naming_them(params: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_scheduler(precise_prefix_config(params), scrape=False)


class _HfLike:
    """Stands in for a transformers tokenizer: renders a template, then one token per character."""

    def apply_chat_template(self, messages: list[dict[str, str]], **kwargs: object) -> str:
        assert kwargs["tokenize"] is False and kwargs["add_generation_prompt"] is True
        return "".join(f"<{m['role']}>{m['content']}" for m in messages)

    def __call__(self, text: str, add_special_tokens: bool) -> dict[str, list[int]]:
        return {"input_ids": ([1] if add_special_tokens else []) + [ord(c) for c in text]}


async def test_the_local_tokenizer_never_makes_a_request_wait_for_it_to_load(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio
    import threading

    from fleetgate.router import prompt_tokens

    release = threading.Event()

    def slow_load(path: str) -> _HfLike:
        assert path == "/models/m"
        release.wait(5)
        return _HfLike()

    monkeypatch.setattr(prompt_tokens, "_load_tokenizer", slow_load)
    tok = prompt_tokens.LocalTokenizer(paths={"m": "/models/m"})
    req = RoutingRequest(request_id="r", model="m", prompt_text="", kind="chat",
                         body={"messages": [{"role": "user", "content": "hi"}]})
    tok.preload()
    assert await tok.tokens(req, EPS) is None  # still loading: route approximately now, not in seconds
    release.set()
    for _ in range(200):
        if tok.loaded("m"):
            break
        await asyncio.sleep(0.01)
    assert await tok.tokens(req, EPS) == [ord(c) for c in "<user>hi"]
    completion = RoutingRequest(request_id="r", model="m", prompt_text="", kind="completions", body={"prompt": "ab"})
    assert await tok.tokens(completion, EPS) == [1, 97, 98]
    ids = RoutingRequest(request_id="r", model="m", prompt_text="", kind="completions", body={"prompt": [5, 6]})
    assert await tok.tokens(ids, EPS) == [5, 6]  # token ids given: no tokenizer at all
    batch = RoutingRequest(request_id="r", model="m", prompt_text="", kind="completions", body={"prompt": ["a", "b"]})
    assert await tok.tokens(batch, EPS) is None
    other = RoutingRequest(request_id="r", model="unknown", prompt_text="", kind="completions", body={"prompt": "x"})
    assert await tok.tokens(other, EPS) is None
    anyone = prompt_tokens.LocalTokenizer(paths={"*": "/models/m"})  # one tokenizer for every model
    anyone.preload()
    for _ in range(200):
        if anyone.loaded("whatever"):
            break
        await asyncio.sleep(0.01)
    assert await anyone.tokens(other, EPS) == [1, ord("x")]


async def test_warm_waits_for_the_tokenizer_and_gives_up_at_its_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    import threading

    from fleetgate.router import prompt_tokens

    release = threading.Event()

    def slow_load(path: str) -> _HfLike:
        release.wait(5)
        return _HfLike()

    monkeypatch.setattr(prompt_tokens, "_load_tokenizer", slow_load)
    req = RoutingRequest(request_id="r", model="m", prompt_text="", kind="completions", body={"prompt": "ab"})
    late = prompt_tokens.LocalTokenizer(paths={"m": "/models/m"})
    await late.warm(0.05)  # start-up does not hang on a tokenizer that takes too long
    assert not late.loaded("m") and await late.tokens(req, EPS) is None
    release.set()
    ready = prompt_tokens.LocalTokenizer(paths={"m": "/models/m"})
    await ready.warm(5.0)  # the gateway reports ready only after this: no load while traffic flows
    assert ready.loaded("m") and await ready.tokens(req, EPS) == [1, 97, 98]
    await late.aclose()


async def test_a_tokenizer_that_cannot_load_is_not_retried_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from fleetgate.router import prompt_tokens

    calls = []

    def broken(path: str) -> None:
        calls.append(path)
        raise OSError("no tokenizer.json")

    monkeypatch.setattr(prompt_tokens, "_load_tokenizer", broken)
    tok = prompt_tokens.LocalTokenizer(paths={"m": "/nowhere"})
    req = RoutingRequest(request_id="r", model="m", prompt_text="", kind="completions", body={"prompt": "x"})
    for _ in range(50):
        assert await tok.tokens(req, EPS) is None
        await asyncio.sleep(0.01)
    assert calls == ["/nowhere"] and not tok.loaded("m")


def test_event_addresses_come_from_labels_else_the_template() -> None:
    labelled = Endpoint(id="a", url="http://10.0.0.1:8000", model="m", labels={
        "kv_events": "ipc:///run/e.kv", "kv_events_replay": "ipc:///run/e.replay", "kv_events_topic": "t"})
    plain = Endpoint(id="b", url="http://10.0.0.2:8000", model="m")
    v6 = Endpoint(id="c", url="http://[fd00::7]:8000", model="m")
    none = KvEventFleet()
    assert none.source_of(plain) is None
    source = none.source_of(labelled)
    assert source is not None and (source.publisher, source.replay, source.topic) == (
        "ipc:///run/e.kv", "ipc:///run/e.replay", "t")
    templated = KvEventFleet(port=5557, replay_port=5558, topic="kv")
    s = templated.source_of(plain)
    assert s is not None and (s.publisher, s.replay, s.topic) == ("tcp://10.0.0.2:5557", "tcp://10.0.0.2:5558", "kv")
    s6 = templated.source_of(v6)
    assert s6 is not None and s6.publisher == "tcp://[fd00::7]:5557"
    assert templated.source_of(labelled) == source  # discovery's address wins over the template


async def test_endpoints_that_leave_discovery_are_unfollowed() -> None:
    fleet = KvEventFleet(port=5557)
    eps = [Endpoint(id=f"e{i}", url=f"http://127.0.0.1:{9100 + i}", model="m") for i in range(2)]
    fleet.ensure(eps)  # nothing listens on those ports: the subscribers just wait, disconnected
    assert set(fleet.states) == {"e0", "e1"} and not any(s.usable() for s in fleet.states.values())
    await fleet.retain({"e1"})
    assert set(fleet.states) == {"e1"}
    await fleet.aclose()
    assert fleet.states == {}


async def test_a_labelled_listing_is_followed_even_after_an_unlabelled_one() -> None:
    """One engine listed under two routes (the model's, with its event address, and a probe route without): the
    order requests arrive in must not decide whether it is followed."""
    fleet = KvEventFleet()
    bare = Endpoint(id="e0", url="http://127.0.0.1:9200", model="m")
    labelled = Endpoint(id="e0", url="http://127.0.0.1:9200", model="m", labels={"kv_events": "tcp://127.0.0.1:9201"})
    fleet.ensure([bare])
    assert fleet.state("e0") is None
    fleet.ensure([labelled])
    first = fleet.state("e0")
    assert first is not None
    fleet.ensure([bare, labelled])
    assert fleet.state("e0") is first  # followed once
    await fleet.aclose()



async def test_the_presets_two_approximate_indexes_hash_a_prompt_once_and_never_share_unlike_blocks(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`history` and the precise scorer's embedded fallback are both approximate indexes: with the same blocks a
    decision hashes the prompt once (the hot path), with different `blockChars` each index keeps its own blocks."""
    from fleetgate.router.plugins import prefix_scorer

    calls: list[int] = []
    real = prefix_scorer.chained_block_hashes

    def counted(text: str, *, block_chars: int, max_blocks: int) -> list[int]:
        calls.append(block_chars)
        return real(text, block_chars=block_chars, max_blocks=max_blocks)

    monkeypatch.setattr(prefix_scorer, "chained_block_hashes", counted)
    req = RoutingRequest(request_id="h", model="m", prompt_text="shared system prompt. " * 80 + "question",
                         kind="completions", body={"prompt": "x"})
    for params, expected in (({}, [512]), ({"blockChars": 256}, [512, 256])):
        calls.clear()
        sched = build_scheduler(precise_prefix_config(params), scrape=False, seed=1)
        precise = next(s for s, _ in sched.profile.scorers if isinstance(s, PrecisePrefixScorer))
        precise.tokenizer = FakeTokenizer(None)  # no tokens: every endpoint scored on the approximate index
        decision = await sched.pick(req, EPS[:2])
        sched.on_start(req, decision.endpoint)
        assert sorted(calls) == sorted(expected), params
        history = next(s for s, _ in sched.profile.scorers if isinstance(s, PrefixAffinityScorer))
        assert history.index.match(decision.endpoint.id, real(req.prompt_text, block_chars=512, max_blocks=1024)) > 0
        assert precise.approx.index.match(
            decision.endpoint.id, real(req.prompt_text, block_chars=params.get("blockChars", 512), max_blocks=1024)) > 0
