"""The Endpoint Picker protocol through a real Envoy: Envoy -> ext_proc -> `fleetgate epp` -> fake engines.

Every behaviour of the Gateway API Inference Extension's protocol that FleetGate claims is proven here through
the real proxy: the pick reaches the engine, prefix affinity holds, the served endpoint comes back, 503 with
no endpoint, 429 when shedding, a subset hint is honoured, FailOpen and FailClose with the picker down; and
FleetGate's own stages through the same door: keys, budgets, streaming with usage charged (also when the
client leaves), and cache hits answered without an engine.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import orjson
import pytest

from fleetgate.gateway.tenancy.keys import new_key
from fleetgate.gateway.tenancy.stage import TenancyStage
from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

from .epp_stack import epp_stack, settings_for

pytestmark = pytest.mark.slow
CHAT = "/v1/chat/completions"
SERVED = "x-gateway-destination-endpoint-served"
Engines = Callable[..., Awaitable[list[FakeEngine]]]


def chat(content: str, *, model: str = "m1", max_tokens: int = 4, **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens, **extra}


@pytest.fixture
async def engines() -> Any:
    started: list[FakeEngine] = []

    async def start(n: int = 1, **config: Any) -> list[FakeEngine]:
        new = [await FakeEngine(FakeEngineConfig(**{"model": "m1", **config})).start() for _ in range(n)]
        started.extend(new)
        return new

    yield start
    for engine in started:
        await engine.stop()


async def post(url: str, body: dict[str, Any], *, headers: dict[str, str] | None = None
               ) -> tuple[int, dict[str, str], bytes]:
    async with aiohttp.ClientSession() as s, s.post(url + CHAT, json=body, headers=headers or {}) as r:
        return r.status, dict(r.headers), await r.read()


def receiver(engines: list[FakeEngine], text: str) -> FakeEngine:
    """The one engine that received a request containing `text`."""
    (hit,) = [e for e in engines if any(text in orjson.dumps(r.body).decode() for r in e.received)]
    return hit


async def test_pick_reaches_the_engine_prefix_affinity_holds_and_served_header_names_it(
        engines: Engines) -> None:
    fleet = await engines(3)
    settings = settings_for({"m1": [e.url for e in fleet]})
    async with epp_stack(settings, pool=[e.port for e in fleet]) as stack:
        homes: dict[int, set[str]] = {}
        for group in range(3):
            prefix = f"group {group} " + " ".join(f"shared{group}-{i}" for i in range(400))  # ~5 KB: 10 blocks
            for i in range(5):
                marker = f"question-{group}-{i}"
                status, headers, body = await post(stack.url, chat(f"{prefix} {marker}"))
                assert status == 200, body
                engine = receiver(fleet, marker)
                assert headers[SERVED] == f"127.0.0.1:{engine.port}"  # the header names who really served
                homes.setdefault(group, set()).add(headers[SERVED])
        # every request of a prefix went where the first one went (its prefix is cached there)
        assert all(len(home) == 1 for home in homes.values()), homes
        assert sum(e.stats.requests for e in fleet) == 15


async def test_no_endpoint_is_503_and_unknown_model_404(engines: Engines) -> None:
    (engine,) = await engines(1)
    settings = settings_for({"m1": [engine.url], "empty": []})
    async with epp_stack(settings, pool=[engine.port]) as stack:
        status, headers, body = await post(stack.url, chat("hello", model="empty"))
        assert status == 503 and orjson.loads(body)["error"]["code"] == "upstream_unavailable"
        assert "Retry-After" in headers
        status, _, body = await post(stack.url, chat("hello", model="nope"))
        assert status == 404 and orjson.loads(body)["error"]["code"] == "model_not_found"
        async with aiohttp.ClientSession() as s, s.get(stack.url + "/v1/models") as r:
            assert r.status == 200 and [m["id"] for m in (await r.json())["data"]] == ["m1", "empty"]
    assert engine.stats.requests == 0


async def test_saturated_fleet_sheds_with_429(engines: Engines) -> None:
    fleet = await engines(2, max_running=1, prefill_delay_s=1.5)
    routing = {"plugins": [{"type": "saturation-filter", "name": "shed", "parameters": {"queueDepth": 1}},
                           {"type": "inflight-scorer", "name": "inflight"},
                           {"type": "max-score-picker", "name": "max"}],
               "schedulingProfiles": [{"name": "default", "plugins": [
                   {"pluginRef": "shed"}, {"pluginRef": "inflight"}, {"pluginRef": "max"}]}],
               "scrape": {"intervalS": 0.05, "healthIntervalS": 0.5}}
    settings = settings_for({"m1": [e.url for e in fleet]}, routing=routing)
    async with epp_stack(settings, pool=[e.port for e in fleet]) as stack:
        busy = [asyncio.create_task(post(stack.url, chat(f"slow {i}"))) for i in range(4)]  # 2 per engine
        for _ in range(100):  # until every engine reports a queue
            await asyncio.sleep(0.05)
            if all(e.stats.running >= 2 for e in fleet):
                break
        await asyncio.sleep(0.3)  # a scrape sees it
        status, headers, body = await post(stack.url, chat("one more"))
        assert status == 429, body
        assert orjson.loads(body)["error"]["code"] == "fleet_saturated" and int(headers["Retry-After"]) >= 1
        assert all(s == 200 for s, _, _ in await asyncio.gather(*busy))
    assert sum(e.stats.requests for e in fleet) == 4  # the shed request reached no engine


async def test_subset_hint_is_honoured_and_an_empty_one_is_503(
        engines: Engines) -> None:
    fleet = await engines(3)
    settings = settings_for({"m1": [e.url for e in fleet]})

    def hint(ports: list[int]) -> dict[str, Any]:
        subset = [f"127.0.0.1:{p}" for p in ports]
        return {"name": "envoy.filters.http.set_metadata", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.set_metadata.v3.Config",
            "metadata": [{"metadata_namespace": "envoy.lb.subset_hint",
                          "value": {"x-gateway-destination-endpoint-subset": subset}}]}}

    only = fleet[2]
    async with epp_stack(settings, pool=[e.port for e in fleet], extra_filters=[hint([only.port])]) as stack:
        for i in range(6):
            status, headers, _ = await post(stack.url, chat(f"hinted {i}"))
            assert status == 200 and headers[SERVED] == f"127.0.0.1:{only.port}"
    assert only.stats.requests == 6 and fleet[0].stats.requests == fleet[1].stats.requests == 0
    async with epp_stack(settings, pool=[e.port for e in fleet], extra_filters=[hint([1])]) as stack:
        status, _, body = await post(stack.url, chat("nowhere"))
        assert status == 503, body
    assert sum(e.stats.requests for e in fleet) == 6


async def test_a_clients_own_destination_header_is_ignored(engines: Engines) -> None:
    fleet = await engines(2)
    victim = await FakeEngine(FakeEngineConfig(model="m1")).start()  # not in the pool: must never be reached
    try:
        for mode in ("FailClose", "FailOpen"):
            settings = settings_for({"m1": [e.url for e in fleet]}) if mode == "FailClose" else None
            async with epp_stack(settings, pool=[e.port for e in fleet], failure_mode=mode) as stack:  # type: ignore[arg-type]
                status, _, body = await post(stack.url, chat("steer"),
                                             headers={"x-gateway-destination-endpoint": f"127.0.0.1:{victim.port}"})
                assert status == 200, (mode, body, stack.envoy.log_tail())
        assert victim.stats.requests == 0
    finally:
        await victim.stop()


async def test_picker_down_fail_open_uses_the_pool_fail_close_refuses(
        engines: Engines) -> None:
    fleet = await engines(2)
    async with epp_stack(None, pool=[e.port for e in fleet], failure_mode="FailOpen") as stack:
        for i in range(4):
            status, _, _ = await post(stack.url, chat(f"open {i}"))
            assert status == 200
    assert sum(e.stats.requests for e in fleet) == 4
    async with epp_stack(None, pool=[e.port for e in fleet], failure_mode="FailClose") as stack:
        status, _, _ = await post(stack.url, chat("closed"))
        assert status >= 500
    assert sum(e.stats.requests for e in fleet) == 4  # nothing reached an engine


KEYS = {name: new_key() for name in ("acme", "globex")}
PRICE = {"input_usd_per_1m": "1", "output_usd_per_1m": "1"}  # 1 micro-dollar per token


def tenancy(**acme: Any) -> dict[str, Any]:
    return {"tenants": [{"id": "acme", "key_hashes": [KEYS["acme"][1]], "models": ["m1"], **acme},
                        {"id": "globex", "key_hashes": [KEYS["globex"][1]]}],
            "prices": {"m1": PRICE, "m2": PRICE}}


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name][0]}"}


async def ledger(stack: Any, tenant: str) -> Counter[str]:
    """The tenant's ledger totals today (prompt_tokens, completion_tokens, requests, errors, cost_micros...)."""
    await stack.drain()
    stage = stack.epp.stages.accountant
    assert isinstance(stage, TenancyStage)
    totals: Counter[str] = Counter()
    for row in await stage.ledger.read(days=[dt.datetime.now(dt.UTC).strftime("%Y-%m-%d")], tenant=tenant):
        totals.update(row.values)
    return totals


