"""The gateway with the `precise-prefix` profile in front of two fake engines that publish their prefix caches as
vLLM KV events over ZMQ: a prompt goes where its prefix really is (even where the gateway never sent it), and an
engine whose events stop is routed on the approximate index again."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import aiohttp
import pytest

from fleetgate.gateway.settings import GatewaySettings
from fleetgate.router.config import precise_prefix_config
from fleetgate.router.hashing import token_block_hashes
from fleetgate.router.kv_fleet import KvEventFleet
from fleetgate.router.plugins.precise_prefix_scorer import PrecisePrefixScorer
from fleetgate.sim.fake_engine import FakeEngine
from fleetgate.sim.fake_kv_cache import word_tokens

from .conftest import RunningGateway, eventually

BS = 4


@pytest.fixture
def sockdir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kvgw", dir="/tmp"))  # ipc paths must stay short
    yield path
    shutil.rmtree(path, ignore_errors=True)


def words(tag: str, n: int) -> str:
    return " ".join(f"{tag}{i}" for i in range(n))


async def complete(session: aiohttp.ClientSession, url: str, prompt: str) -> str:
    """POST a completion; returns the endpoint id the gateway chose (its debug header)."""
    async with session.post(f"{url}/v1/completions", json={"model": "m", "prompt": prompt, "max_tokens": 2}) as resp:
        assert resp.status == 200, await resp.text()
        return resp.headers.get("x-fleetgate-endpoint", "")


async def test_requests_follow_the_blocks_the_engines_say_they_hold(
    sockdir: Path, start_engine: Callable[..., Awaitable[FakeEngine]],
    start_gateway: Callable[..., Awaitable[RunningGateway]],
) -> None:
    engines = [await start_engine(model="m", kv_events=f"ipc://{sockdir}/e{i}", kv_replay=f"ipc://{sockdir}/r{i}",
                                  kv_block_size=BS) for i in range(2)]
    settings = GatewaySettings.model_validate({
        "server": {"auth": "open", "debug_headers": True},
        "models": [{"name": "m", "endpoints": [e.url for e in engines],
                    "kv_events": [{"endpoint": e.url, "publisher": e.config.kv_events, "replay": e.config.kv_replay}
                                  for e in engines]}],
        # No load scorers here: the choice must come from the prefix alone (ties are broken at random).
        "routing": precise_prefix_config({"hotspotMargin": None}).model_dump(by_alias=True),
    })
    gw = await start_gateway(settings)
    ids = {e.url.removeprefix("http://"): e for e in engines}
    async with aiohttp.ClientSession() as session:
        fleet = _precise_fleet(gw)  # following discovery from start-up: no request needed to subscribe
        assert await eventually(lambda: all(s.usable() for s in fleet.states.values()) and len(fleet.states) == 2)
        # Warm each engine directly (the gateway's approximate index never sees these).
        for i, engine in enumerate(engines):
            async with session.post(f"{engine.url}/v1/completions",
                                    json={"model": "m", "prompt": words(f"doc{i}-", 40), "max_tokens": 1}) as resp:
                assert resp.status == 200
        for i, engine in enumerate(engines):
            state = fleet.states[engine.url.removeprefix("http://")]
            hashes = token_block_hashes(word_tokens({"prompt": words(f"doc{i}-", 40)}), block_size=BS)
            assert await eventually(lambda s=state, h=hashes: s.blocks.match(h) == 10)
        for round_ in range(4):
            for i, engine in enumerate(engines):
                chosen = await complete(session, gw.url, words(f"doc{i}-", 40) + f" question {round_}")
                assert ids[chosen] is engine, (round_, i, chosen)
        hits = [e.kv_cache.hits for e in engines if e.kv_cache is not None]
        assert min(hits) >= 4 * 40  # every routed request found its 40-token prefix cached

        # Engine 1's publisher goes away: its set is dropped and it is routed on the approximate index.
        assert engines[1].kv_cache is not None
        await engines[1].kv_cache.publisher.stop()
        state1 = fleet.states[engines[1].url.removeprefix("http://")]
        assert await eventually(lambda: not state1.usable())
        await complete(session, gw.url, words("doc1-", 40) + " after the publisher died")
        assert fleet.fallbacks.get("disconnected", 0) >= 1
        async with session.get(gw.metrics_url) as resp:
            metrics = await resp.text()
        assert 'fleetgate_router_precise_prefix_fallbacks_total{reason="disconnected"}' in metrics
        first = engines[0].url.removeprefix("http://")
        assert f'fleetgate_router_kv_events_usable{{endpoint="{first}"}} 1.0' in metrics
        assert "fleetgate_router_tokenize_seconds_count" in metrics


def _precise_fleet(gw: RunningGateway) -> KvEventFleet:
    scheduler = gw.app.state.stages.scheduler
    (plugin,) = [s for s, _ in scheduler.profile.scorers if isinstance(s, PrecisePrefixScorer)]
    fleet: KvEventFleet = plugin.fleet
    return fleet


async def test_engine_tokenizer_asks_tokenize_caches_and_fails_open(
    start_engine: Callable[..., Awaitable[FakeEngine]],
) -> None:
    from fleetgate.core.types import Endpoint
    from fleetgate.router.prompt_tokens import EngineTokenizer
    from fleetgate.router.types import RoutingRequest

    engine = await start_engine(model="m")
    failing = await start_engine(model="m", fail_status=500)
    ep, broken = Endpoint(id="a", url=engine.url, model="m"), Endpoint(id="b", url=failing.url, model="m")
    tok = EngineTokenizer(choose=lambda eps: eps[0], timeout_s=2.0, cache_entries=4)
    body = {"messages": [{"role": "user", "content": "one two three"}], "chat_template_kwargs": {"x": 1},
            "temperature": 0.3}
    req = RoutingRequest(request_id="r", model="m", prompt_text="", kind="chat", body=body)
    tokens = await tok.tokens(req, [ep])
    assert tokens == word_tokens(body)
    await engine.stop()  # a second ask would fail now: the answer must come from the cache
    assert await tok.tokens(req, [ep]) == tokens
    other = RoutingRequest(request_id="r", model="m", prompt_text="", kind="chat",
                           body={"messages": [{"role": "user", "content": "four"}]})
    assert await tok.tokens(other, [ep]) is None  # engine gone: fail open
    assert await tok.tokens(other, [broken]) is None  # HTTP 500 from /tokenize
    assert tok.failures >= 1
    await tok.aclose()
