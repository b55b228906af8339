"""One point of the live routing benchmark: a workload at an offered load through one profile's gateway.

A point (`run_point`):
1. waits until the engines are idle and resets their prefix caches (so no profile inherits the
   previous one's cache), and starts the profile's gateway (`fleetgate.bench.live_gateway`);
2. reads every engine's counters, sends the point's requests through the gateway for `window_s`
   (open loop; chat: closed-loop users), reads the counters again at the end of the window, then waits
   for the requests still in flight until `drain_s` (those left are cancelled and counted as `forced`);
3. waits for the engines to go idle, reads the counters a last time, reads what the gateway charged
   its tenants (`GET /v1/usage`, admin key) and its CPU time, and stops it.

Figures (one JSON row): TTFT p50/p90/p99 at the client (all requests, and `steady`: those sent after the
first third of the window, when caches are warm; a request cut off at the drain deadline before its first
token counts with its wait so far, `ttft_censored` of them); output tokens/s from the engines' own
`generation_tokens` counters over the window (the rate the fleet delivered while the load was offered),
per engine too; the prefix-cache hit rate from the engines' `prefix_cache_hits / prefix_cache_queries`
over the point; the engines' prompt, uncached prompt and generated tokens; the tenants' charged prompt and
completion tokens and the difference (`lost_*` = engine counted minus charged); the gateway's CPU per
request; the client's event-loop lag p99; requests per endpoint.
With `gateway_replicas` > 1 (`fleetgate.bench.live_replicas`) the door is that many gateway processes sharing one
Redis: requests go to them in turn, the CPU is their sum (`gateway_cpu_s_each` per replica, the Redis's apart), and
the charges are read through replica 0 when every replica reports the same totals (the ledger is shared:
`usage_shared`), else summed over the replicas.
A point's accounting is `comparable` when every request that left early had received a chunk first (a
request cancelled before its first token is charged the gateway's estimate, while vLLM counts a prompt
only once its first token is out, so such points are reported but kept out of the exact check).
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp

from fleetgate.bench import live_engines, live_pyspy
from fleetgate.bench.live_client import LiveRequest, LiveResult, LoopLag, replay
from fleetgate.bench.live_gateway import Keys, Profile
from fleetgate.bench.live_replicas import GatewayGroup, start_gateways
from fleetgate.bench.live_workloads import Sizes, Target, sized_items, to_requests
from fleetgate.engine.vllm_counters import CounterSnapshot, deltas, total
from fleetgate.sim.report import group_split as report_group_split
from fleetgate.sim.report import quantile


@dataclass(frozen=True, slots=True)
class PointSpec:
    workload: str
    profile: str
    load: float  # the multiple of the base rate (or of the base users, for chat)
    rate: float  # requests per second (chat: users starting per second)
    window_s: float
    drain_s: float
    seed: int
    users: int = 0  # chat only
    cancel_share: float = 0.0
    tag: str = "routing"  # routing | accounting | accounting-finish | overhead | door | door-latency
    server: tuple[tuple[str, Any], ...] = ()  # gateway `server` settings for this point (e.g. cancel_finish_tokens)
    door: str = "gateway"  # gateway | envoy+epp (`fleetgate.bench.live_epp`)
    replicas: int = 0  # gateway processes of this point's door; 0: the run's `gateway_replicas`
    streams: int = 0  # closed-loop streams per engine (the overhead phase's `reference` background); 0: open loop

    @property
    def name(self) -> str:
        size = f"{self.streams} streams/engine" if self.streams else f"x{self.load:g}"
        return (f"{self.workload} {size} {self.profile}" + ("" if self.tag == "routing" else f" [{self.tag}]")
                + ("" if self.door == "gateway" else f" via {self.door}"))


class Door(Protocol):
    """What a point needs of its front door: the gateway's process, or Envoy + `fleetgate epp`."""

    @property
    def url(self) -> str: ...

    @property
    def started_s(self) -> float: ...

    def cpu_s(self) -> float: ...

    def stop(self) -> None: ...


