"""`fleetgate bench faults`: limits and spend under faults, on real gateways (uvicorn, loopback), a real
`redis-server` and fake engines. One run prints the issue-14 figures:

1. Recovery: R replicas under steady load (C clients, one request per `--gap-ms` each); Redis is paused
   (`CLIENT PAUSE`, with `on_store_error: open` and `closed`) and, separately, killed and restarted. Printed:
   seconds from Redis being back to every replica using it again, against the 1 s target and against
   `store_retry_s` (the design bound: one probe per back-off).
2. Spend lost: a mixed run over the replicas with clients that leave at every stage (before the headers,
   mid-stream, while waiting for a non-streaming answer), engines that die mid-stream or send malformed
   usage, and a Redis pause in the middle. What the engines processed (their own counters: a prompt
   once prefilled, each completion token once generated) against what the ledger charged. Lost = the
   processed tokens not charged; over-charged = estimates above what was processed (prefill cut short).
2b. Restart (`faults_restart`): `kill -9` Redis with 40 requests in flight (most of them streams), restart it
   empty: the ledger against the budget counter, in reservations (target: within one).
3. Overrun: R replicas racing on one small daily budget with requests whose real usage the reservation
   used to miss (`n`, prompt lists, no `max_tokens`, 200 one-character chat messages). Spend against the
   budget, and the overrun against its bound: one bounded reservation per replica.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson
import redis

from fleetgate.core.localredis import LocalRedis, free_port
from fleetgate.core.types import Usage
from fleetgate.gateway.estimate import estimate_request
from fleetgate.gateway.parsing import parse_request
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.tenancy.config import ListPrice
from fleetgate.gateway.tenancy.keys import new_key
from fleetgate.gateway.tenancy.pricing import cost_micros, list_rates
from fleetgate.sim.fake_engine import FakeEngine, FakeEngineConfig

PRICE = {"input_usd_per_1m": "1", "output_usd_per_1m": "2"}  # 1 µ$ per prompt token, 2 per completion token
KEY, KEY_HASH = new_key()
ADMIN, ADMIN_HASH = new_key()
AUTH = {"Authorization": f"Bearer {KEY}"}
BODY: dict[str, Any] = {"model": "m1", "max_tokens": 5, "messages": [{"role": "user", "content": "one two three"}]}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--replicas", type=int, default=3, help="gateway replicas sharing one Redis")
    parser.add_argument("--clients", type=int, default=6, help="steady-load clients (recovery phase)")
    parser.add_argument("--gap-ms", type=float, default=20.0, help="pause between a client's requests")
    parser.add_argument("--pause-ms", type=int, default=3000, help="CLIENT PAUSE length (the issue's repro)")
    parser.add_argument("--requests", type=int, default=300, help="requests in the lost-spend run")
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--streams", type=int, default=36, help="restart: clients each keeping a stream open")
    parser.add_argument("--in-flight", type=int, default=40, help="restart: kill once this many are at the engine")
    parser.add_argument("--itl-ms", type=float, default=20.0, help="restart: the engine's time per streamed token")
    parser.add_argument("--down-s", type=float, default=2.0, help="restart: seconds Redis stays down")
    parser.add_argument("--scenarios", default="recovery,restart,spend,overrun",
                        help="which scenarios to run, comma-separated")


def settings(engines: dict[str, str], redis_url: str, *, policy: str = "open", budget_usd: str = "100",
             default_max_tokens: int = 256) -> GatewaySettings:
    return GatewaySettings.model_validate({
        "server": {"auth": "api_key", "log_requests": False, "default_max_tokens": default_max_tokens,
                   "inter_chunk_timeout_s": 0.5},
        "models": [{"name": name, "endpoints": [url]} for name, url in engines.items()],
        "redis_url": redis_url,
        "tenancy": {"admin_key_hashes": [ADMIN_HASH], "prices": {name: PRICE for name in engines},
                    "on_store_error": policy, "redis_timeout_s": 0.5,
                    "tenants": [{"id": "acme", "key_hashes": [KEY_HASH], "daily_budget_usd": budget_usd,
                                 "tpm": 10**9}]},
    })


@contextlib.asynccontextmanager
async def gateways(config: GatewaySettings, replicas: int) -> AsyncIterator[list[tuple[str, Any]]]:
    """`replicas` gateway apps on loopback: (base URL, app) each."""
    import logging

    from fleetgate.gateway.serve import build_server

    logging.getLogger("fleetgate").setLevel(logging.ERROR)  # outages log a warning per failure
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)  # fake engines writing to a hung-up client
    servers = []
    out = []
    for _ in range(replicas):
        port = free_port()
        server = build_server(config, host="127.0.0.1", port=port, metrics_port=0)  # replicas share no port
        server.config.log_level = "error"
        task = asyncio.ensure_future(server.serve())
        for _ in range(500):
            if server.started:
                break
            await asyncio.sleep(0.01)
        servers.append((server, task))
        out.append((f"http://127.0.0.1:{port}", server.config.app))
    try:
        yield out
    finally:
        for server, _ in servers:
            server.should_exit = True
        await asyncio.gather(*(asyncio.wait_for(t, 10) for _, t in servers), return_exceptions=True)


def _down(apps: list[tuple[str, Any]]) -> bool:
    return any(app.state.stages.limiter.limiter.circuit.down for _, app in apps)


class SteadyLoad:
    """Bounded steady traffic: each client sends BODY, sleeps `gap_s`, until stopped or `limit_s` passed."""

    def __init__(self, urls: list[str], *, clients: int, gap_s: float, limit_s: float = 60.0) -> None:
        self.urls, self.clients, self.gap_s, self.limit_s = urls, clients, gap_s, limit_s
        self.statuses: list[tuple[float, int]] = []
        self._stop = False
        self._tasks: list[asyncio.Task[None]] = []

    async def _client(self, i: int) -> None:
        deadline = time.monotonic() + self.limit_s
        async with httpx.AsyncClient(base_url=self.urls[i % len(self.urls)], timeout=10) as c:
            while not self._stop and time.monotonic() < deadline:
                r = await c.post("/v1/chat/completions", json=BODY, headers=AUTH)
                self.statuses.append((time.monotonic(), r.status_code))
                await asyncio.sleep(self.gap_s)

    def start(self) -> None:
        self._tasks = [asyncio.ensure_future(self._client(i)) for i in range(self.clients)]

    async def stop(self) -> None:
        self._stop = True
        await asyncio.gather(*self._tasks)


async def _wait_up(apps: list[tuple[str, Any]], since: float, *, limit_s: float = 30.0) -> float:
    """Seconds from `since` until no replica has its limits store marked down (polled: the state is the
    limiter's own, with no event to wait on)."""
    deadline = time.monotonic() + limit_s
    while _down(apps) and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.005)
    return time.monotonic() - since


