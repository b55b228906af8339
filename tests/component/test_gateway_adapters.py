"""LoRA adapters through a real gateway (uvicorn) in front of fake engines with vLLM's runtime LoRA API:
listing, tenants, adapter-affinity routing, loads on demand (single flight, bounded, failing over, a client
that leaves), and the scraper's view of what each engine has loaded."""

from __future__ import annotations

import asyncio
import csv
import io
import time
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from fleetgate.cache.config import CacheConfig, SemanticConfig
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.gateway.discovery import StaticEndpointSource
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.tenancy.keys import new_key
from fleetgate.sim.fake_engine import FakeEngineConfig

from .conftest import RunningGateway, eventually
from .lora_engine import LoraFakeEngine

BASE = "org/base"
FAST_SCRAPE = {"scrape": {"intervalS": 0.05, "timeoutS": 0.5, "healthIntervalS": 0.05}}
KEYS = {name: new_key() for name in ("acme", "globex", "initech")}


def lora_settings(urls: list[str], *, auth: bool = False, **server: Any) -> GatewaySettings:
    data: dict[str, Any] = {
        "server": {"auth": "api_key" if auth else "open", **server},
        "models": [
            {
                "name": "base",
                "served_name": BASE,
                "endpoints": urls,
                "adapters": [
                    {"name": "legal", "source": "/adapters/legal", "rank": 8},
                    {"name": "pirate", "source": "/adapters/pirate", "tenants": ["acme"]},
                    {"name": "chef", "source": "/adapters/chef"},
                ],
            }
        ],
        "routing": FAST_SCRAPE,
    }
    if auth:
        data["tenancy"] = {
            "tenants": [
                {"id": "acme", "key_hashes": [KEYS["acme"][1]], "models": ["base", "legal", "pirate"]},
                {"id": "globex", "key_hashes": [KEYS["globex"][1]], "models": ["base", "pirate"]},
                {"id": "initech", "key_hashes": [KEYS["initech"][1]]},
            ]
        }
    return GatewaySettings.model_validate(data)


def chat(model: str, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3, **extra}


def key(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name][0]}"}


@pytest.fixture
async def start_lora() -> Any:
    engines: list[LoraFakeEngine] = []

    async def start(loaded: set[str] | None = None, **config: Any) -> LoraFakeEngine:
        engine = LoraFakeEngine(FakeEngineConfig(model=BASE, **config), loaded=loaded)
        await engine.start()
        engines.append(engine)
        return engine

    yield start
    for engine in engines:
        await engine.stop()


def loader(gw: RunningGateway) -> Any:
    return gw.pipeline._forwarder.adapters


def fleet(gw: RunningGateway) -> Any:
    return gw.app.state.stages.scheduler.state


