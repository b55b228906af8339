"""The routing benchmark over HTTP: the shared-prefix workload sent to real engines through a scheduler.

Engines are `--urls` (e.g. two vLLM CPU replicas) or, without URLs, an in-process simulated fleet.
Per policy: a fresh scheduler (the real one, scraping the engines' /metrics), a fresh seed (so no
policy profits from prefixes cached by the previous one), streaming `/v1/completions` at Poisson
arrivals, TTFT measured at the client, and the prefix-cache hit rate computed from the engines' own
counters (`vllm:prefix_cache_hits` / `vllm:prefix_cache_queries`, deltas over the run).
The workload is sized from the engines' KV capacity (`vllm:cache_config_info`, or `--kv-tokens`):
groups x prefix tokens ~= min(2.5, 0.75 x replicas) x one replica's capacity, `--max-requests` in all.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
from collections.abc import Callable, Coroutine
from dataclasses import asdict
from functools import partial
from typing import Any

import aiohttp
import orjson
from prometheus_client.parser import text_string_to_metric_families

from fleetgate.core.types import Endpoint, Usage
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import RoutingConfig, preset
from fleetgate.router.roundrobin import RoundRobinScheduler
from fleetgate.router.types import RoutingRequest, Scheduler
from fleetgate.sim.profile import get_profile
from fleetgate.sim.report import Row, print_table, quantile
from fleetgate.sim.workloads import WorkItem, shared_prefix


class _Source:
    def __init__(self, endpoints: list[Endpoint]) -> None:
        self._eps = endpoints

    def models(self) -> list[str]:
        return [self._eps[0].model]

    def endpoints(self, model: str) -> list[Endpoint]:
        return list(self._eps)


async def engine_counters(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """Prefix-cache counters and KV capacity (tokens) from one engine's /metrics."""
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    out = {"queries": 0.0, "hits": 0.0, "capacity": 0.0}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "vllm:prefix_cache_queries_total":
                out["queries"] += s.value
            elif s.name == "vllm:prefix_cache_hits_total":
                out["hits"] += s.value
            elif s.name == "vllm:cache_config_info" and "num_gpu_blocks" in s.labels:
                blocks = s.labels.get("num_gpu_blocks") or "0"
                out["capacity"] += int(blocks if blocks != "None" else 0) * int(s.labels.get("block_size", "16"))
    return out


async def at_arrivals(items: list[WorkItem], send: Callable[[WorkItem], Coroutine[Any, Any, Any]],
                      *, return_exceptions: bool = False) -> list[Any]:
    """Start `send(item)` for each item at its `arrival_s` (from now), then wait for all; their results."""
    t0 = time.perf_counter()
    tasks: list[asyncio.Task[Any]] = []
    for item in items:
        delay = item.arrival_s - (time.perf_counter() - t0)
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(send(item)))
    return list(await asyncio.gather(*tasks, return_exceptions=return_exceptions))