@dataclass
class LiveContext:
    session: aiohttp.ClientSession
    urls: list[str]
    model: str
    keys: Keys
    sizes: Sizes
    chars_per_token: float
    capacity_tokens: int  # one engine's KV capacity
    workdir: Path
    profiles: dict[str, Profile]
    resets: bool = True  # engines serve /reset_prefix_cache
    kv_events: list[dict[str, Any]] = field(default_factory=list)  # the route's kv_events entries
    log: Any = print
    gateways_started: list[float] = field(default_factory=list)
    epp_site: str = ""  # a site directory put first on the picker's path (the GPU machine's gRPC packages)
    py_spy_dir: Path | None = None  # py-spy samples of each gateway point's window go here (`live_pyspy`)
    gateway_replicas: int = 1  # gateway processes per door, sharing `redis_server` when > 1 (`live_replicas`)
    redis_server: str | None = None  # the redis-server binary the doors' replicas share; None: in-memory state


async def start_gateway_door(ctx: LiveContext, profile: Profile, *, server: dict[str, Any] | None = None,
                             replicas: int = 0) -> GatewayGroup:
    """The gateway door of `profile`: `replicas` processes, or `ctx.gateway_replicas` when 0 (sharing a fresh
    Redis when there are several or the context has one)."""
    return await asyncio.to_thread(start_gateways, profile, replicas=replicas or ctx.gateway_replicas,
                                   redis_binary=ctx.redis_server, model=ctx.model, urls=ctx.urls, keys=ctx.keys,
                                   workdir=ctx.workdir, kv_events=ctx.kv_events, server=server)


async def start_door(ctx: LiveContext, spec: PointSpec) -> Door:
    """The point's front door for its profile, started and answering."""
    profile = ctx.profiles[spec.profile]
    if spec.door == "gateway":
        return await start_gateway_door(ctx, profile, server=dict(spec.server))
    from fleetgate.bench.live_epp import start_epp_door

    return await start_epp_door(ctx, profile)


def _pct(values: list[float], q: float) -> float | None:
    return quantile(values, q) if values else None


def usage_totals(report: dict[str, Any]) -> dict[str, int]:
    totals = report.get("totals", {}) if isinstance(report, dict) else {}
    return {k: int(totals.get(k, 0)) for k in ("requests", "prompt_tokens", "completion_tokens", "errors")}


async def read_usage(session: aiohttp.ClientSession, gateway: GatewayGroup, admin_key: str) -> dict[str, Any]:
    async with session.get(f"{gateway.url}/v1/usage", headers={"Authorization": f"Bearer {admin_key}"}) as resp:
        resp.raise_for_status()
        data = await resp.json()
    return data if isinstance(data, dict) else {}


async def settled_usage(session: aiohttp.ClientSession, gateway: GatewayGroup, admin_key: str,
                        *, timeout_s: float = 10.0) -> dict[str, Any]:
    """The usage report once two reads 0.2 s apart agree (requests that just ended are settled)."""
    deadline = time.monotonic() + timeout_s
    last = await read_usage(session, gateway, admin_key)
    while time.monotonic() < deadline:
        await asyncio.sleep(0.2)
        now = await read_usage(session, gateway, admin_key)
        if usage_totals(now) == usage_totals(last):
            return now
        last = now
    return last


async def usage_each(session: aiohttp.ClientSession, gateway: GatewayGroup, admin_key: str) -> list[dict[str, int]]:
    """`usage_totals` read through every replica of the door, in order."""
    out = []
    for url in gateway.urls:
        async with session.get(f"{url}/v1/usage", headers={"Authorization": f"Bearer {admin_key}"}) as resp:
            resp.raise_for_status()
            out.append(usage_totals(await resp.json()))
    return out