def tokens(totals: Counter[str]) -> tuple[int, int]:
    return totals["prompt_tokens"], totals["completion_tokens"]


async def test_keys_models_and_budgets_refuse_through_envoy(engines: Engines) -> None:
    (engine,) = await engines(1)
    # acme's budget (20 µ$, 1 µ$ a token) fits one request's reservation only through the exact count, as in the
    # gateway (`reserving.Reserver`: the prompt bound, ~290 tokens, would refuse; the engine's /tokenize says 3,
    # + 10 completion tokens), and not two once the first has been charged (3 + 10): the refusal comes from the
    # budget, after real spend
    settings = settings_for({"m1": [engine.url], "m2": [engine.url]}, server={"auth": "api_key"},
                            tenancy=tenancy(daily_budget_usd="0.00002"))
    async with epp_stack(settings, pool=[engine.port]) as stack:
        status, _, body = await post(stack.url, chat("w0 w1 w2"))
        assert status == 401 and orjson.loads(body)["error"]["type"] == "authentication_error"
        status, _, body = await post(stack.url, chat("w0 w1 w2", model="m2"), headers=auth("acme"))
        assert status == 403 and orjson.loads(body)["error"]["type"] == "permission_error"
        status, _, body = await post(stack.url, chat("w0 w1 w2", max_tokens=10), headers=auth("acme"))
        assert status == 200, body
        await stack.drain()
        status, headers, body = await post(stack.url, chat("w0 w1 w2", max_tokens=10), headers=auth("acme"))
        assert status == 429 and orjson.loads(body)["error"]["type"] == "rate_limit_error", body
        assert "budget" in orjson.loads(body)["error"]["message"] and "Retry-After" in headers
        status, _, _ = await post(stack.url, chat("w0 w1 w2", model="m2"), headers=auth("globex"))
        assert status == 200
        acme = await ledger(stack, "acme")
        assert tokens(acme) == (3, 10) and acme["cost_micros"] == 13  # the one answered request, exactly
        assert acme["requests"] == 3 and acme["errors"] == 2  # the 403 and the 429 are recorded, at $0
    assert engine.stats.requests == 2  # the refused requests never reached the engine
    assert all("authorization" not in r.headers for r in engine.received)  # engines never see tenants' keys