async def _send(
    session: aiohttp.ClientSession, sched: Scheduler, endpoints: list[Endpoint], item: WorkItem, ttfts: list[float],
    decisions: list[float],
) -> None:
    req = RoutingRequest(request_id=item.id, model=endpoints[0].model, prompt_text=item.prompt,
                         max_tokens=item.max_tokens)
    t0 = time.perf_counter()
    decision = await sched.pick(req, endpoints)
    decisions.append(time.perf_counter() - t0)
    ep = decision.endpoint
    sched.on_start(req, ep)
    body = {"model": ep.model, "prompt": item.prompt, "max_tokens": item.max_tokens, "temperature": 0,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": True}
    usage: Usage | None = None
    ok = False
    start = time.perf_counter()
    try:
        async with session.post(f"{ep.url}/v1/completions", json=body) as resp:
            first = True
            async for raw in resp.content:
                line = raw.strip()
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                chunk = orjson.loads(line[6:])
                if first and chunk.get("choices"):
                    ttfts.append(time.perf_counter() - start)
                    first = False
                if chunk.get("usage"):
                    usage = Usage.from_openai(chunk["usage"])
            ok = resp.status == 200
    finally:
        sched.on_complete(req, ep, ok=ok, usage=usage)


async def run_http_bench(
    *, args: argparse.Namespace, policies: list[str], config: RoutingConfig | None
) -> dict[str, Any]:
    fleet = None
    if args.urls:
        urls = [u.strip().rstrip("/").removesuffix("/v1") for u in args.urls.split(",") if u.strip()]
    else:
        from fleetgate.sim.fleet import start_sim_fleet

        profile = get_profile(args.profile).with_(time_scale=0.1, num_blocks=256)
        fleet = await start_sim_fleet(replicas=args.replicas, profile=profile)
        urls = fleet.urls
    rows: list[Row] = []
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
            model = args.model
            if model is None:
                async with session.get(f"{urls[0]}/v1/models") as resp:
                    model = (await resp.json())["data"][0]["id"]
            endpoints = [Endpoint(id=f"engine-{i}", url=u, model=model) for i, u in enumerate(urls)]
            capacity = args.kv_tokens or min([(await engine_counters(session, u))["capacity"] for u in urls]) or 16_384
            prefix_tokens = args.prefix_tokens or 1024
            # Hot prefixes need 2.5x one replica's KV, but at most 0.75x of the fleet's: with few replicas
            # the prefix-aware split must still fit, or no policy can keep them.
            hot = min(2.5, 0.75 * len(urls)) * capacity
            groups = max(2, math.ceil(hot / prefix_tokens))
            per_group = max(2, args.max_requests // groups)
            print(f"fleetgate bench routing --http: {len(urls)} engines serving {model!r}, KV {capacity:.0f} tokens "
                  f"each; {groups} groups x {per_group} prompts, {prefix_tokens}-token prefixes, {args.rate} req/s")
            for n, policy in enumerate(policies):
                items = shared_prefix(seed=args.seed + 1000 * (n + 1), groups=groups, prompts_per_group=per_group,
                                      prefix_tokens=prefix_tokens, question_tokens=64, max_tokens=8,
                                      rate_rps=args.rate)
                sched: Any
                if policy == "round-robin":
                    sched = RoundRobinScheduler()
                else:
                    cfg = (config or RoutingConfig()) if policy == "default" else preset(policy)
                    sched = build_scheduler(cfg, source=_Source(endpoints), seed=args.seed)
                    await sched.start()
                before = [await engine_counters(session, u) for u in urls]
                ttfts: list[float] = []
                decisions: list[float] = []
                t0 = time.perf_counter()
                await at_arrivals(items, partial(_send, session, sched, endpoints, ttfts=ttfts, decisions=decisions))
                wall = time.perf_counter() - t0
                after = [await engine_counters(session, u) for u in urls]
                if hasattr(sched, "aclose"):
                    await sched.aclose()
                dq = sum(a["queries"] - b["queries"] for a, b in zip(after, before, strict=True))
                dh = sum(a["hits"] - b["hits"] for a, b in zip(after, before, strict=True))
                per_engine = [int(a["queries"] - b["queries"]) for a, b in zip(after, before, strict=True)]
                rows.append(Row(policy=policy, ttft_p50=quantile(ttfts, 0.5), ttft_p90=quantile(ttfts, 0.9),
                                hit_rate=dh / dq if dq else 0.0, throughput=len(items) * 8 / wall,
                                decision_p99_us=quantile(decisions, 0.99) * 1e6 if decisions else float("nan"),
                                decision_cpu_p99_us=float("nan"), spread=per_engine))
                print(f"  {policy}: {len(ttfts)}/{len(items)} requests in {wall:.1f}s, hit rate {rows[-1].hit_rate:.1%}"
                      f" (engine counters: {dh:.0f}/{dq:.0f} tokens)", flush=True)
    finally:
        if fleet is not None:
            await fleet.aclose()
    print_table("shared-prefix over HTTP (last column: prompt tokens per engine)", rows, baseline="round-robin",
                unit="wall seconds at the client")
    return {"http-shared-prefix": [asdict(r) for r in rows]}