async def recovery(args: argparse.Namespace, engine: FakeEngine) -> None:
    for policy in ("open", "closed"):
        with LocalRedis() as server:
            async with gateways(settings({"m1": engine.url}, server.url, policy=policy), args.replicas) as apps:
                load = SteadyLoad([u for u, _ in apps], clients=args.clients, gap_s=args.gap_ms / 1000)
                load.start()
                await asyncio.sleep(0.5)
                control = redis.Redis.from_url(server.url)
                control.execute_command("CLIENT", "PAUSE", str(args.pause_ms), "ALL")
                back = time.monotonic() + args.pause_ms / 1000
                await asyncio.sleep(args.pause_ms / 1000)
                took = await _wait_up(apps, back)
                await asyncio.sleep(1.0)
                await load.stop()
                control.close()
                rate = len(load.statuses) / (load.statuses[-1][0] - load.statuses[0][0])
                refused = sum(1 for _, s in load.statuses if s == 503)
                late = [s for t, s in load.statuses if t > back + 1.0]
                retry = apps[0][1].state.settings.tenancy.store_retry_s
                print(f"[recovery] pause {args.pause_ms} ms, on_store_error={policy}, {rate:.0f} req/s over "
                      f"{args.replicas} replicas: limits store back {took * 1000:.0f} ms after Redis "
                      f"({took:.2f}x the 1 s target, {took / retry:.2f}x store_retry_s={retry:g}s); "
                      f"503s {refused}; after +1 s: {late.count(200)}/{len(late)} served")
    port = free_port()
    first = LocalRedis(port=port).start()
    second: LocalRedis | None = None
    try:
        async with gateways(settings({"m1": engine.url}, first.url), args.replicas) as apps:
            load = SteadyLoad([u for u, _ in apps], clients=args.clients, gap_s=args.gap_ms / 1000)
            load.start()
            await asyncio.sleep(0.5)
            first.stop()
            await asyncio.sleep(1.0)
            second = await asyncio.to_thread(LocalRedis(port=port).start)
            back = time.monotonic()
            took = await _wait_up(apps, back)
            await asyncio.sleep(0.5)
            await load.stop()
            print(f"[recovery] kill + restart (1 s down), on_store_error=open: limits store back "
                  f"{took * 1000:.0f} ms after Redis ({took:.2f}x the 1 s target); "
                  f"{sum(1 for _, s in load.statuses if s != 200)} non-200 of {len(load.statuses)}")
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def _one_mixed(url: str, rng: random.Random, model: str) -> None:
    stream = rng.random() < 0.5
    body = {**BODY, "model": model, "max_tokens": rng.randint(5, 40), "stream": stream}
    leave = rng.choice([None, None, 0.01, 0.05, 0.15])  # None: waits for the end
    async with httpx.AsyncClient(base_url=url, timeout=leave or 10) as c:
        with contextlib.suppress(httpx.TimeoutException):
            if stream:
                async with c.stream("POST", "/v1/chat/completions", json=body, headers=AUTH) as r:
                    async for _ in r.aiter_bytes():
                        pass
            else:
                await c.post("/v1/chat/completions", json=body, headers=AUTH)