async def test_streaming_is_intact_and_usage_is_charged_exactly(engines: Engines
                                                                ) -> None:
    (engine,) = await engines(1, inter_token_delay_s=0.01)
    settings = settings_for({"m1": [engine.url]}, server={"auth": "api_key"}, tenancy=tenancy())
    direct = b""
    async with aiohttp.ClientSession() as s, s.post(engine.url + CHAT, json=chat("a b c d", max_tokens=12,
                                                                                  stream=True)) as r:
        direct = await r.read()
    async with epp_stack(settings, pool=[engine.port]) as stack:
        async with aiohttp.ClientSession() as s, s.post(stack.url + CHAT, headers=auth("acme"),
                                                        json=chat("a b c d", max_tokens=12, stream=True,
                                                                  stream_options={"include_usage": True})) as r:
            assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream")
            assert r.headers[SERVED] == f"127.0.0.1:{engine.port}"
            events = [line for line in (await r.read()).split(b"\n\n") if line]
        texts = [c["choices"][0]["delta"].get("content", "") for c in map(lambda e: orjson.loads(e[6:]), events[:-1])
                 if c["choices"]]
        engine_texts = [c["choices"][0]["delta"].get("content", "")
                        for c in (orjson.loads(e[6:]) for e in direct.split(b"\n\n") if e and e != b"data: [DONE]")
                        if c["choices"]]
        assert texts == engine_texts and events[-1] == b"data: [DONE]"
        usage = orjson.loads(events[-2][6:])["usage"]  # the usage-only chunk the client asked for
        assert usage["prompt_tokens"] == 4 and usage["completion_tokens"] == 12
        acme = await ledger(stack, "acme")
        assert tokens(acme) == (4, 12) and acme["requests"] == 1 and acme["cost_micros"] == 16


