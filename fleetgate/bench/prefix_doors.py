"""`fleetgate bench gateway --prefix-gain`: what prefix-aware routing gains through each front door, one workload.

Doors: FleetGate's own gateway, and a real Envoy asking FleetGate's Endpoint Picker over ext_proc (the
`fleetgate epp --envoy-config` bootstrap). Policies: `least-loaded` (prefix-blind: the baseline) and `default`
(the shipped profile, prefix affinity blended with load). For every (door, policy) a fresh simulated fleet of
`--gain-replicas` engines (the sim's `--gain-profile`, by default vLLM CPU, with a KV cache of `--gain-kv-blocks`
x 16 tokens, time-scaled by `--gain-time-scale`) serves the same seeded shared-prefix workload
(`sim.workloads.shared_prefix`: `--gain-groups` prompt groups sharing a `--gain-prefix-tokens` prefix, Poisson
arrivals at `--gain-rate`), streamed through the door
as /v1/completions. Per run: the engines' own prefix-cache hit rate (deltas of `vllm:prefix_cache_hits` /
`vllm:prefix_cache_queries`) and TTFT at the client. Gain of a door = default over least-loaded: hit-rate
ratio and TTFT-p50 ratio (least-loaded / default). Target: the Envoy door's gain within +-10% of the
gateway's. Everything runs in this process except Envoy; both doors see the same conditions, including the
same point of their router's scrape cycle: the arrivals start right after the door's scraper stored a round
(`after_scrape`). Why: the shipped profile's queue-depth and KV-usage scorers read those snapshots, and on this
KV-tight workload a decision between a group's engine and the other often turns on them (a partial prefix match
ties the in-flight scorer); a door whose arrivals met its scrapes at another phase made other decisions from
the same requests. The gateway's arrivals used to start a fixed few milliseconds after its first scrape, the
picker's at a random phase (Envoy's health check of the picker decides when it first answers), which made the
picker's hit rate vary from run to run where the gateway's did not (docs/reports/epp.md, "decision parity").

A door's cost is additive: the same few milliseconds on every TTFT (`door cost` in the report: the default
policy's TTFT p50 through Envoy + EPP minus through the gateway). The TTFT-gain ratio therefore depends on how
long a prefix-hit TTFT is: at the defaults (vLLM CPU profile, time scale 0.1) a hit takes ~25 ms, close to a
datacentre GPU's (~34 ms with `--gain-profile gpu-8b --gain-time-scale 1`); at the CPU engine's own speed (time
scale 1, with `--gain-rate` divided by 10 for the same load) ~220 ms, where the same door cost is a tenth as large
(docs/reports/epp.md has all three).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson

from fleetgate.bench.envoy import EnvoyProcess
from fleetgate.core.localredis import free_port
from fleetgate.gateway.epp.envoyconfig import envoy_config
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.router.config import RoutingConfig, preset
from fleetgate.router.fleet_state import FleetState
from fleetgate.sim.http_run import at_arrivals, engine_counters
from fleetgate.sim.profile import PROFILES, get_profile
from fleetgate.sim.report import quantile
from fleetgate.sim.workloads import WorkItem, shared_prefix

DOORS = ("gateway", "envoy+epp")
POLICIES = ("least-loaded", "default")


@dataclass
class Run:
    """One (door, policy) over every seed: prefix-cache counters pooled, TTFTs together."""

    door: str
    policy: str
    hits: float = 0.0
    queries: float = 0.0
    ttfts: list[float] = field(default_factory=list)
    done: int = 0
    errors: int = 0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries if self.queries else 0.0

    @property
    def ttft_p50(self) -> float:
        return quantile(self.ttfts, 0.5)

    @property
    def ttft_p90(self) -> float:
        return quantile(self.ttfts, 0.9)


def _settings(model: str, urls: list[str], policy: str) -> GatewaySettings:
    routing = RoutingConfig() if policy == "default" else preset(policy)
    routing = routing.model_copy(update={"scrape": routing.scrape.model_copy(update={"interval_s": 0.2})})
    return GatewaySettings.model_validate({
        "server": {"auth": "open", "metrics_port": None, "log_requests": False},
        "models": [{"name": model, "endpoints": urls}], "routing": routing.model_dump(by_alias=True)})


def _fleet_state(stages: object) -> FleetState:
    """The router state of a door's stages (what its scraper fills)."""
    scheduler = getattr(stages, "scheduler", None)
    state = getattr(scheduler, "state", None)
    if not isinstance(state, FleetState):
        raise TypeError(f"the door's scheduler {type(scheduler).__name__} keeps no FleetState to align with")
    return state