def charged_delta(before: list[dict[str, int]], after: list[dict[str, int]]) -> tuple[dict[str, int], bool]:
    """What the door charged between two `usage_each` reads, and whether its replicas share one ledger. Shared
    (every replica reports the same totals at the end): the change seen through replica 0; not shared: the sum of
    each replica's own change (each then charged only what it served)."""
    shared = all(a == after[0] for a in after)
    if shared:
        return {k: after[0][k] - before[0][k] for k in after[0]}, True
    return {k: sum(a[k] - b[k] for a, b in zip(after, before, strict=True)) for k in after[0]}, False


async def settled_charges(session: aiohttp.ClientSession, gateway: GatewayGroup, admin_key: str,
                          before: list[dict[str, int]]) -> tuple[dict[str, int], bool]:
    """`charged_delta` once replica 0's report has settled (`settled_usage`)."""
    await settled_usage(session, gateway, admin_key)
    return charged_delta(before, await usage_each(session, gateway, admin_key))


def in_flight(results: list[LiveResult]) -> float:
    """Requests in flight on average over the point (Little's law: total time in the system / the span)."""
    timed = [r for r in results if r.done_s is not None]
    if not timed:
        return 0.0
    span = max(r.done_s or 0.0 for r in timed) - min(r.sent_s for r in timed)
    return sum((r.done_s or 0.0) - r.sent_s for r in timed) / span if span > 0 else 0.0


def summarize(results: list[LiveResult], *, window_s: float) -> dict[str, Any]:
    ok = [r for r in results if r.status == 200 and r.error is None]
    # A request cut off at the drain deadline before its first token waited at least until then: it counts
    # with that wait (a lower bound), so a profile whose backlog outlasts the drain is not flattered.
    censored = [r for r in results if r.forced and r.ttft_s is None and r.error is None and r.status in (0, 200)
                and r.done_s is not None]
    waits = {id(r): (r.done_s or 0.0) - r.sent_s for r in censored}
    ok_ids = {id(r) for r in ok}
    timed = [r for r in results if (r.ttft_s is not None and id(r) in ok_ids) or id(r) in waits]
    ttfts = [r.ttft_s if r.ttft_s is not None else waits[id(r)] for r in timed]
    steady = [t for r, t in zip(timed, ttfts, strict=True) if r.sent_s >= window_s / 3]
    left = [r for r in results if r.cancelled or r.forced]
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": sum(1 for r in results if r.error is not None or (r.status not in (0, 200))),
        "cancelled": sum(1 for r in results if r.cancelled),
        "forced": sum(1 for r in results if r.forced),
        "left_before_first_chunk": sum(1 for r in left if r.chunks == 0),
        "ttft_p50_s": _pct(ttfts, 0.5),
        "ttft_p90_s": _pct(ttfts, 0.9),
        "ttft_p99_s": _pct(ttfts, 0.99),
        "ttft_steady_p50_s": _pct(steady, 0.5),
        "ttft_steady_p90_s": _pct(steady, 0.9),
        "ttft_censored": len(censored),
        "client_chunks": sum(r.chunks for r in results),
        "mean_in_flight": in_flight(results),
        "spread": dict(sorted(Counter(r.endpoint or "?" for r in results).items())),
        **group_split(results),
        "error_sample": next((r.error for r in results if r.error), None),
    }


def group_split(results: list[LiveResult]) -> dict[str, Any]:
    """`fleetgate.sim.report.group_split` of the requests that have a group and an endpoint (debug header)."""
    placed = sorted((r.sent_s, r.group, r.endpoint) for r in results if r.group and r.endpoint)
    return report_group_split([(g, e) for _, g, e in placed])


