"""The Endpoint Picker's own bounds on a request, through a real Envoy: the stream deadline, the time limit of a
non-streaming request and the drain on shutdown (`gateway.epp.lifetime`, `EppServer.stop`, `fleetgate epp` on
SIGTERM). Each ends the request the way FleetGate's gateway ends it, and charges the engine's work so far."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pytest
import yaml

from fleetgate.bench.envoy import EnvoyProcess
from fleetgate.core.localredis import free_port
from fleetgate.gateway.epp.envoyconfig import envoy_config

from .epp_stack import epp_stack, settings_for
from .test_epp_envoy import CHAT, Engines, auth, chat, engines, ledger, tenancy, tokens

pytestmark = pytest.mark.slow
__all__ = ["engines"]  # the fixture, shared with test_epp_envoy


def events_of(raw: bytes) -> list[Any]:
    parts = [e.strip() for e in raw.split(b"\n\n")]
    return [orjson.loads(e[6:]) if e != b"data: [DONE]" else "[DONE]" for e in parts if e]


def contents(events: list[Any]) -> list[str]:
    return [e["choices"][0]["delta"]["content"] for e in events
            if isinstance(e, dict) and e.get("choices") and e["choices"][0]["delta"].get("content")]


async def until(check: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_a_stream_past_the_pickers_deadline_ends_with_an_error_event_and_is_charged(engines: Engines) -> None:
    (engine,) = await engines(1, inter_token_delay_s=0.05)
    settings = settings_for({"m1": [engine.url]}, server={"auth": "api_key", "stream_deadline_s": 0.6},
                            tenancy=tenancy())
    async with epp_stack(settings, pool=[engine.port]) as stack:
        started = time.monotonic()
        async with aiohttp.ClientSession() as s, s.post(stack.url + CHAT, headers=auth("acme"),
                                                        json=chat("a b c", max_tokens=200, stream=True)) as r:
            assert r.status == 200
            events = events_of(await r.read())
        took = time.monotonic() - started
        assert 0.5 < took < 3.0  # the picker's bound, not the engine's 10 s of tokens
        assert 1 <= len(contents(events)) < 200
        assert events[-2]["error"]["code"] == "stream_deadline" and events[-1] == "[DONE]"
        await until(lambda: engine.stats.cancelled == 1)  # Envoy reset the engine's request
        acme = await ledger(stack, "acme")
        prompt, completion = tokens(acme)
        # charged what reached the picker: at least what the client got, never the 200 reserved
        assert prompt == 3 and len(contents(events)) <= completion <= engine.stats.completion_tokens < 200
        assert acme["requests"] == 1 and acme["errors"] == 1


async def test_a_non_streaming_request_past_its_time_limit_is_a_504(engines: Engines) -> None:
    (engine,) = await engines(1, prefill_delay_s=5.0)
    settings = settings_for({"m1": [engine.url]}, server={"request_timeout_s": 0.5})
    async with epp_stack(settings, pool=[engine.port]) as stack:
        started = time.monotonic()
        async with aiohttp.ClientSession() as s, s.post(stack.url + CHAT, json=chat("slow")) as r:
            status, body = r.status, await r.read()
        assert status == 504 and orjson.loads(body)["error"]["code"] == "request_deadline", body
        assert time.monotonic() - started < 3.0
        await until(lambda: engine.stats.cancelled == 1)
    # a stream gets the longer whole-stream bound, not the non-streaming one
    (quick,) = await engines(1, prefill_delay_s=0.8)
    fast = settings_for({"m1": [quick.url]}, server={"request_timeout_s": 0.5, "stream_deadline_s": 30})
    async with epp_stack(fast, pool=[quick.port]) as stack:
        async with aiohttp.ClientSession() as s, s.post(stack.url + CHAT, json=chat("x", stream=True)) as r:
            events = events_of(await r.read())
        assert r.status == 200 and events[-1] == "[DONE]" and not any(
            isinstance(e, dict) and "error" in e for e in events)


async def test_the_drain_refuses_new_streams_finishes_short_ones_and_ends_the_rest(engines: Engines) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    (engine,) = await engines(1, inter_token_delay_s=0.05)
    settings = settings_for({"m1": [engine.url]}, server={"auth": "api_key", "drain_close_s": 2},
                            tenancy=tenancy())
    async with epp_stack(settings, pool=[engine.port]) as stack:
        assert stack.epp is not None

        async def stream(max_tokens: int) -> list[Any]:
            async with aiohttp.ClientSession() as s, s.post(stack.url + CHAT, headers=auth("acme"), json=chat(
                    "a b c", max_tokens=max_tokens, stream=True)) as r:
                assert r.status == 200
                return events_of(await r.read())

        long = asyncio.create_task(stream(200))  # 10 s of tokens: outlives the drain
        short = asyncio.create_task(stream(10))  # 0.5 s: ends by itself within it
        await until(lambda: engine.stats.requests == 2)
        started = time.monotonic()
        stopping = asyncio.create_task(stack.epp.stop(drain_s=1.5))
        async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.epp.port}") as channel:
            health = health_pb2_grpc.HealthStub(channel)
            await asyncio.sleep(0.1)
            try:  # not ready: NOT_SERVING, or the RPC refused (the server takes no new RPC while draining)
                answer = await health.Check(health_pb2.HealthCheckRequest(service="readiness"), timeout=1)
                assert answer.status == health_pb2.HealthCheckResponse.NOT_SERVING
            except grpc.aio.AioRpcError:
                pass
        async with aiohttp.ClientSession() as s, s.post(stack.url + CHAT, headers=auth("acme"),
                                                        json=chat("new")) as r:
            assert r.status >= 500  # FailClose: a picker that is stopping takes no new request
        short_events, long_events = await short, await long
        await stopping
        took = time.monotonic() - started
        assert len(contents(short_events)) == 10 and short_events[-1] == "[DONE]"
        assert not any(isinstance(e, dict) and "error" in e for e in short_events)
        assert long_events[-2]["error"]["code"] == "server_shutting_down" and long_events[-1] == "[DONE]"
        assert 1 <= len(contents(long_events)) < 200
        assert 1.4 < took < 4.0  # drain_s, then the open stream is ended at once
        await until(lambda: engine.stats.cancelled == 1)
        acme = await ledger(stack, "acme")
        assert acme["requests"] == 2 and acme["errors"] == 1
        assert 10 + len(contents(long_events)) <= tokens(acme)[1] <= engine.stats.completion_tokens
    assert engine.stats.requests == 2  # the request sent while draining never reached it


async def test_sigterm_drains_the_picker_process_and_it_exits(engines: Engines, tmp_path: Path) -> None:
    """`fleetgate epp` as its own process: SIGTERM ends the open stream cleanly and the process exits 0."""
    (engine,) = await engines(1, inter_token_delay_s=0.05)
    port, listen = free_port(), free_port()
    config = tmp_path / "epp.yaml"
    config.write_text(yaml.safe_dump({
        "server": {"auth": "open", "metrics_port": None, "log_requests": False, "drain_s": 0.5, "drain_close_s": 1},
        "models": [{"name": "m1", "endpoints": [engine.url]}], "epp": {"port": port}}))
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "fleetgate", "epp", "--config", str(config),
                                                env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        envoy = EnvoyProcess(envoy_config(listen=("127.0.0.1", listen), epp=("127.0.0.1", port),
                                          pool=[("127.0.0.1", engine.port)], health_interval_s=0.2))
        await asyncio.to_thread(envoy.__enter__)
        try:
            url = f"http://127.0.0.1:{listen}"
            async with aiohttp.ClientSession() as s:
                deadline = time.monotonic() + 30
                while True:  # the process has started and Envoy's health check has seen it
                    async with s.post(url + CHAT, json=chat("warm", max_tokens=1)) as r:
                        if r.status == 200:
                            break
                    assert time.monotonic() < deadline, "the picker did not come up"
                    await asyncio.sleep(0.2)
                async with s.post(url + CHAT, json=chat("a b c", max_tokens=200, stream=True)) as r:
                    assert r.status == 200
                    await r.content.readline()  # the stream has begun
                    proc.send_signal(signal.SIGTERM)
                    started = time.monotonic()
                    events = events_of(await r.read())
            assert events[-2]["error"]["code"] == "server_shutting_down" and events[-1] == "[DONE]"
            code = await asyncio.wait_for(proc.wait(), 15)
            assert code == 0 and time.monotonic() - started < 10
        finally:
            await asyncio.to_thread(envoy.__exit__, None, None, None)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