async def test_an_engine_streaming_past_max_tokens_is_cut_off_and_charged_the_cap(engines: Engines) -> None:
    """Issue 26's completion cap behind Envoy: the picker holds the reservation's cap as the gateway does."""
    (engine,) = await engines(1, runaway_tokens=40)  # ignores max_tokens
    settings = settings_for({"m1": [engine.url]}, server={"auth": "api_key"}, tenancy=tenancy())
    async with epp_stack(settings, pool=[engine.port]) as stack:
        async with aiohttp.ClientSession() as s, s.post(stack.url + CHAT, headers=auth("acme"),
                                                        json=chat("a b c", max_tokens=5, stream=True)) as r:
            events = [orjson.loads(e[6:]) if e != b"data: [DONE]" else "[DONE]"
                      for e in (await r.read()).split(b"\n\n") if e]
        content = [e for e in events if isinstance(e, dict) and e.get("choices") and e["choices"][0]["delta"].get(
            "content")]
        assert r.status == 200 and len(content) == 5
        assert events[-2]["error"]["code"] == "max_tokens_exceeded" and events[-1] == "[DONE]"
        acme = await ledger(stack, "acme")
        assert engine.stats.completion_tokens == 40  # what the engine did; the tenant pays what it asked for
        assert tokens(acme) == (3, 5) and acme["requests"] == 1 and acme["errors"] == 1


async def test_client_leaving_mid_stream_is_charged_what_the_engine_did(
        engines: Engines) -> None:
    (engine,) = await engines(1, inter_token_delay_s=0.05)
    settings = settings_for({"m1": [engine.url]}, server={"auth": "api_key"}, tenancy=tenancy())
    async with epp_stack(settings, pool=[engine.port]) as stack:
        async with aiohttp.ClientSession() as s, s.post(stack.url + CHAT, headers=auth("acme"),
                                                        json=chat("a b c", max_tokens=200, stream=True)) as r:
            seen = 0
            async for _ in r.content:
                seen += 1
                if seen >= 10:
                    break  # leaves: the connection closes with the stream half done
        for _ in range(100):
            await asyncio.sleep(0.05)
            if engine.stats.cancelled:
                break
        assert engine.stats.cancelled == 1  # Envoy reset the engine's request
        acme = await ledger(stack, "acme")
        prompt, completion = tokens(acme)
        assert prompt == 3 and acme["requests"] == 1
        # charged up to the last chunk that reached the picker: what the engine generated, give or take the
        # chunks in flight when the client left, never the 200 reserved and never nothing
        assert 3 <= completion <= engine.stats.completion_tokens


async def test_exact_cache_hit_is_answered_by_the_picker(engines: Engines) -> None:
    (engine,) = await engines(1)
    cache = {"enabled": True, "store_truncated": True, "semantic": {"enabled": False}}
    settings = settings_for({"m1": [engine.url]}, cache=cache)
    body = chat("what is the capital of France?", temperature=0)
    async with epp_stack(settings, pool=[engine.port]) as stack:
        status, headers, first = await post(stack.url, body)
        assert status == 200 and headers["x-fleetgate-cache"] == "miss"
        await stack.drain()  # the store runs after the answer
        status, headers, again = await post(stack.url, body)
        assert status == 200 and headers["x-fleetgate-cache"] == "hit-exact"
        assert orjson.loads(again)["choices"] == orjson.loads(first)["choices"]
        async with aiohttp.ClientSession() as s, s.post(stack.url + CHAT, json={**body, "stream": True}) as r:
            replay = await r.read()
            assert r.headers["x-fleetgate-cache"] == "hit-exact" and replay.endswith(b"data: [DONE]\n\n")
    assert engine.stats.requests == 1