async def after_scrape(state: FleetState, *, endpoints: int, timeout_s: float = 5.0, poll_s: float = 0.001) -> None:
    """Return once the router's scraper has stored a fresh round for all `endpoints` (each one's `scraped_at` later
    than this call): the caller then starts at the same point of the scrape cycle whatever the door."""
    since = state.clock()
    deadline = time.monotonic() + timeout_s
    while True:
        fresh = sum(1 for st in state.stats.values() if st.scraped_at > since)
        if fresh >= endpoints:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the router stored no scrape of {endpoints} endpoints within {timeout_s} s")
        await asyncio.sleep(poll_s)


@contextlib.asynccontextmanager
async def _door(door: str, settings: GatewaySettings, pool: list[str]) -> AsyncIterator[tuple[str, FleetState]]:
    """The door's base URL and its router's state while it runs."""
    if door == "gateway":
        from fleetgate.gateway.serve import build_server, start_in_background

        port = free_port()
        server = build_server(settings, port=port, metrics_port=None)
        task = await start_in_background(server)
        stages = getattr(getattr(server.config.app, "state", None), "stages", None)
        try:
            yield f"http://127.0.0.1:{port}", _fleet_state(stages)
        finally:
            server.should_exit = True
            await task
        return
    from fleetgate.gateway.epp.server import build_epp

    epp = build_epp(settings, port=0, metrics_port=None)
    await epp.start()
    listen = free_port()
    hosts = [(u.split("//", 1)[1].rsplit(":", 1)[0], int(u.rsplit(":", 1)[1])) for u in pool]
    envoy = EnvoyProcess(envoy_config(listen=("127.0.0.1", listen), epp=("127.0.0.1", epp.port), pool=hosts,
                                      health_interval_s=0.2))
    await asyncio.to_thread(envoy.__enter__)
    try:
        yield f"http://127.0.0.1:{listen}", _fleet_state(epp.stages)
    finally:
        await asyncio.to_thread(envoy.__exit__, None, None, None)
        await epp.stop(drain_s=1)


async def _send(session: aiohttp.ClientSession, url: str, model: str, item: WorkItem, ttfts: list[float]) -> bool:
    body = {"model": model, "prompt": item.prompt, "max_tokens": item.max_tokens, "temperature": 0, "stream": True,
            "ignore_eos": True}
    start = time.perf_counter()
    async with session.post(f"{url}/v1/completions", data=orjson.dumps(body),
                            headers={"Content-Type": "application/json"}) as resp:
        first = True
        async for raw in resp.content:
            line = raw.strip()
            if first and line.startswith(b"data: {") and b'"choices":[{' in line:
                ttfts.append(time.perf_counter() - start)
                first = False
        return resp.status == 200 and not first


async def _ready(session: aiohttp.ClientSession, url: str, model: str) -> None:
    """The door answers (the picker's health check has passed in Envoy) before the workload starts."""
    deadline = time.monotonic() + 15
    body = orjson.dumps({"model": model, "prompt": "warm", "max_tokens": 1})
    while True:
        with contextlib.suppress(aiohttp.ClientError):
            async with session.post(f"{url}/v1/completions", data=body,
                                    headers={"Content-Type": "application/json"}) as resp:
                if resp.status == 200:
                    return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{url} did not answer 200 within 15 s")
        await asyncio.sleep(0.1)