async def lost_spend(args: argparse.Namespace) -> None:
    rng = random.Random(args.seed)
    configs = {"m1": FakeEngineConfig(model="m1", inter_token_delay_s=0.004, prefill_delay_s=0.01),
               "m2": FakeEngineConfig(model="m2", inter_token_delay_s=0.004, drop_after_chunks=7),
               "m3": FakeEngineConfig(model="m3", inter_token_delay_s=0.004, usage_override="broken")}
    engines = {name: await FakeEngine(cfg).start() for name, cfg in configs.items()}
    try:
        with LocalRedis() as server:
            config = settings({n: e.url for n, e in engines.items()}, server.url)
            async with gateways(config, args.replicas) as apps:
                control = redis.Redis.from_url(server.url)
                urls = [u for u, _ in apps]
                sem = asyncio.Semaphore(24)

                async def job(i: int) -> None:
                    model = rng.choices(["m1", "m2", "m3"], weights=[8, 1, 1])[0]
                    async with sem:
                        await _one_mixed(urls[i % len(urls)], rng, model)
                    if i == args.requests // 2:
                        control.execute_command("CLIENT", "PAUSE", "1500", "ALL")
                        pause_end.append(time.monotonic() + 1.5)

                pause_end: list[float] = []
                started = time.monotonic()
                await asyncio.gather(*(job(i) for i in range(args.requests)))
                deadline = time.monotonic() + 10
                while any(e.stats.running for e in engines.values()) and time.monotonic() < deadline:  # noqa: ASYNC110
                    await asyncio.sleep(0.02)
                # Queued ledger rows and counter moves are written by the next request that reaches Redis:
                # send one per replica once the pause is over and the back-off has passed.
                await asyncio.sleep(max(0.0, pause_end[0] - time.monotonic()) + 0.3)
                async with httpx.AsyncClient(timeout=10) as c:
                    for u, app in apps:
                        await c.post(u + "/v1/chat/completions", json=BODY, headers=AUTH)
                        await app.state.pipeline.drain()
                    pending = sum(app.state.stages.accountant.accountant.pending
                                  + app.state.stages.limiter.limiter.circuit.pending for _, app in apps)
                    totals = (await c.get(urls[0] + "/v1/usage", headers={"Authorization": f"Bearer {ADMIN}"})
                              ).json()["totals"]
                    budgets = (await c.get(urls[0] + "/v1/usage/budgets", headers=AUTH)).json()
                control.close()
                elapsed = time.monotonic() - started
    finally:
        for e in engines.values():
            await e.stop()
    counter = budgets["data"][0]["windows"]["daily_budget"]["used"]
    done_prompt = sum(e.stats.prompt_tokens for e in engines.values())
    done_completion = sum(e.stats.completion_tokens for e in engines.values())
    cancelled = sum(e.stats.cancelled for e in engines.values())
    lost_p = max(0, done_prompt - totals["prompt_tokens"])
    lost_c = max(0, done_completion - totals["completion_tokens"])
    print(f"[spend] {args.requests + args.replicas} requests in {elapsed:.1f} s over {args.replicas} replicas "
          f"(clients leaving at every stage, {cancelled} aborted at the engine; engines dying mid-stream or "
          f"sending malformed usage; a 1.5 s Redis pause mid-run)")
    print(f"[spend] engines processed prompt={done_prompt} completion={done_completion}; ledger charged "
          f"prompt={totals['prompt_tokens']} completion={totals['completion_tokens']}")
    print(f"[spend] lost: {lost_p + lost_c} tokens ({lost_c} completion = "
          f"{lost_c / max(done_completion, 1):.4f} of completion; tokens generated after the hang-up, before the "
          f"engine saw it); over-charged prompt estimates: {max(0, totals['prompt_tokens'] - done_prompt)} tokens; "
          f"budget counter {counter} µ$ vs ledger {totals['cost_micros']} µ$ "
          f"(ratio {counter / max(totals['cost_micros'], 1):.4f}); still queued: {pending}")