async def test_hostile_requests_and_failing_engines_get_the_gateways_answers(engines: Engines) -> None:
    (engine,) = await engines(1)
    (broken,) = await engines(1, model="m2", fail_status=500, fail_message="Traceback: /srv/secret.py line 3")
    (dying,) = await engines(1, model="m3", drop_after_chunks=2, inter_token_delay_s=0.05)
    settings = settings_for({"m1": [engine.url], "m2": [broken.url], "m3": [dying.url]},
                            server={"max_body_bytes": 4096})
    async with epp_stack(settings, pool=[engine.port]) as stack, aiohttp.ClientSession() as s:
        async with s.post(stack.url + CHAT, data=b"{not json", headers={"content-type": "application/json"}) as r:
            assert r.status == 400 and (await r.json())["error"]["type"] == "invalid_request_error"
        status, _, body = await post(stack.url, chat("x" * 5000))
        assert status == 413 and orjson.loads(body)["error"]["code"] == "request_too_large"
        async with s.get(stack.url + "/admin") as r:
            assert r.status == 404 and (await r.json())["error"]["code"] == "unknown_route"
        status, _, body = await post(stack.url, chat("hello", model="m2"))
        assert status == 500 and b"secret" not in body and b"Traceback" not in body  # the engine's words stay inside
        # the engine breaks off a non-streaming answer: Envoy sees the upstream reset and answers itself (the
        # picker's config gives its local replies the OpenAI shape)
        status, headers, body = await post(stack.url, chat("hello", model="m3", max_tokens=10))
        assert status == 502 and orjson.loads(body)["error"]["code"] == "proxy_error", body
        assert not any(h.lower().startswith("x-fleetgate-upstream") for h in headers)
        # mid-stream, Envoy has sent the headers already: it cuts the client's stream, which never ends with
        # [DONE] (the gateway itself would add an error event; through a proxy the client sees the cut)
        async with s.post(stack.url + CHAT, json=chat("hello", model="m3", max_tokens=10, stream=True)) as r:
            assert r.status == 200
            text = b""
            with contextlib.suppress(aiohttp.ClientPayloadError):
                async for chunk in r.content.iter_any():
                    text += chunk
        assert text.count(b"data: ") >= 1 and not text.endswith(b"data: [DONE]\n\n")
    assert engine.stats.requests == 0  # nothing hostile reached an engine


async def test_grpc_health_services(engines: Engines) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    (engine,) = await engines(1)
    async with epp_stack(settings_for({"m1": [engine.url]}), pool=[engine.port]) as stack:
        assert stack.epp is not None
        async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.epp.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
                answer = await health.Check(health_pb2.HealthCheckRequest(service=service))
                assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
            await stack.epp.stop(drain_s=0.1)  # stopping: not ready any more, before the port closes
            with pytest.raises(grpc.aio.AioRpcError):
                await health.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=2)


@pytest.mark.redis
async def test_replicas_share_prefix_state_through_redis(engines: Engines, redis_url: str) -> None:
    fleet = await engines(3)
    settings = settings_for({"m1": [e.url for e in fleet]}, redis_url=redis_url)
    pool = [e.port for e in fleet]
    async with epp_stack(settings, pool=pool) as first, epp_stack(settings, pool=pool) as second:
        homes = {}
        for group in range(4):  # four prefixes: landing on each one's home by chance would be (1/3)^4
            prefix = " ".join(f"shared-{group}-{i}" for i in range(400))
            status, headers, _ = await post(first.url, chat(f"{prefix} one"))
            assert status == 200
            homes[prefix] = headers[SERVED]
        # A replica syncs its prefix index in the background of its own requests (`router.prefix_sync`: never on
        # a request's path): the first replica's next request publishes the records, the second's pulls them.
        for replica in (first, second):
            await asyncio.sleep(0.2)
            assert (await post(replica.url, chat("an unrelated short question")))[0] == 200
        await asyncio.sleep(0.2)
        for prefix, home in homes.items():  # the other replica has never routed these prefixes itself
            status, headers, _ = await post(second.url, chat(f"{prefix} again"))
            assert status == 200 and headers[SERVED] == home


async def test_one_answer_mode_asks_the_engine_for_one_json_answer(engines: Engines) -> None:
    (engine,) = await engines(1)
    settings = settings_for({"m1": [engine.url]}, server={"auth": "api_key"}, tenancy=tenancy(),
                            epp={"assemble_non_streaming": False})
    async with epp_stack(settings, pool=[engine.port]) as stack:
        status, headers, body = await post(stack.url, chat("a b c d e", max_tokens=7), headers=auth("acme"))
        assert status == 200 and headers["Content-Type"].startswith("application/json")
        assert orjson.loads(body)["usage"]["completion_tokens"] == 7
        assert "stream" not in engine.received[-1].body  # one JSON answer, not a stream to assemble
        assert tokens(await ledger(stack, "acme")) == (5, 7)