def engine_figures(window: list[CounterSnapshot], whole: list[CounterSnapshot], *, window_s: float
                   ) -> dict[str, Any]:
    w, t = total(window), total(whole)
    return {
        "output_tps": w.generation_tokens / window_s,
        "output_tps_per_engine": [d.generation_tokens / window_s for d in window],
        "uncached_prompt_tps": w.uncached_prompt_tokens / window_s,
        "window_prompt_tokens": w.prompt_tokens,
        "window_uncached_prompt_tokens": w.uncached_prompt_tokens,
        "window_generation_tokens": w.generation_tokens,
        "hit_rate": t.hit_rate,
        "engine_prompt_tokens": t.prompt_tokens,
        "engine_generation_tokens": t.generation_tokens,
        "engine_prefix_queries": t.prefix_queries,
        "engine_prefix_hits": t.prefix_hits,
        "engine_uncached_prompt_tokens": t.uncached_prompt_tokens,
        "engine_preemptions": t.preemptions,
        "engine_prompt_tokens_per_engine": [d.prompt_tokens for d in whole],
    }


def build_requests(ctx: LiveContext, spec: PointSpec, gateway_url: str, *, spread: tuple[str, ...] = ()
                   ) -> list[LiveRequest]:
    """The point's requests to `gateway_url`, or spread over `spread` in turn (a door's gateway replicas)."""
    items = sized_items(spec.workload, seed=spec.seed, rate=spec.rate, window_s=spec.window_s, sizes=ctx.sizes,
                      chars_per_token=ctx.chars_per_token, capacity_tokens=ctx.capacity_tokens,
                      replicas=len(ctx.urls), users=spec.users)
    target = Target(url=gateway_url, model=ctx.model, keys=ctx.keys.tenants, door_urls=spread)
    return to_requests(items, target=target, tenants=ctx.sizes.tenants, cancel_share=spec.cancel_share,
                       seed=spec.seed, output_tokens=ctx.sizes.output_tokens)


KV_EVENT_COUNTERS = ("fleetgate_router_kv_events_batches", "fleetgate_router_kv_events_wakes")


async def kv_event_counts_of(session: aiohttp.ClientSession, metrics_urls: tuple[str, ...]) -> dict[str, float]:
    """`kv_event_counts` summed over a door's replicas (each subscribes to the engines' events itself)."""
    out: dict[str, float] = {}
    for url in metrics_urls:
        for k, v in (await kv_event_counts(session, url)).items():
            out[k] = out.get(k, 0.0) + v
    return out


async def kv_event_counts(session: aiohttp.ClientSession, metrics_url: str) -> dict[str, float]:
    """The gateway's KV-event batches and wakes so far, summed over endpoints (empty without a precise scorer, or
    when /metrics does not answer): batches over wakes is how many published batches each event-loop wake took,
    the precise path's main per-second cost (docs/reports/precise-prefix.md)."""
    try:
        async with session.get(metrics_url, timeout=aiohttp.ClientTimeout(total=5)) as resp:
            text = await resp.text()
    except (aiohttp.ClientError, TimeoutError):
        return {}
    return kv_event_counts_in(text)