async def test_models_lists_adapters_and_requests_keep_the_adapter_name(
    start_lora: Any, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    e1 = await start_lora()
    gw = await start_gateway(lora_settings([e1.url]))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        listed = {m["id"]: m for m in (await c.get("/v1/models")).json()["data"]}
        assert listed["legal"]["parent"] == "base" and listed["chef"]["parent"] == "base"
        assert "parent" not in listed["base"]
        assert "pirate" not in listed  # restricted to acme: even with auth off (tenant `anonymous`)
        r = await c.post("/v1/chat/completions", json=chat("legal"))
        assert r.status_code == 200, r.text
        assert r.json()["model"] == "legal" and r.headers["x-fleetgate-model"] == "legal"
        r = await c.post("/v1/chat/completions", json=chat("base"))
        assert r.status_code == 200 and r.json()["model"] == "base"
        r = await c.post("/v1/chat/completions", json=chat("legal", stream=True))
        assert r.status_code == 200 and '"model":"legal"' in r.text.replace(" ", "")
    # upstream: the adapter by its own name (vLLM picks the LoRA by it), the base by its served name
    assert e1.lora.served == ["legal", BASE, "legal"]
    assert e1.lora.load_calls == 1 and e1.lora.loaded == {"legal"}


async def test_loaded_once_then_affinity_keeps_it_on_that_engine(
    start_lora: Any, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    e1, e2 = await start_lora(), await start_lora()
    gw = await start_gateway(lora_settings([e1.url, e2.url]))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        for _ in range(6):
            assert (await c.post("/v1/chat/completions", json=chat("legal"))).status_code == 200
    assert e1.lora.load_calls + e2.lora.load_calls == 1
    holder = e1 if e1.lora.loaded else e2
    assert holder.lora.served == ["legal"] * 6


async def test_a_burst_makes_one_load_per_engine(
    start_lora: Any, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    e1 = await start_lora()
    e1.lora.load_delay_s = 0.3
    gw = await start_gateway(lora_settings([e1.url]))
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
        rs = await asyncio.gather(*(c.post("/v1/chat/completions", json=chat("legal")) for _ in range(8)))
    assert [r.status_code for r in rs] == [200] * 8
    assert e1.lora.load_calls == 1
    assert loader(gw).in_flight() == 0
    assert fleet(gw).has_adapter(f"127.0.0.1:{e1.port}", "legal")


async def test_a_failed_load_moves_to_the_next_engine_then_503_naming_the_model(
    start_lora: Any, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    bad, good = await start_lora(), await start_lora()
    bad.lora.load_fail_status = 500
    gw = await start_gateway(lora_settings([bad.url, good.url]))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        for _ in range(3):
            assert (await c.post("/v1/chat/completions", json=chat("legal"))).status_code == 200
        assert bad.lora.served == [] and good.lora.served == ["legal"] * 3
        assert bad.lora.load_calls <= 1 and good.lora.load_calls == 1
        good.lora.load_fail_status = 500
        r = await c.post("/v1/chat/completions", json=chat("chef"))
    assert r.status_code == 503
    error = r.json()["error"]
    assert "chef" in error["message"]
    assert "127.0.0.1" not in r.text and "/secret/path" not in r.text and "/adapters/" not in r.text
    assert bad.lora.served == [] and "chef" not in good.lora.served  # never sent unloaded
    assert loader(gw).in_flight() == 0


async def test_a_stalled_load_is_bounded_and_cancelled(
    start_lora: Any, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    e1, e2 = await start_lora(), await start_lora()
    e1.lora.load_delay_s = e2.lora.load_delay_s = 30
    gw = await start_gateway(lora_settings([e1.url, e2.url], adapter_load_timeout_s=0.3))
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
        t0 = time.monotonic()
        r = await c.post("/v1/chat/completions", json=chat("legal"))
        waited = time.monotonic() - t0
    assert r.status_code == 503 and "legal" in r.json()["error"]["message"]
    assert waited < 2.0  # two endpoints, 0.3 s each
    assert e1.lora.load_calls == e2.lora.load_calls == 1
    assert loader(gw).in_flight() == 0
    assert await eventually(lambda: e1.lora.loads_cancelled == 1 and e2.lora.loads_cancelled == 1)
    loads = gw.app.state.registry.get_sample_value  # an engine that stalls is told apart from a client leaving
    assert loads("fleetgate_adapter_loads_total", {"adapter": "legal", "result": "timeout"}) == 2
    assert loads("fleetgate_adapter_loads_total", {"adapter": "legal", "result": "abandoned"}) is None


async def test_a_client_leaving_during_the_load_releases_everything(
    start_lora: Any, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    e1 = await start_lora()
    e1.lora.load_delay_s = 1.0
    gw = await start_gateway(lora_settings([e1.url]))
    registry = gw.app.state.registry
    async with httpx.AsyncClient(base_url=gw.url, timeout=0.2) as c:
        with pytest.raises(httpx.ReadTimeout):
            await c.post("/v1/chat/completions", json=chat("legal"))
    assert await eventually(lambda: loader(gw).in_flight() == 0 and e1.lora.loads_cancelled == 1)
    assert await eventually(lambda: registry.get_sample_value("fleetgate_requests_in_flight") == 0)
    assert fleet(gw).inflight == {}
    assert e1.lora.served == [] and not fleet(gw).has_adapter(f"127.0.0.1:{e1.port}", "legal")
    assert registry.get_sample_value("fleetgate_adapter_loads_total", {"adapter": "legal", "result": "abandoned"}) == 1
    e1.lora.load_delay_s = 0
    async with httpx.AsyncClient(base_url=gw.url) as c:  # the next request loads it afresh
        assert (await c.post("/v1/chat/completions", json=chat("legal"))).status_code == 200
    assert e1.lora.load_calls == 2


async def test_the_scraper_learns_loaded_adapters_and_keeps_them_on_garbage(
    start_lora: Any, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    e1, e2 = await start_lora(loaded={"legal"}), await start_lora()
    gw = await start_gateway(lora_settings([e1.url, e2.url]))
    ep1 = f"127.0.0.1:{e1.port}"
    state = fleet(gw)
    assert await eventually(lambda: state.has_adapter(ep1, "legal"))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        for _ in range(4):
            assert (await c.post("/v1/chat/completions", json=chat("legal"))).status_code == 200
    assert e1.lora.served == ["legal"] * 4 and e1.lora.load_calls == e2.lora.load_calls == 0
    e1.lora.models_garbage = True
    scraped = state.stats[ep1].scraped_at
    assert await eventually(lambda: state.stats[ep1].scraped_at > scraped + 0.2)  # /metrics still scraped
    assert state.has_adapter(ep1, "legal")  # garbage never clears what was known
    e1.lora.models_garbage = False
    e1.lora.loaded.clear()  # unloaded behind the gateway's back (an operator unload)
    assert await eventually(lambda: not state.has_adapter(ep1, "legal"))


async def test_tenants_models_lists_and_adapter_tenants_govern_adapters(
    start_lora: Any, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    e1 = await start_lora()
    gw = await start_gateway(lora_settings([e1.url], auth=True))
    async with httpx.AsyncClient(base_url=gw.url) as c:

        async def status(tenant: str, model: str) -> tuple[int, str]:
            r = await c.post("/v1/chat/completions", json=chat(model), headers=key(tenant))
            return r.status_code, r.json().get("error", {}).get("message", "") if r.status_code != 200 else ""

        assert (await status("acme", "legal"))[0] == 200 and (await status("acme", "pirate"))[0] == 200
        assert await status("globex", "legal") == (403, "tenant 'globex' may not use model 'legal'")
        assert (await status("initech", "legal"))[0] == 200
        code, message = await status("initech", "ghost")
        assert code == 404 and "legal" in message  # an adapter is a known model name like any other
        assert "pirate" not in message  # but one restricted to other tenants is not named to them
        # Another tenant's private adapter answers exactly as a name that does not exist: it cannot be
        # confirmed by name (it used to be 403 "may not use", against 404 for an unknown name).
        assert await status("initech", "pirate") == (404, message.replace("'ghost'", "'pirate'"))
        # listed in globex's own models, but the adapter names only acme: it does not exist for globex either
        code, message = await status("globex", "pirate")
        assert code == 404 and message.startswith("model 'pirate' does not exist; available models: base")
        assert (await status("globex", "ghost"))[0] == 403  # not in its list: 403 before 404, as for models
        await gw.pipeline.drain()
        rows = (await c.get("/v1/usage", headers=key("initech"))).json()["by_model"]
        # ... and its own usage rows name both the same way (no `_refused` row to tell them apart)
        assert {g["model"]: g["requests"] for g in rows if g["model"].startswith("_")} == {"_unknown": 2}

        async def listed(tenant: str) -> set[str]:
            return {m["id"] for m in (await c.get("/v1/models", headers=key(tenant))).json()["data"]}

        assert await listed("acme") == {"base", "legal", "pirate"}
        assert await listed("globex") == {"base"}
        assert await listed("initech") == {"base", "legal", "chef"}
    assert "pirate" not in e1.lora.served[3:]


async def test_the_cache_never_serves_one_adapters_answer_for_another_or_the_base(
    start_lora: Any, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    e1 = await start_lora()
    cfg = CacheConfig(store_truncated=True, semantic=SemanticConfig(embedder="hashing", threshold=0.5))
    gw = await start_gateway(lora_settings([e1.url]).model_copy(update={"cache": cfg}))
    cache = gw.pipeline._s.cache
    assert isinstance(cache, TwoLayerCache)
    question, paraphrase = "In Python, how do I reverse a string?", "How do I reverse a string in Python?"

    def ask(model: str, text: str) -> dict[str, Any]:
        return {"model": model, "messages": [{"role": "user", "content": text}], "max_tokens": 3, "temperature": 0}

    async with httpx.AsyncClient(base_url=gw.url) as c:
        first = await c.post("/v1/chat/completions", json=ask("legal", question))
        assert first.headers["x-fleetgate-cache"] == "miss"
        assert await eventually(lambda: len(cache.index) == 1)
        assert (await c.post("/v1/chat/completions", json=ask("legal", question))).headers["x-fleetgate-cache"] == (
            "hit-exact"
        )
        similar = await c.post("/v1/chat/completions", json=ask("legal", paraphrase))
        assert similar.headers["x-fleetgate-cache"].startswith("hit-semantic")  # the semantic layer works here
        served = len(e1.lora.served)
        # an exact match of legal's cached answer for the base, a semantic one for another adapter (asked first,
        # so no entry of its own could explain a hit)
        for model, text in (("base", question), ("chef", paraphrase), ("base", paraphrase)):
            r = await c.post("/v1/chat/completions", json=ask(model, text))
            assert r.status_code == 200 and r.json()["model"] == model
            if (model, text) != ("base", paraphrase):
                assert r.headers["x-fleetgate-cache"] == "miss", (model, text)
            else:  # the base's own entry now answers its paraphrase: partitions still work as caches
                assert r.headers["x-fleetgate-cache"].startswith("hit-semantic")
            await gw.pipeline.drain()
    assert e1.lora.served[served:] == [BASE, "chef"]
    assert len(cache.index) == 3


async def test_usage_is_accounted_per_adapter_with_its_base(
    start_lora: Any, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    e1 = await start_lora()
    settings = lora_settings([e1.url]).model_copy(deep=True)
    settings.tenancy = settings.tenancy.model_validate(
        {"prices": {"base": {"input_usd_per_1m": "1", "output_usd_per_1m": "2"}}}
    )
    gw = await start_gateway(settings)
    async with httpx.AsyncClient(base_url=gw.url) as c:
        for model in ("legal", "legal", "chef", "base"):
            assert (await c.post("/v1/chat/completions", json=chat(model))).status_code == 200
        await gw.pipeline.drain()
        report = (await c.get("/v1/usage")).json()
        csv_text = (await c.get("/v1/usage", params={"format": "csv"})).text
    by_model = {g["model"]: g for g in report["by_model"]}
    assert {m: (g["base"], g["requests"]) for m, g in by_model.items()} == {
        "legal": ("base", 2),
        "chef": ("base", 1),
        "base": ("", 1),
    }
    one = 2 * 1 + 3 * 2  # µ$: 2 prompt words at $1/1M, 3 completion tokens at $2/1M, the base's price
    assert by_model["legal"]["cost_micros"] == 2 * one and by_model["chef"]["cost_micros"] == one
    assert report["by_base"][0]["base"] == "base" and report["by_base"][0]["cost_micros"] == 4 * one
    table = list(csv.DictReader(io.StringIO(csv_text)))
    assert {(r["model"], r["base"]) for r in table} == {("legal", "base"), ("chef", "base"), ("base", "")}
    value = gw.app.state.registry.get_sample_value
    assert value("fleetgate_adapter_info", {"model": "legal", "base": "base"}) == 1
    assert (
        value("fleetgate_tenant_cost_usd_total", {"tenant": "anonymous", "model": "legal", "tier": ""}) == 2 * one / 1e6
    )


async def test_an_engine_that_lost_the_adapter_gets_it_loaded_again(
    start_lora: Any, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    e1 = await start_lora(loaded={"legal"})
    settings = lora_settings([e1.url]).model_copy(deep=True)
    # the first scrape round learns the preloaded adapter; later ones come too late to notice the loss
    settings.routing = settings.routing.model_validate({"scrape": {"intervalS": 60, "healthIntervalS": 60}})
    gw = await start_gateway(settings)
    ep = f"127.0.0.1:{e1.port}"
    assert await eventually(lambda: fleet(gw).has_adapter(ep, "legal"))
    e1.lora.loaded.clear()  # the engine restarted: its runtime-loaded adapters are gone
    async with httpx.AsyncClient(base_url=gw.url) as c:
        r = await c.post("/v1/chat/completions", json=chat("legal"))
        assert r.status_code == 200 and r.json()["model"] == "legal"
        e1.lora.load_fail_status = 500
        e1.lora.loaded.clear()  # lost again, and now it cannot load it: the client gets the 503, not a 404
        r = await c.post("/v1/chat/completions", json=chat("legal"))
        assert r.status_code == 503 and "legal" in r.json()["error"]["message"]
    assert e1.lora.served == ["legal", "legal", "legal"] and e1.lora.load_calls == 2
    assert fleet(gw).inflight == {} and loader(gw).in_flight() == 0


class _NeverLoaded(set[str]):
    """An engine that lies: every load answers 200, nothing is ever loaded."""

    def add(self, element: str) -> None:
        pass


async def test_an_engine_that_says_loaded_but_never_loads_costs_one_reload_then_moves_on(
    start_lora: Any, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    liar = await start_lora()
    liar.lora.loaded = _NeverLoaded()
    gw = await start_gateway(lora_settings([liar.url]))
    async with httpx.AsyncClient(base_url=gw.url, timeout=10) as c:
        r = await c.post("/v1/chat/completions", json=chat("legal"))
    # one reload and one resend, then a 503 naming the adapter: never a 404 for a model /v1/models lists
    assert r.status_code == 503 and "legal" in r.json()["error"]["message"] and "127.0.0.1" not in r.text
    assert liar.lora.load_calls == 2 and liar.lora.served == ["legal", "legal"]
    assert fleet(gw).inflight == {} and loader(gw).in_flight() == 0
    good = await start_lora()
    gw2 = await start_gateway(lora_settings([liar.url, good.url]))
    async with httpx.AsyncClient(base_url=gw2.url, timeout=10) as c:  # with another engine: served there
        for _ in range(3):
            r = await c.post("/v1/chat/completions", json=chat("legal"))
            assert r.status_code == 200 and r.json()["model"] == "legal"
    assert good.lora.served.count("legal") == 3


@pytest.mark.parametrize("where", ["route", "discovery"])
async def test_an_adapter_request_is_reserved_at_its_bases_context_length(
    start_lora: Any, start_gateway: Callable[..., Awaitable[RunningGateway]], where: str
) -> None:
    e1 = await start_lora()
    data = lora_settings([e1.url], auth=True, default_max_tokens=16).model_dump()
    data["tenancy"]["tenants"][0]["daily_budget_usd"] = "1"  # a budget: requests without max_tokens are capped
    data["tenancy"]["prices"] = {"base": {"input_usd_per_1m": "1", "output_usd_per_1m": "2"}}
    if where == "route":
        data["models"][0]["max_model_len"] = 4096
    settings = GatewaySettings.model_validate(data)

    class SizedSource(StaticEndpointSource):  # knows the base's context length, as Kubernetes discovery does
        def context_length(self, model: str) -> int | None:
            return 4096 if model == "base" else None

    stages = {} if where == "route" else {"endpoint_source": SizedSource(settings.models)}
    gw = await start_gateway(settings, **stages)
    body = {"model": "legal", "messages": [{"role": "user", "content": "alpha beta"}]}
    async with httpx.AsyncClient(base_url=gw.url) as c:
        r = await c.post("/v1/chat/completions", json=body, headers=key("acme"))
    assert r.status_code == 200, r.text
    # a context-sized reservation is left to the engine; without the base's context it would be the default 16
    assert e1.received[-1].body.get("max_tokens") is None and e1.received[-1].body["model"] == "legal"


async def test_a_per_adapter_budget_refuses_that_adapter_only(
    start_lora: Any, start_gateway: Callable[..., Awaitable[RunningGateway]]
) -> None:
    """A tenant's cap on one adapter (`model_budgets`): once spent, that adapter gets an OpenAI-shaped 429
    `insufficient_quota` naming it, while the base and the tenant's other adapters still answer."""
    e1 = await start_lora()
    data = lora_settings([e1.url], auth=True).model_dump()
    data["tenancy"]["tenants"][0]["model_budgets"] = {"legal": {"daily_budget_usd": "0.00005"}}  # 50 µ$
    data["tenancy"]["prices"] = {"base": {"input_usd_per_1m": "1", "output_usd_per_1m": "2"}}
    gw = await start_gateway(GatewaySettings.model_validate(data))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        statuses = []
        for _ in range(20):  # each request reserves a few µ$ at the base's price: the cap is reached well before
            r = await c.post("/v1/chat/completions", json=chat("legal"), headers=key("acme"))
            statuses.append(r.status_code)
            if r.status_code != 200:
                break
        assert statuses[0] == 200 and statuses[-1] == 429, statuses
        error = r.json()["error"]
        assert error["code"] == "insufficient_quota" and "model 'legal'" in error["message"], error
        for model in ("base", "pirate"):
            ok = await c.post("/v1/chat/completions", json=chat(model), headers=key("acme"))
            assert ok.status_code == 200, ok.text