async def one_run(args: argparse.Namespace, run: Run, seed: int) -> None:
    """One seed of `run`'s door and policy, on a fresh simulated fleet; adds its figures to `run`."""
    from fleetgate.sim.fleet import start_sim_fleet

    profile = get_profile(args.gain_profile).with_(time_scale=args.gain_time_scale, num_blocks=args.gain_kv_blocks)
    per_group = max(2, args.gain_requests // args.gain_groups)
    items = shared_prefix(seed=seed, groups=args.gain_groups, prompts_per_group=per_group,
                          prefix_tokens=args.gain_prefix_tokens, question_tokens=64, max_tokens=8,
                          rate_rps=args.gain_rate)
    async with await start_sim_fleet(replicas=args.gain_replicas, profile=profile) as fleet, \
            _door(run.door, _settings(fleet.model, fleet.urls, run.policy), fleet.urls) as (url, state), \
            aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        await _ready(session, url, fleet.model)
        before = [await engine_counters(session, u) for u in fleet.urls]
        await after_scrape(state, endpoints=len(fleet.urls))
        results = await at_arrivals(items, lambda item: _send(session, url, fleet.model, item, run.ttfts),
                                    return_exceptions=True)
        after = [await engine_counters(session, u) for u in fleet.urls]
    run.queries += sum(a["queries"] - b["queries"] for a, b in zip(after, before, strict=True))
    run.hits += sum(a["hits"] - b["hits"] for a, b in zip(after, before, strict=True))
    done = sum(1 for r in results if r is True)
    run.done += done
    run.errors += len(results) - done


async def measure(args: argparse.Namespace) -> list[Run]:
    runs = [Run(door=door, policy=policy) for policy in POLICIES for door in DOORS]
    for n in range(args.gain_seeds):
        for run in runs:  # one seed at a time: every (door, policy) serves the very same workload
            await one_run(args, run, seed=args.gain_seed + 1000 * n)
            print(f"... seed {n + 1}/{args.gain_seeds} {run.door} / {run.policy}: hit rate so far {run.hit_rate:.1%}",
                  flush=True)
    return runs


def gains(runs: list[Run]) -> dict[str, dict[str, float]]:
    """Per door: default over least-loaded, as hit-rate ratio and TTFT-p50 ratio (least-loaded / default)."""
    by = {(r.door, r.policy): r for r in runs}
    out: dict[str, dict[str, float]] = {}
    for door in DOORS:
        base, shipped = by[(door, "least-loaded")], by[(door, "default")]
        out[door] = {"hit": shipped.hit_rate / base.hit_rate if base.hit_rate else float("nan"),
                     "ttft": base.ttft_p50 / shipped.ttft_p50 if shipped.ttft_p50 else float("nan")}
    return out


def report(args: argparse.Namespace, runs: list[Run]) -> None:
    import os

    a = args
    per_group = max(2, a.gain_requests // a.gain_groups)
    print(f"\nprefix-routing gain through each door  ({a.gain_replicas} simulated {a.gain_profile} engines, KV "
          f"{a.gain_kv_blocks * 16} tokens each, {a.gain_groups} groups x {per_group} prompts, "
          f"{a.gain_prefix_tokens}-token prefixes, {a.gain_rate} req/s, time scale {a.gain_time_scale}, "
          f"{a.gain_seeds} seeds pooled; load average {os.getloadavg()[0]:.1f})")
    print(f"  {'door':<10} {'policy':<13} {'hit rate':>9} {'TTFT p50 ms':>12} {'TTFT p90 ms':>12} {'ok':>5} "
          f"{'errors':>6}")
    for r in runs:
        print(f"  {r.door:<10} {r.policy:<13} {r.hit_rate:>9.1%} {r.ttft_p50 * 1e3:>12.1f} {r.ttft_p90 * 1e3:>12.1f} "
              f"{r.done:>5} {r.errors:>6}")
    g = gains(runs)
    for door, figures in g.items():
        print(f"  gain through {door:<10}: hit rate x{figures['hit']:.2f}, TTFT p50 x{figures['ttft']:.2f}")
    hit_ratio = g["envoy+epp"]["hit"] / g["gateway"]["hit"]
    ttft_ratio = g["envoy+epp"]["ttft"] / g["gateway"]["ttft"]
    print(f"  Envoy + EPP gain / gateway gain: hit rate {hit_ratio:.3f}, TTFT p50 {ttft_ratio:.3f} "
          f"(target: within 0.90-1.10)")
    by = {(r.door, r.policy): r for r in runs}
    cost = (by[("envoy+epp", "default")].ttft_p50 - by[("gateway", "default")].ttft_p50) * 1e3
    print(f"  door cost (default policy, TTFT p50 through Envoy + EPP minus through the gateway): {cost:+.1f} ms")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("--prefix-gain")
    group.add_argument("--gain-replicas", type=int, default=4, help="simulated engines per run")
    group.add_argument("--gain-kv-blocks", type=int, default=256, help="each engine's KV cache, in 16-token blocks")
    group.add_argument("--gain-groups", type=int, default=10, help="prompt groups sharing a prefix")
    group.add_argument("--gain-requests", type=int, default=120, help="requests per run")
    group.add_argument("--gain-prefix-tokens", type=int, default=1024, help="tokens of each group's shared prefix")
    group.add_argument("--gain-rate", type=float, default=8.0, help="Poisson arrivals, requests per second")
    group.add_argument("--gain-profile", default="vllm-cpu-gemma3-270m", choices=sorted(PROFILES),
                       help="the simulated engines' timing (gpu-8b: a datacentre GPU)")
    group.add_argument("--gain-time-scale", type=float, default=0.1, help="simulated seconds -> wall seconds")
    group.add_argument("--gain-seed", type=int, default=1, help="first workload seed")
    group.add_argument("--gain-seeds", type=int, default=2, help="workloads per (door, policy), figures pooled")


def run_prefix_gain(args: argparse.Namespace) -> dict[str, Any]:
    import uvloop

    runs = uvloop.run(measure(args))
    report(args, runs)
    return {"runs": [{"door": r.door, "policy": r.policy, "hit_rate": r.hit_rate, "ttft_p50": r.ttft_p50}
                     for r in runs], "gains": gains(runs)}