async def test_an_endpoint_envoy_cannot_connect_to_is_ejected_and_answered_as_the_gateway_answers(
        engines: Engines) -> None:
    """A pod that died after the last scrape: Envoy's connect to the picked `ip:port` is refused and it answers
    503 itself (response flag UF). The picker sees that flag (`response.flags`), ejects the endpoint for the
    back-off, as the gateway does on a connect failure, and answers the gateway's 503; the next requests go
    to the live engine, long before a scrape or health poll (30 s here) could notice."""
    from prometheus_client import CollectorRegistry

    alive, doomed = await engines(2)
    dead = f"127.0.0.1:{doomed.port}"
    registry = CollectorRegistry()
    settings = settings_for({"m1": [alive.url, doomed.url]},
                            routing={"scrape": {"intervalS": 30, "healthIntervalS": 30}})
    async with epp_stack(settings, pool=[alive.port, doomed.port], registry=registry) as stack:
        await doomed.stop()  # the port is closed now
        outcomes: list[tuple[int, str]] = []
        for i in range(12):  # until the dead endpoint has been picked once (each pick is about a coin toss)
            status, headers, body = await post(stack.url, chat(f"question {i}"))
            outcomes.append((status, headers.get(SERVED, "")))
            if status != 200:
                error = orjson.loads(body)["error"]
                assert status == 503 and error["code"] == "upstream_unavailable", body
                assert "cannot connect" in error["message"] and "127.0.0.1" not in error["message"]
                assert int(headers["Retry-After"]) >= 1
                break
        assert outcomes[-1][0] == 503, outcomes
        assert registry.get_sample_value("fleetgate_router_ejections_total",
                                         {"endpoint": dead, "reason": "connect"}) == 1
        assert registry.get_sample_value("fleetgate_router_endpoint_ejected", {"endpoint": dead}) == 1
        # ejected for the back-off: what follows goes to the live engine
        for i in range(6):
            status, headers, body = await post(stack.url, chat(f"after {i}"))
            assert status == 200 and headers[SERVED] == f"127.0.0.1:{alive.port}", body


def http2_to_engines(config: dict[str, Any]) -> None:
    (cluster,) = [c for c in config["static_resources"]["clusters"] if c["name"] == "original_dst"]
    cluster["typed_extension_protocol_options"] = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}}}}


@pytest.mark.parametrize("stream", [True, False])
async def test_an_answer_that_ends_in_trailers_is_a_completed_request(stream: bool) -> None:
    """An HTTP/2 hop to the engine passes the engine's trailers on: the body's last chunk then comes without
    end_of_stream and Envoy sends the picker `response_trailers`. The request is complete there: the client
    gets the whole answer, and it is charged and recorded as answered (200), not as a client that left."""
    from prometheus_client import CollectorRegistry

    from .h2_engine import TEXT, H2Engine

    engine = await H2Engine().start()
    registry = CollectorRegistry()
    settings = settings_for({"m1": [engine.url]}, server={"auth": "api_key"}, tenancy=tenancy(),
                            routing={"scrape": {"intervalS": 30, "healthIntervalS": 30}})
    try:
        async with epp_stack(settings, pool=[engine.port], configure=http2_to_engines, registry=registry) as stack:
            async with aiohttp.ClientSession() as s, s.post(stack.url + CHAT, headers=auth("acme"), json=chat(
                    "a b c", stream=stream, stream_options={"include_usage": True} if stream else None)) as r:
                assert r.status == 200, await r.read()
                raw = await r.read()
            if stream:
                events = [orjson.loads(e[6:]) for e in raw.split(b"\n\n") if e and e != b"data: [DONE]"]
                text = "".join(c["choices"][0]["delta"].get("content", "") for c in events if c["choices"])
                assert raw.endswith(b"data: [DONE]\n\n") and events[-1]["usage"]["completion_tokens"] == 2
            else:
                text = orjson.loads(raw)["choices"][0]["message"]["content"]
            assert text == "".join(TEXT) and len(engine.received) == 1
            acme = await ledger(stack, "acme")
            assert tokens(acme) == (3, 2) and acme["requests"] == 1 and acme["errors"] == 0, acme
            assert stack.epp is not None
            state = stack.epp.stages.scheduler.state  # type: ignore[attr-defined]
            assert state.inflight == {}
            answered = [s for m in registry.collect() if m.name == "fleetgate_requests" for s in m.samples
                        if s.name == "fleetgate_requests_total"]
            assert [(s.labels["status"], s.value) for s in answered] == [("200", 1.0)]
    finally:
        await engine.stop()
