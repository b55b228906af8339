"""One configuration of the cost benchmark: a fresh fleet, a fresh gateway, the whole workload.

Every request goes through the real gateway pipeline over HTTP (keys, limits, cache, tiers,
endpoint picking, streaming relay, accounting) to simulated engines. Each response is scored
against the workload's ground truth:
- a cache hit is correct when the answer it replays was produced for a request with the same
  `answer_key` (the simulated engine tags each answer with a digest of its prompt; the benchmark
  maps digests of answers it saw produced to their answer keys);
- a request that `needs_tier == "large"` is recalled when the large tier served it.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from fleetgate.bench.cost_fleet import RunningFleet, TierDeployment, start_fleet
from fleetgate.bench.workload import WorkItem, Workload
from fleetgate.core.localredis import free_port

TAG = re.compile(r"\[answer:([0-9a-f]{12})\]")


@dataclass(frozen=True, slots=True)
class BenchConfig:
    name: str
    cache: bool
    prefix_routing: bool
    tiers: bool


CONFIGS: tuple[BenchConfig, ...] = (
    BenchConfig("naive", cache=False, prefix_routing=False, tiers=False),
    BenchConfig("+cache", cache=True, prefix_routing=False, tiers=False),
    BenchConfig("+prefix-routing", cache=False, prefix_routing=True, tiers=False),
    BenchConfig("+tiers", cache=False, prefix_routing=False, tiers=True),
    BenchConfig("all-on", cache=True, prefix_routing=True, tiers=True),
)


@dataclass(slots=True)
class Outcome:
    item: WorkItem
    status: int
    ttft_s: float | None  # simulated seconds (wall / time_scale)
    cache: str
    tier: str | None
    tag: str | None
    error: str | None = None


@dataclass(slots=True)
class ConfigResult:
    config: BenchConfig
    outcomes: list[Outcome] = field(default_factory=list)
    gpu_seconds: dict[str, float] = field(default_factory=dict)
    dollars: dict[str, float] = field(default_factory=dict)
    engine_calls: dict[str, int] = field(default_factory=dict)
    prefix_hit_rate: float = 0.0
    wall_s: float = 0.0
    accounted_usd: float | None = None


def _keys(tenants: list[str]) -> dict[str, str]:
    return {t: f"fg-bench-{t}-0123456789abcdef0123456789abcdef" for t in tenants}


def gateway_settings(
    config: BenchConfig, fleet: RunningFleet, *, tenants: list[str], keys: dict[str, str]
) -> Any:
    from fleetgate.gateway.settings import GatewaySettings, ModelRoute, ServerSettings
    from fleetgate.gateway.tenancy.config import GpuPrice, TenancyConfig, TenantConfig
    from fleetgate.gateway.tenancy.keys import hash_key
    from fleetgate.router.tiers.config import Alias, TierConfig
    from fleetgate.router.tiers.config import Tier as TierSpec

    deps = {d.tier: d for d in fleet.deployments}
    models = [ModelRoute(name=d.model, endpoints=fleet.fleets[d.tier].urls) for d in fleet.deployments]
    prices = {
        d.model: GpuPrice(kind="gpu", gpu_type=d.gpu_type, gpu_count=d.gpus_per_replica,
                          usd_per_gpu_hour=d.usd_per_gpu_hour,  # type: ignore[arg-type]
                          fallback_tokens_per_hour=_fallback_tokens_per_hour(d), min_tokens=10**12)
        for d in fleet.deployments
    }
    tenancy = TenancyConfig(
        admin_key_hashes=[hash_key(keys["__admin__"])],
        tenants=[TenantConfig(id=t, key_hashes=[hash_key(keys[t])], daily_budget_usd=1000,  # type: ignore[arg-type]
                              rpm=100_000) for t in tenants],
        prices=prices,  # type: ignore[arg-type]
    )
    tiers = TierConfig(aliases={"auto": Alias(tiers=[
        TierSpec(name="small", model=deps["small"].model, relative_cost=1.0),
        TierSpec(name="large", model=deps["large"].model, relative_cost=8.0),
    ])})
    data: dict[str, Any] = {
        "server": ServerSettings(auth="api_key", debug_headers=True, port=0),
        "models": models,
        "tiers": tiers,
        "tenancy": tenancy,
    }
    from fleetgate.cache.config import CacheConfig

    data["cache"] = CacheConfig(enabled=config.cache)
    return GatewaySettings(**data)


def _fallback_tokens_per_hour(d: TierDeployment) -> int:
    """Rough tokens/hour of one replica at a typical batch, for the accountant's GPU-derived price."""
    p = d.profile
    step = p.step_overhead_s + p.decode_s_per_seq * 16
    return int(16 / step * 3600)


async def _one(
    session: aiohttp.ClientSession, url: str, item: WorkItem, *, model: str, key: str, time_scale: float
) -> Outcome:
    body = item.body(model=model)
    body["stream"] = True
    t0 = time.perf_counter()
    ttft: float | None = None
    text: list[str] = []
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    try:
        async with session.post(url, data=orjson.dumps(body), headers=headers) as resp:
            cache = resp.headers.get("x-fleetgate-cache", "")
            tier = resp.headers.get("x-fleetgate-tier")
            if resp.status != 200:
                return Outcome(item, resp.status, None, cache, tier, None, error=(await resp.text())[:200])
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = orjson.loads(line[6:])
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        if ttft is None:
                            ttft = (time.perf_counter() - t0) / time_scale
                        text.append(piece)
    except (aiohttp.ClientError, TimeoutError) as exc:  # the session's total timeout raises TimeoutError
        return Outcome(item, 0, None, "", None, None, error=str(exc) or type(exc).__name__)
    match = TAG.search("".join(text))
    return Outcome(item, 200, ttft, cache.split(";")[0].strip(), tier, match.group(1) if match else None)


