"""`fleetgate bench faults`, scenario `restart`: `kill -9` Redis under load with streams in flight, restart it
empty, and compare the budget counter with the ledger (issue 26, defect 3).

R replicas on one `redis-server` serve C steady clients plus S clients that each keep one slow stream open
(a fake engine at `--itl-ms` per token). Once at least `--in-flight` requests are at the engine, Redis gets
SIGKILL (no persistence: every counter, epoch key and ledger row is lost), stays down `--down-s` seconds and
comes back empty on the same port. Printed: requests in flight at the kill, how long the limits took to come
back, and the ledger (what the tenant was charged after the kill) against the budget counter, with the
difference in micro-dollars and in reservations (the target: within one reservation).
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import httpx

from fleetgate.bench.faults import ADMIN, AUTH, BODY, PRICE, SteadyLoad, _wait_up, gateways, settings
from fleetgate.core.localredis import LocalRedis, free_port
from fleetgate.core.types import Usage
from fleetgate.gateway.estimate import estimate_request
from fleetgate.gateway.parsing import parse_request
from fleetgate.gateway.tenancy.config import ListPrice
from fleetgate.gateway.tenancy.pricing import cost_micros, list_rates
from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

STREAM: dict[str, Any] = {**BODY, "max_tokens": 20, "stream": True}


async def _streamer(url: str, stop: asyncio.Event, statuses: list[int], limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    async with httpx.AsyncClient(base_url=url, timeout=15) as c:
        while not stop.is_set() and time.monotonic() < deadline:
            async with c.stream("POST", "/v1/chat/completions", json=STREAM, headers=AUTH) as r:
                async for _ in r.aiter_bytes():
                    pass
            statuses.append(r.status_code)


async def _idle(engine: FakeEngine, limit_s: float = 15.0) -> None:
    deadline = time.monotonic() + limit_s
    while engine.stats.running and time.monotonic() < deadline:  # noqa: ASYNC110 - the engine's own counter
        await asyncio.sleep(0.02)


async def restart(args: argparse.Namespace) -> None:
    engine = await FakeEngine(FakeEngineConfig(model="m1", inter_token_delay_s=args.itl_ms / 1000)).start()
    port = free_port()
    first = LocalRedis(port=port).start()
    second: LocalRedis | None = None
    try:
        async with gateways(settings({"m1": engine.url}, first.url), args.replicas) as apps:
            urls = [u for u, _ in apps]
            load = SteadyLoad(urls, clients=args.clients, gap_s=args.gap_ms / 1000)
            stop, streamed = asyncio.Event(), list[int]()
            streams = [asyncio.ensure_future(_streamer(urls[i % len(urls)], stop, streamed, 60.0))
                       for i in range(args.streams)]
            load.start()
            deadline = time.monotonic() + 15
            while engine.stats.running < args.in_flight and time.monotonic() < deadline:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            in_flight = engine.stats.running
            first.kill()
            await asyncio.sleep(args.down_s)
            second = await asyncio.to_thread(LocalRedis(port=port).start)
            back = time.monotonic()
            took = await _wait_up(apps, back)
            await asyncio.sleep(1.0)
            stop.set()
            await load.stop()
            await asyncio.gather(*streams)
            await _idle(engine)
            async with httpx.AsyncClient(timeout=10) as c:
                for u, app in apps:
                    await app.state.pipeline.drain()
                    await c.post(u + "/v1/chat/completions", json=BODY, headers=AUTH)  # writes what was queued
                    await app.state.pipeline.drain()
                totals = (await c.get(urls[0] + "/v1/usage", headers={"Authorization": f"Bearer {ADMIN}"})
                          ).json()["totals"]
                budgets = (await c.get(urls[0] + "/v1/usage/budgets", headers=AUTH)).json()
    finally:
        await engine.stop()
        first.stop()
        if second is not None:
            second.stop()
    counter = budgets["data"][0]["windows"]["daily_budget"]["used"]
    ledger = totals["cost_micros"]
    rates = list_rates(ListPrice.model_validate(PRICE))
    estimate = estimate_request(parse_request("chat", httpx.Request("POST", "/", json=STREAM).content))
    reservation = cost_micros(Usage(prompt_tokens=estimate.prompt_tokens, completion_tokens=20), rates)
    codes = [code for _, code in load.statuses] + streamed
    failed = {code: codes.count(code) for code in sorted(set(codes)) if code != 200}
    print(f"[restart] kill -9 of Redis with {in_flight} requests in flight ({args.streams} stream clients, "
          f"{args.clients} steady clients, {args.replicas} replicas), {args.down_s:g} s down, restarted empty: "
          f"limits back {took * 1000:.0f} ms after Redis; non-200 {failed or 'none'} of {len(codes)} (a 504 is "
          f"an engine stream silent past inter_chunk_timeout_s=0.5 s on a loaded machine)")
    print(f"[restart] ledger {ledger} µ$ vs budget counter {counter:.0f} µ$ after the restart: difference "
          f"{counter - ledger:+.0f} µ$ = {(counter - ledger) / reservation:+.2f} reservations of {reservation} µ$ "
          f"(target: within one); ratio {counter / max(ledger, 1):.4f} ({totals['requests']} requests recorded)")