async def overrun(args: argparse.Namespace, engine: FakeEngine) -> None:
    budget = 20_000
    shapes: list[tuple[str, dict[str, Any]]] = [
        ("chat", {"model": "m1", "n": 8, "max_tokens": 20, "messages": [{"role": "user", "content": "hi there"}]}),
        ("completions", {"model": "m1", "max_tokens": 10, "prompt": ["a b", "c d", "e f", "g h", "i j"]}),
        ("chat", {"model": "m1", "messages": [{"role": "user", "content": "no max_tokens"}]}),
        ("chat", {"model": "m1", "max_tokens": 4, "messages": [{"role": "user", "content": "x"}] * 200}),
    ]
    rates = list_rates(ListPrice.model_validate(PRICE))
    bounded = 0
    for kind, body in shapes:
        est = estimate_request(parse_request("chat" if kind == "chat" else "completions", orjson.dumps(body)))
        per_seq = body.get("max_tokens", 64)
        bounded = max(bounded, cost_micros(Usage(prompt_tokens=est.prompt_tokens,
                                                 completion_tokens=per_seq * est.sequences), rates))
    with LocalRedis() as server:
        config = settings({"m1": engine.url}, server.url, budget_usd=str(budget / 1e6), default_max_tokens=64)
        async with gateways(config, args.replicas) as apps:
            codes: list[int] = []

            async def client(i: int) -> None:
                async with httpx.AsyncClient(base_url=apps[i % len(apps)][0], timeout=20) as c:
                    for k in range(30):
                        kind, body = shapes[(i + k) % len(shapes)]
                        path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
                        codes.append((await c.post(path, json=body, headers=AUTH)).status_code)

            await asyncio.gather(*(client(i) for i in range(3 * args.replicas)))
            for _, app in apps:
                await app.state.pipeline.drain()
            async with httpx.AsyncClient(timeout=10) as c:
                totals = (await c.get(apps[0][0] + "/v1/usage", headers={"Authorization": f"Bearer {ADMIN}"})
                          ).json()["totals"]
    spent = totals["cost_micros"]
    over = max(0, spent - budget)
    bound = args.replicas * bounded
    print(f"[overrun] {len(codes)} requests (n=8, 5-prompt lists, no max_tokens with an engine default of 200, "
          f"200 one-character messages) from {3 * args.replicas} clients over {args.replicas} replicas: "
          f"{codes.count(200)} served, {codes.count(429)} refused; spent {spent} µ$ = {spent / budget:.3f} x the "
          f"{budget} µ$ budget; overrun {over} µ$ vs bound {bound} µ$ ({args.replicas} x the largest bounded "
          f"reservation {bounded} µ$): {over / bound:.3f} of the bound")


def run(args: argparse.Namespace) -> int:
    from fleetgate.bench.faults_restart import restart

    chosen = {s.strip() for s in args.scenarios.split(",")}

    async def main() -> None:
        engine = await FakeEngine(FakeEngineConfig(model="m1", default_max_tokens=200)).start()
        try:
            if "recovery" in chosen:
                await recovery(args, engine)
            if "restart" in chosen:
                await restart(args)
            if "spend" in chosen:
                await lost_spend(args)
            if "overrun" in chosen:
                await overrun(args, engine)
        finally:
            await engine.stop()

    asyncio.run(main())
    return 0
