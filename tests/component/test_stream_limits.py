"""Streams with limits the gateway holds whatever the engine does (issue 26, defect 4), on real gateways and
a real `redis-server`: an engine streaming past `max_tokens` is cut off there and charged no more; a stream
ends at its total deadline; SIGTERM drains a real gateway process within the configured time, ending the
streams still open cleanly, and every stream is recorded and billed. Each case asserts the charge against
what the engine processed and the budget counter against the ledger."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml

from fleetgate.core.localredis import LocalRedis, free_port
from fleetgate.core.types import Usage
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.tenancy.config import ListPrice
from fleetgate.gateway.tenancy.pricing import cost_micros, list_rates
from fleetgate.sim.fake_engine import FakeEngine

from .conftest import RunningGateway, eventually
from .test_tenancy_gateway import KEYS, PRICE, auth

pytestmark = pytest.mark.redis
RATES = list_rates(ListPrice.model_validate(PRICE))
PROMPT = "one two three"


def two_model_settings(m1: str, m2: str, redis_url: str, **server: Any) -> GatewaySettings:
    return GatewaySettings.model_validate({
        "server": {"auth": "api_key", "log_requests": False, **server},
        "models": [{"name": "m1", "endpoints": [m1]}, {"name": "m2", "endpoints": [m2]}],
        "redis_url": redis_url,
        "tenancy": {"admin_key_hashes": [KEYS["admin"][1]], "prices": {"m1": PRICE, "m2": PRICE},
                    "tenants": [{"id": "acme", "key_hashes": [KEYS["acme"][1]], "daily_budget_usd": "1"}]},
    })


def body(model: str, max_tokens: int) -> dict[str, Any]:
    return {"model": model, "max_tokens": max_tokens, "stream": True,
            "messages": [{"role": "user", "content": PROMPT}]}


async def read_stream(url: str, b: dict[str, Any]) -> tuple[int, list[Any]]:
    """(status, events) of one streamed request read to its end."""
    async with httpx.AsyncClient(timeout=30) as c, c.stream("POST", url + "/v1/chat/completions", json=b,
                                                            headers=auth("acme")) as r:
        text = (await r.aread()).decode()
    events = [e[6:] if e[6:] == "[DONE]" else orjson.loads(e[6:]) for e in text.split("\n\n") if e.startswith("data: ")]
    return r.status_code, events


async def _post(url: str, b: dict[str, Any]) -> httpx.Response:
    async with httpx.AsyncClient(timeout=30) as c:
        return await c.post(url + "/v1/chat/completions", json=b, headers=auth("acme"))


async def usage_and_counter(url: str) -> tuple[dict[str, Any], float]:
    async with httpx.AsyncClient(base_url=url) as c:
        totals = (await c.get("/v1/usage", headers=auth("admin"))).json()["totals"]
        budgets = (await c.get("/v1/usage/budgets", headers=auth("acme"))).json()
    return totals, budgets["data"][0]["windows"]["daily_budget"]["used"]


def processed(*engines: FakeEngine) -> int:
    return cost_micros(Usage(prompt_tokens=sum(e.stats.prompt_tokens for e in engines),
                             completion_tokens=sum(e.stats.completion_tokens for e in engines)), RATES)


async def test_an_engine_streaming_past_max_tokens_is_cut_off_and_charged_only_max_tokens(
    redis_url: str, start_engine: Callable[..., Awaitable[FakeEngine]],
    start_gateway: Callable[..., Awaitable[RunningGateway]],
) -> None:
    runaway = await start_engine(model="m2", runaway_tokens=5000, inter_token_delay_s=0.001)
    gw = await start_gateway(two_model_settings(runaway.url, runaway.url, redis_url))
    status, events = await read_stream(gw.url, body("m2", 8))
    content = [e for e in events if isinstance(e, dict) and e.get("choices") and e["choices"][0]["delta"]["content"]]
    assert status == 200 and len(content) == 8
    assert events[-2]["error"]["code"] == "max_tokens_exceeded" and events[-1] == "[DONE]"
    assert await eventually(lambda: runaway.stats.running == 0)
    assert runaway.stats.cancelled == 1 and runaway.stats.completion_tokens < 5000  # the engine was aborted
    await gw.pipeline.drain()
    totals, counter = await usage_and_counter(gw.url)
    assert (totals["prompt_tokens"], totals["completion_tokens"]) == (3, 8)  # not what the engine ran on to
    assert totals["cost_micros"] == counter == cost_micros(Usage(prompt_tokens=3, completion_tokens=8), RATES)


async def test_a_stream_ends_at_the_configured_total_deadline(
    redis_url: str, start_engine: Callable[..., Awaitable[FakeEngine]],
    start_gateway: Callable[..., Awaitable[RunningGateway]],
) -> None:
    slow = await start_engine(model="m1", inter_token_delay_s=0.1)
    gw = await start_gateway(two_model_settings(slow.url, slow.url, redis_url, stream_deadline_s=0.6))
    started = time.monotonic()
    status, events = await read_stream(gw.url, body("m1", 100))
    assert 0.5 < time.monotonic() - started < 3  # ~10 s of tokens otherwise
    assert status == 200 and events[-2]["error"]["code"] == "stream_deadline" and events[-1] == "[DONE]"
    assert await eventually(lambda: slow.stats.running == 0)
    await gw.pipeline.drain()
    totals, counter = await usage_and_counter(gw.url)
    assert totals["errors"] == 1 and totals["cost_micros"] == counter == processed(slow)


def _start_gateway_process(tmp_path: Path, config: GatewaySettings, port: int) -> subprocess.Popen[bytes]:
    path = tmp_path / "gateway.yaml"
    path.write_text(yaml.safe_dump(config.model_dump(mode="json", exclude_none=True)))
    return subprocess.Popen(
        [sys.executable, "-m", "fleetgate", "gateway", "--config", str(path), "--port", str(port),
         "--metrics-port", "0"],
        env={**os.environ, "PYTHONSAFEPATH": "1"}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )


async def _wait_listening(url: str, proc: subprocess.Popen[bytes]) -> None:
    async with httpx.AsyncClient(timeout=1) as c:
        for _ in range(600):
            try:
                if (await c.get(url + "/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
            await asyncio.sleep(0.05)
    raise AssertionError("the gateway process did not start")


async def test_sigterm_drains_within_the_configured_time_and_records_every_stream(
    tmp_path: Path, redis_url: str, start_engine: Callable[..., Awaitable[FakeEngine]],
    start_gateway: Callable[..., Awaitable[RunningGateway]],
) -> None:
    """One stream finishes within the drain time; one engine holds its stream open forever, and another
    request (non-streaming, collected from an engine stream) waits on it too. On SIGTERM the gateway stops
    accepting, lets the first finish, ends the others cleanly at the drain deadline (an error event and
    [DONE]; a 503), records and bills all three, and exits within drain_s + drain_close_s (+ slack)."""
    slow = await start_engine(model="m1", inter_token_delay_s=0.05)  # 20 tokens: ~1 s
    stuck = await start_engine(model="m2", hang_after_chunks=3)
    drain_s, close_s = 2.0, 1.0
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    proc = _start_gateway_process(tmp_path, two_model_settings(slow.url, stuck.url, redis_url, drain_s=drain_s,
                                                               drain_close_s=close_s), port)
    try:
        await _wait_listening(url, proc)
        finishing = asyncio.ensure_future(read_stream(url, body("m1", 20)))
        held = asyncio.ensure_future(read_stream(url, body("m2", 50)))
        waiting = asyncio.ensure_future(_post(url, {**body("m2", 50), "stream": False}))  # collected upstream
        assert await eventually(lambda: slow.stats.running == 1 and stuck.stats.completion_tokens == 6)
        proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        await asyncio.sleep(0.3)
        async with httpx.AsyncClient(timeout=2) as c:  # no longer accepting
            with pytest.raises(httpx.TransportError):
                await c.get(url + "/healthz")
        (ok_status, ok_events), (held_status, held_events) = await asyncio.gather(finishing, held)
        answer = await waiting
        exit_code = await asyncio.to_thread(proc.wait, drain_s + close_s + 10)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert exit_code in (0, -signal.SIGTERM), stderr  # uvicorn re-raises the signal once it has shut down
    assert "Application shutdown complete" in stderr  # the lifespan ran: pending settles and records written
    assert "Traceback" not in stderr, stderr
    assert took < drain_s + close_s + 3, f"the gateway took {took:.1f} s to exit"
    assert ok_status == 200 and ok_events[-1] == "[DONE]" and not any("error" in e for e in ok_events[:-1]
                                                                     if isinstance(e, dict))
    assert held_status == 200 and held_events[-2]["error"]["code"] == "server_shutting_down"
    assert held_events[-1] == "[DONE]"
    assert answer.status_code == 503 and "shutting down" in answer.json()["error"]["message"]
    assert await eventually(lambda: stuck.stats.running == 0)  # the held engine request was aborted
    # Read what the exited process wrote with a fresh replica on the same Redis.
    reader = await start_gateway(two_model_settings(slow.url, stuck.url, redis_url))
    totals, counter = await usage_and_counter(reader.url)
    assert totals["requests"] == 3 and totals["errors"] == 2  # all recorded; the two ended ones as 503
    assert (totals["prompt_tokens"], totals["completion_tokens"]) == (9, 20 + 3 + 3)
    assert totals["cost_micros"] == counter == processed(slow, stuck)


async def test_streams_this_gateway_ends_at_shutdown_are_not_counted_as_engine_errors(
    redis_url: str, start_engine: Callable[..., Awaitable[FakeEngine]],
    start_gateway: Callable[..., Awaitable[RunningGateway]],
) -> None:
    """A stream ended by the drain is the gateway's doing: `fleetgate_upstream_errors` (which feeds alerts
    and an operator's view of a bad engine) must not blame the engine for it; a deadline still counts."""
    stuck = await start_engine(model="m1", hang_after_chunks=2)
    gw = await start_gateway(two_model_settings(stuck.url, stuck.url, redis_url, stream_deadline_s=0.5))
    held = asyncio.ensure_future(read_stream(gw.url, body("m1", 50)))
    assert await eventually(lambda: gw.pipeline.activity.streams == 1)
    assert gw.pipeline.activity.interrupt() == 1
    status, events = await held
    assert status == 200 and events[-2]["error"]["code"] == "server_shutting_down"
    async with httpx.AsyncClient() as c:
        metrics = (await c.get(gw.metrics_url)).text
    assert 'kind="shutdown"' not in metrics
    # the same engine, a fresh gateway: the stream deadline is the engine being too slow, and is counted
    gw2 = await start_gateway(two_model_settings(stuck.url, stuck.url, redis_url, stream_deadline_s=0.5))
    status, events = await read_stream(gw2.url, body("m1", 50))
    assert events[-2]["error"]["code"] == "stream_deadline"
    # A stream ended at its deadline is reported once the engine's stream is drained (`cancel_drain_s`: this engine
    # hangs, so after 2 s), so that the tokens it had counted are charged.
    await gw2.pipeline.drain()
    async with httpx.AsyncClient() as c:
        metrics = (await c.get(gw2.metrics_url)).text
    assert 'fleetgate_upstream_errors_total{' in metrics and 'kind="deadline"' in metrics


