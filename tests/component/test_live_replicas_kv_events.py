"""A precise-prefix door of two gateway replicas (`fleetgate.bench.live_replicas`): each replica subscribes to the
engines' KV events itself (the engines publish once, every subscriber gets every batch), so both replicas apply the
batches that requests through either of them produced, and the harness's summed counter is the two together."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from pathlib import Path

import aiohttp
import pytest

from fleetgate.bench.live_client import completion_body
from fleetgate.bench.live_gateway import Keys, kv_event_routes, resolve_profile, template_vars
from fleetgate.bench.live_points import kv_event_counts, kv_event_counts_of
from fleetgate.bench.live_replicas import start_gateways
from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

pytestmark = [pytest.mark.redis, pytest.mark.slow]


async def _batches(session: aiohttp.ClientSession, metrics_url: str, at_least: float, *, timeout_s: float = 15.0
                   ) -> float:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        seen = (await kv_event_counts(session, metrics_url)).get("batches", 0.0)
        if seen >= at_least or asyncio.get_running_loop().time() > deadline:
            return seen
        await asyncio.sleep(0.2)


async def test_each_replica_of_a_precise_door_applies_every_engines_events() -> None:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not installed: run `scripts/install` (apt-get install redis-server)")
    sockdir = Path(tempfile.mkdtemp(prefix="kvr", dir="/tmp"))  # short: ipc paths have a length limit
    engines = [await FakeEngine(FakeEngineConfig(model="llama-3.1-8b", kv_events=f"ipc://{sockdir}/e{i}",
                                                 kv_replay=f"ipc://{sockdir}/r{i}", kv_block_size=16)).start()
               for i in range(2)]
    urls = [e.url.removesuffix("/v1") for e in engines]
    keys = Keys.make(1)
    profile = resolve_profile("precise-prefix", configs={}, variables=template_vars(
        urls=urls, kv_events=[], model_dir="", block_size=16))
    routes = kv_event_routes(urls=urls, publishers=[f"ipc://{sockdir}/e{i}" for i in range(2)],
                             replays=[f"ipc://{sockdir}/r{i}" for i in range(2)], topic="")
    door = await asyncio.to_thread(start_gateways, profile, replicas=2, redis_binary=shutil.which("redis-server"),
                                   model="llama-3.1-8b", urls=urls, keys=keys, workdir=sockdir, timeout_s=90,
                                   kv_events=routes)
    try:
        await asyncio.sleep(1.0)  # the subscriptions connect
        headers = {"Authorization": f"Bearer {keys.tenants['t0']}", "Content-Type": "application/json"}
        async with aiohttp.ClientSession() as session:
            for i in range(8):  # requests through replica 0 only: their prefills publish on the engines
                prompt = f"document {i} " + " ".join(f"w{i}-{k}" for k in range(200))
                async with session.post(f"{door.urls[0]}/v1/completions", headers=headers,
                                        data=completion_body(model="llama-3.1-8b", prompt=prompt, max_tokens=2)) as r:
                    assert r.status == 200, await r.text()
                    await r.read()
            first = await _batches(session, door.metrics_urls[0], 8)
            second = await _batches(session, door.metrics_urls[1], first)
            summed = await kv_event_counts_of(session, door.metrics_urls)
    finally:
        await asyncio.to_thread(door.stop)
        for e in engines:
            await e.stop()
        shutil.rmtree(sockdir, ignore_errors=True)
    assert first >= 8, first  # one batch per request's prefill at least
    assert second >= first, (first, second)  # replica 1 served none of them and still applied every batch
    assert summed["batches"] >= first + second