async def replay(
    session: aiohttp.ClientSession,
    url: str,
    workload: Workload,
    *,
    model_of: Callable[[WorkItem], str],
    keys: dict[str, str],
    time_scale: float,
    progress: Any = None,
    name: str = "",
) -> list[Outcome]:
    """Send every item at its arrival time (scaled) and wait for all answers, in workload order. On an
    error or a cancellation (Ctrl-C) the requests still in flight are cancelled before it propagates."""
    t0 = time.perf_counter()
    tasks: list[asyncio.Task[Outcome]] = []
    try:
        for i, item in enumerate(workload.items):
            delay = item.at_s * time_scale - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(
                _one(session, url, item, model=model_of(item), key=keys[item.tenant], time_scale=time_scale)))
            if progress is not None and (i + 1) % 100 == 0:
                progress(f"  {name}: sent {i + 1}/{len(workload.items)}")
        return list(await asyncio.gather(*tasks))
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise


async def stop_gateway(server: Any, serve_task: asyncio.Task[None] | None, *, timeout_s: float = 30.0) -> None:
    """Ask a gateway started by `start_in_background` to exit and wait for it, at most `timeout_s` (then
    cancel it); nothing to do when it never started. Raises what the serving task raised."""
    if server is None or serve_task is None:
        return
    server.should_exit = True
    await asyncio.wait_for(serve_task, timeout=timeout_s)


async def run_config(
    config: BenchConfig,
    workload: Workload,
    deployments: tuple[TierDeployment, ...],
    *,
    time_scale: float,
    progress: Any = None,
) -> ConfigResult:
    from fleetgate.gateway.serve import build_server, metrics_url, start_in_background
    from fleetgate.router.roundrobin import RoundRobinScheduler

    tenants = sorted({item.tenant for item in workload.items})
    keys = _keys(tenants)
    keys["__admin__"] = "fg-bench-admin-0123456789abcdef0123456789abcdef"
    fleet = await start_fleet(deployments)
    result = ConfigResult(config=config)
    server = serve_task = None
    try:
        settings = gateway_settings(config, fleet, tenants=tenants, keys=keys)
        overrides: dict[str, Any] = {} if config.prefix_routing else {"scheduler": RoundRobinScheduler()}
        port = free_port()
        server = build_server(settings, host="127.0.0.1", port=port, metrics_port=0, **overrides)
        serve_task = await start_in_background(server)
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        large = next(d for d in deployments if d.tier == "large").model
        model = "auto" if config.tiers else large
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:
            await _warm_up(session, port, key=keys[tenants[0]], model=model, cache=config.cache,
                           metrics_url=metrics_url(server) or "")
            fleet.reset_counters()
            t0 = time.perf_counter()
            result.outcomes = await replay(session, url, workload, model_of=lambda _: model, keys=keys,
                                           time_scale=time_scale, progress=progress, name=config.name)
            result.accounted_usd = await _accounted_usd(session, port, keys["__admin__"])
        result.wall_s = time.perf_counter() - t0
    finally:
        try:
            await stop_gateway(server, serve_task)
        finally:
            result.gpu_seconds = fleet.gpu_seconds()
            result.dollars = fleet.dollars()
            result.engine_calls = fleet.engine_calls()
            result.prefix_hit_rate = fleet.prefix_hit_rate()
            await fleet.aclose()
    return result


async def _warm_up(
    session: aiohttp.ClientSession, port: int, *, key: str, model: str, cache: bool, metrics_url: str
) -> None:
    """Load what loads lazily (the embedders) before the clock starts: one request, then wait until the
    cache has stored it (the semantic layer embeds it first)."""
    body = {"model": model, "max_tokens": 512, "temperature": 0,  # room to finish: only "stop" is stored
            "messages": [{"role": "user", "content": "warm-up request, please ignore"}]}
    async with session.post(f"http://127.0.0.1:{port}/v1/chat/completions", data=orjson.dumps(body),
                            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"}) as r:
        await r.read()
    deadline = time.monotonic() + 120
    while cache and time.monotonic() < deadline:
        async with session.get(metrics_url) as r:
            if 'fleetgate_cache_stores_total{result="stored"}' in await r.text():
                return
        await asyncio.sleep(0.25)


async def _accounted_usd(session: aiohttp.ClientSession, port: int, admin_key: str) -> float | None:
    """Total dollars the gateway's own accountant recorded (usage API), as a cross-check."""
    try:
        async with session.get(f"http://127.0.0.1:{port}/v1/usage",
                               headers={"Authorization": f"Bearer {admin_key}"}) as resp:
            if resp.status != 200:
                return None
            data = await resp.json()
    except (aiohttp.ClientError, ValueError):
        return None
    total = data.get("totals", {}) if isinstance(data, dict) else {}
    micros = total.get("cost_micros") or total.get("usd_micros")
    return micros / 1e6 if isinstance(micros, int) else None