REDIS_TIMEOUT_S = 2.0  # the tenancy store's (the usage ledger's and the limits') command timeout: the default


async def test_sigterm_exits_in_bounded_time_while_redis_is_stalled(
    tmp_path: Path, start_engine: Callable[..., Awaitable[FakeEngine]],
    start_gateway: Callable[..., Awaitable[RunningGateway]],
) -> None:
    """Redis stops answering (SIGSTOP) while clients hold several streams open; then SIGTERM. The streams' settle
    and record writes all wait on Redis at once and together get `server.settle_s`, not a store timeout each, one
    after the other (before: the token settle, the ledger write and the dollar charge, ~3 x 2 s after the drain), so
    the gateway exits within drain_s + drain_close_s + settle_s (+ slack). The usage it owed is not silently lost:
    the tenant has a tpm limit, so each stream's token settle is still waiting on Redis at the deadline and its
    ledger write was never sent; after SIGCONT the ledger holds only the request answered before the stall, and
    the exit log names each stream, its tenant and its tokens (`usage not written`, attempted: false)."""
    streams = 4
    stuck = await start_engine(model="m2", hang_after_chunks=3)
    fine = await start_engine(model="m1")
    drain_s, close_s, settle_s = 1.0, 1.0, 0.5
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with LocalRedis() as redis:
        assert redis.pid is not None
        config = two_model_settings(fine.url, stuck.url, redis.url, drain_s=drain_s, drain_close_s=close_s,
                                    settle_s=settle_s)
        tenants = [t.model_copy(update={"tpm": 1_000_000}) for t in config.tenancy.tenants]
        config = config.model_copy(update={"tenancy": config.tenancy.model_copy(
            update={"redis_timeout_s": REDIS_TIMEOUT_S, "tenants": tenants})})
        proc = _start_gateway_process(tmp_path, config, port)
        try:
            await _wait_listening(url, proc)
            status, _ = await read_stream(url, body("m1", 5))  # a first decision starts the background syncs
            assert status == 200
            held = [asyncio.ensure_future(read_stream(url, body("m2", 50))) for _ in range(streams)]
            assert await eventually(lambda: stuck.stats.completion_tokens == 3 * streams)
            os.kill(redis.pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(0.5)  # the syncs are now waiting on Redis
                proc.send_signal(signal.SIGTERM)
                sent = time.monotonic()
                exit_code = await asyncio.to_thread(proc.wait, 60)
                took = time.monotonic() - sent
            finally:
                os.kill(redis.pid, signal.SIGCONT)
            ended = await asyncio.gather(*held)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        stderr = proc.stderr.read().decode() if proc.stderr else ""
        await asyncio.sleep(0.5)  # Redis applies what it had received before the stall
        reader = await start_gateway(two_model_settings(fine.url, stuck.url, redis.url))
        totals, _ = await usage_and_counter(reader.url)
    assert exit_code in (0, -signal.SIGTERM), stderr
    assert "Application shutdown complete" in stderr
    assert all(s == 200 and events[-1] == "[DONE]" for s, events in ended)
    assert took < drain_s + close_s + settle_s + 2.0, f"the gateway took {took:.1f} s to exit"
    lost = [orjson.loads(line) for line in stderr.splitlines() if "usage not written" in line]
    assert [(r["tenant"], r["model"], r["attempted"]) for r in lost] == [("acme", "m2", False)] * streams, stderr
    assert sum(r["prompt_tokens"] + r["completion_tokens"] for r in lost) == (
        stuck.stats.prompt_tokens + stuck.stats.completion_tokens)
    assert totals["requests"] == 1  # the streams are in the exit log, not in the ledger
    assert totals["prompt_tokens"] + totals["completion_tokens"] == (
        fine.stats.prompt_tokens + fine.stats.completion_tokens)