def kv_event_counts_in(text: str) -> dict[str, float]:
    """`kv_event_counts` of one /metrics text: {"batches": n, "wakes": n} for the counters it holds."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        if family.name in KV_EVENT_COUNTERS:
            out[family.name.rsplit("_", 1)[1]] = sum(s.value for s in family.samples if s.name.endswith("_total"))
    return out


async def _snapshot_at(ctx: LiveContext, at: float) -> list[CounterSnapshot]:
    await asyncio.sleep(max(0.0, at - time.perf_counter()))
    return await live_engines.counters(ctx.session, ctx.urls)


async def run_point(ctx: LiveContext, spec: PointSpec) -> dict[str, Any]:
    session, urls = ctx.session, ctx.urls
    started = time.perf_counter()
    idle = await live_engines.wait_idle(session, urls, timeout_s=30)
    reset = await live_engines.reset_prefix_caches(session, urls) if ctx.resets else False
    gateway = await start_door(ctx, spec)
    # the picker serves no usage API: its points are kept out of the accounting check
    charging = gateway if isinstance(gateway, GatewayGroup) else None
    try:
        requests = build_requests(ctx, spec, gateway.url, spread=charging.urls if charging else ())
        usage_before = await usage_each(session, charging, ctx.keys.admin) if charging else []
        events_before = await kv_event_counts_of(session, charging.metrics_urls) if charging else {}
        cpu_before = gateway.cpu_s()
        cpu_each_before = charging.cpu_each() if charging else []
        redis_before = charging.redis_cpu_s() if charging else None
        before = await live_engines.counters(session, urls)
        # py-spy samples replica 0 (one process's profile; the replicas run the same code on an even share)
        sampler = (live_pyspy.start(charging.replicas[0].popen.pid, live_pyspy.point_file(ctx.py_spy_dir, spec.name),
                                    duration_s=spec.window_s) if charging and ctx.py_spy_dir else None)
        lag = LoopLag()
        lag.start()
        t_send = time.perf_counter()
        at_window = asyncio.create_task(_snapshot_at(ctx, t_send + spec.window_s))
        results, _ = await replay(session, requests, drain_deadline_s=spec.window_s + spec.drain_s,
                                  send_until_s=spec.window_s)
        in_window = await at_window
        await asyncio.to_thread(live_pyspy.finish, sampler)
        await lag.stop()
        quiet = await live_engines.wait_idle(session, urls, timeout_s=30)
        after = await live_engines.counters(session, urls)
        charges = await settled_charges(session, charging, ctx.keys.admin, usage_before) if charging else None
        cpu = gateway.cpu_s() - cpu_before
        cpu_each = [b - a for a, b in zip(cpu_each_before, charging.cpu_each(), strict=True)] if charging else []
        redis_after = charging.redis_cpu_s() if charging else None
        events_after = await kv_event_counts_of(session, charging.metrics_urls) if charging else {}
    finally:
        await asyncio.to_thread(gateway.stop)
    whole = deltas(before, after)
    window = deltas(before, in_window)
    row: dict[str, Any] = {
        "kind": "point", "tag": spec.tag, "door": spec.door, "workload": spec.workload, "profile": spec.profile,
        "load": spec.load,
        "rate": spec.rate, "users": spec.users, "window_s": spec.window_s, "seed": spec.seed,
        "cancel_share": spec.cancel_share, "reset": reset, "idle_before": idle, "idle_after": quiet,
        **summarize(results, window_s=spec.window_s),
        **engine_figures(window, whole, window_s=spec.window_s),
        "gateway_cpu_s": cpu,
        "gateway_started_s": gateway.started_s,
        "client_loop_lag_p99_s": lag.p99(),
        "elapsed_s": time.perf_counter() - started,
    }
    row["gateway_cpu_ms_per_request"] = 1000 * cpu / max(1, row["requests"])
    if events_after:  # a precise gateway: its KV-event batches and the wakes that applied them, over the point
        row["kv_events"] = {k: v - events_before.get(k, 0.0) for k, v in events_after.items()}
    if charging is None or charges is None:
        return row
    row["gateway_replicas"] = len(charging.replicas)
    if len(charging.replicas) > 1 or charging.redis is not None:
        row["gateway_cpu_s_each"] = cpu_each
        row["redis_cpu_s"] = (redis_after - redis_before) if redis_after is not None and redis_before is not None \
            else None
    charged, row["usage_shared"] = charges
    row.update(charged_prompt_tokens=charged["prompt_tokens"], charged_completion_tokens=charged["completion_tokens"],
               charged_requests=charged["requests"])
    row["lost_prompt_tokens"] = row["engine_prompt_tokens"] - row["charged_prompt_tokens"]
    row["lost_completion_tokens"] = row["engine_generation_tokens"] - row["charged_completion_tokens"]
    row["comparable"] = bool(row["left_before_first_chunk"] == 0 and quiet)
    return row
