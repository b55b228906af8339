"""The gateway's cost at engine speed: added time to first token and CPU per request, against direct calls.

Paired probes: request A goes through the gateway as model `probe-<k>` (a route to engine k alone) and
request B straight to engine k, both sent at once (`Prober.pairs` says why); both hold the same cached
probe prefix plus a short unique suffix, so the engine does the same small prefill for each. The added
latency of a pair is TTFT(gateway) - TTFT(direct); the figure is the mean over pairs (with a bootstrap
95% interval; the median beside it), first on idle engines, then while the gateway also relays a
background load so that the engines stream thousands of tokens per second. The background (`BACKGROUNDS`, in the row
as `background`): `shared-prefix`, that workload at the base rate (open loop, Poisson); or `reference`, issue 24's
own scale (on one H100, 64 concurrent streams of ~1k-token prompts and 128-token answers: TTFT p50 0.58 s): a closed
loop of `streams` per engine through the door, each sending one unique ~1k-token prompt after another for exactly
128 tokens, no think time (`live_workloads.reference_chains`; `streams` in the row is their total).
Gateway CPU per request: the gateway process's CPU seconds over the loaded window / the requests it
served in it (background and probes). The engines' counters over the phase, minus the direct probes'
own usage, are compared with what the gateway charged (the accounting check covers this phase too).
Beside the pairs, a second method: the gateway's own time measured inside it (`fleetgate_gateway_own_seconds`, read
from each replica's metrics endpoint before and after the idle pairs and the loaded window: `live_own_time`).
With several gateway replicas per door (`LiveContext.gateway_replicas`, `fleetgate.bench.live_replicas`) the
background is spread over them in turn, the probes take them in turn (`Prober.replica_of`), the CPU is their sum,
and each replica's loop watch is summarised (`gateway_loops`).
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from typing import Any

from fleetgate.bench import live_engines, live_own_time, live_pyspy
from fleetgate.bench.live_client import LiveRequest, LiveResult, LoopLag, completion_body, replay, stream_one
from fleetgate.bench.live_points import (
    LiveContext,
    PointSpec,
    build_requests,
    settled_charges,
    start_gateway_door,
    usage_each,
)
from fleetgate.bench.live_replicas import GatewayGroup
from fleetgate.bench.live_workloads import Target, reference_chains
from fleetgate.bench.loop_watch import load_summary
from fleetgate.engine.vllm_counters import deltas, total
from fleetgate.sim.report import quantile
from fleetgate.sim.workloads import _text

PROBE_MAX_TOKENS = 4
BACKGROUNDS = ("shared-prefix", "reference")  # the loaded window's background load (see the module's docstring)
REFERENCE_PROMPT_TOKENS = 1000
REFERENCE_OUTPUT_TOKENS = 128


def median_ci(values: list[float], *, seed: int = 0, rounds: int = 400) -> tuple[float, float, float]:
    """Median and a bootstrap 95% interval of the median."""
    if not values:
        return float("nan"), float("nan"), float("nan")
    rng = random.Random(seed)
    meds = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(rounds))
    return statistics.median(values), meds[int(0.025 * rounds)], meds[int(0.975 * rounds) - 1]


class Prober:
    def __init__(self, ctx: LiveContext, gateway_url: str, *, replicas: tuple[str, ...] = ()) -> None:
        """`replicas`: a door's gateway replicas, which the gateway's probes take in turn (`replica_of`); else
        `gateway_url` alone."""
        self.ctx = ctx
        self.gateway_url = gateway_url
        self.replicas = replicas or (gateway_url,)
        self.replica_used: list[int] = []  # the replica of each gateway probe, in order
        self.pair_replicas: list[int] = []  # the replica of each pair the last `pairs` call returned
        rng = random.Random("probe-prefix")
        self.prefix = "[probe] " + _text(rng, 256, chars_per_token=ctx.chars_per_token)
        self.n = 0
        self.direct: list[LiveResult] = []  # usage of every direct probe (for the accounting of the phase)
        self.gateway_requests = 0
        self.control_pairs: dict[float, list[tuple[float, float]]] = {}  # offset (ms) -> (real offset, added) s

    def _request(self, *, engine: int, via_gateway: bool) -> LiveRequest:
        self.n += 1
        prompt = f"{self.prefix}\nprobe {self.n}"
        if via_gateway:
            replica = self.replica_of(self.gateway_requests)
            self.replica_used.append(replica)
            self.gateway_requests += 1
            tenant = "t0"
            return LiveRequest(id=f"probe-{self.n}", url=self.replicas[replica], at_s=0, tenant=tenant,
                               body=completion_body(model=f"probe-{engine}", prompt=prompt,
                                                    max_tokens=PROBE_MAX_TOKENS),
                               headers={"Content-Type": "application/json",
                                        "Authorization": f"Bearer {self.ctx.keys.tenants[tenant]}"})
        return LiveRequest(id=f"probe-{self.n}", url=self.ctx.urls[engine], at_s=0, path="direct",
                           body=completion_body(model=self.ctx.model, prompt=prompt, max_tokens=PROBE_MAX_TOKENS),
                           headers={"Content-Type": "application/json"})

    def replica_of(self, j: int) -> int:
        """The replica of the j-th gateway probe: the next one every 2 x engines probes, so that each replica
        probes every engine with its request sent first and second (`pairs` rotates both over that span)."""
        return (j // (2 * len(self.ctx.urls))) % len(self.replicas)

    async def one(self, req: LiveRequest) -> LiveResult:
        out = LiveResult(id=req.id, path=req.path, tenant=req.tenant, group="", sent_s=0.0)
        await stream_one(self.ctx.session, req, out, t0=time.perf_counter())
        if req.path == "direct":
            self.direct.append(out)
        return out

    async def warm(self) -> None:
        for k in range(len(self.ctx.urls)):
            await self.one(self._request(engine=k, via_gateway=False))

    async def pairs(self, *, count: int | None = None, until: float | None = None, at_once: bool = True,
                    controls_ms: tuple[float, ...] = ()) -> list[float]:
        """Added TTFT of each pair (seconds), to the same engine. Under load (`at_once`) both requests of a pair
        are sent together, so they usually join the same engine step and the difference is the gateway's;
        when the gateway's delay makes its request miss that step, the pair shows a whole step more. The mean
        over pairs counts both cases at their frequency, so it estimates the added time without bias; the
        median shows the usual pair. Which request's task starts first alternates. On idle engines a pair is
        sent one request after the other instead (an idle engine starts a step for the first arrival at once,
        which would charge the second a whole step).

        `controls_ms`: control pairs take turns with the gateway's (`control_pairs`), two direct requests of
        which the second leaves that many milliseconds after the first: what this method charges a known pure
        delay. The gateway's request always reaches the engine after its twin and may queue behind it in
        the engine's own front end; the controls show how much of the gateway's figure that ordering makes."""
        added: list[float] = []
        self.pair_replicas = []
        kinds: list[float | None] = [None, *controls_ms]  # None: a gateway pair
        i = 0
        while (count is None or i < count) and (until is None or time.perf_counter() < until):
            k = (i // len(kinds)) % len(self.ctx.urls)
            kind = kinds[i % len(kinds)]
            i += 1
            if kind is not None:
                await self._control_pair(k, kind / 1000)
                continue
            gw_first = (i // (len(kinds) * len(self.ctx.urls))) % 2 == 0
            reqs = [self._request(engine=k, via_gateway=True), self._request(engine=k, via_gateway=False)]
            replica = self.replica_used[-1]
            if not gw_first:
                reqs.reverse()
            if at_once:
                results = list(await asyncio.gather(*(self.one(r) for r in reqs)))
            else:
                results = [await self.one(r) for r in reqs]
            by_path = {r.path: r for r in results}
            g, d = by_path["gateway"], by_path["direct"]
            if g.error is None and d.error is None and g.ttft_s is not None and d.ttft_s is not None:
                added.append(g.ttft_s - d.ttft_s)
                self.pair_replicas.append(replica)
        return added

    async def _control_pair(self, engine: int, offset_s: float) -> None:
        """Two direct requests, the second sent `offset_s` after the first (libuv's timers have millisecond
        resolution, so the real offset is measured and recorded beside the added time)."""
        first, second = self._request(engine=engine, via_gateway=False), self._request(engine=engine, via_gateway=False)
        sent: dict[str, float] = {}

        async def send(req: LiveRequest, delay_s: float) -> LiveResult:
            if delay_s > 0:
                await asyncio.sleep(delay_s)
            sent[req.id] = time.perf_counter()
            return await self.one(req)

        a, b = await asyncio.gather(send(first, 0.0), send(second, offset_s))
        if a.error is None and b.error is None and a.ttft_s is not None and b.ttft_s is not None:
            gap = sent[second.id] - sent[first.id]
            self.control_pairs.setdefault(offset_s * 1000, []).append((gap, gap + b.ttft_s - a.ttft_s))


def control_rows(pairs: dict[float, list[tuple[float, float]]]) -> list[dict[str, Any]]:
    """Each control offset's real mean offset and the added time the pairs charged it (ms)."""
    rows = []
    for offset_ms, values in sorted(pairs.items()):
        gaps, added = [g for g, _ in values], [a for _, a in values]
        rows.append({"offset_ms": offset_ms, "pairs": len(values),
                     "real_offset_ms": round(statistics.fmean(gaps) * 1000, 3),
                     "added_ms": _ms(mean_ci(added)), "added_median_ms": round(statistics.median(added) * 1000, 3),
                     "share_over_5ms": round(over_5ms(added), 4)})
    return rows


def by_replica(added: list[float], replicas: list[int], count: int) -> list[dict[str, Any]]:
    """The loaded pairs' added time per gateway replica: pairs, mean (ms)."""
    out = []
    for i in range(count):
        mine = [a for a, r in zip(added, replicas, strict=True) if r == i]
        out.append({"replica": i, "pairs": len(mine),
                    "added_ms": round(statistics.fmean(mine) * 1000, 3) if mine else None})
    return out


def over_5ms(values: list[float]) -> float:
    """The share of pairs that charged more than 5 ms (most often a whole engine step)."""
    return sum(v > 0.005 for v in values) / len(values) if values else 0.0


def mean_ci(values: list[float], *, seed: int = 0, rounds: int = 400) -> tuple[float, float, float]:
    """Mean and a bootstrap 95% interval of the mean."""
    if not values:
        return float("nan"), float("nan"), float("nan")
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(rounds))
    return statistics.fmean(values), means[int(0.025 * rounds)], means[int(0.975 * rounds) - 1]


def _ms(values: tuple[float, float, float]) -> list[float]:
    return [round(v * 1000, 3) for v in values]


def background_requests(ctx: LiveContext, gateway: GatewayGroup, *, background: str, streams: int, base_rate: float,
                        window_s: float, drain_s: float, seed: int) -> list[LiveRequest]:
    """The loaded window's background through `gateway`, spread over its replicas in turn: the shared-prefix workload
    at `base_rate`, or `reference`: `streams` closed-loop chains in all (`live_workloads.reference_chains`)."""
    if background == "reference":
        target = Target(url=gateway.url, model=ctx.model, keys=ctx.keys.tenants, door_urls=gateway.urls)
        return reference_chains(streams=streams, window_s=window_s, target=target, tenants=list(ctx.keys.tenants),
                                chars_per_token=ctx.chars_per_token, seed=seed,
                                prompt_tokens=REFERENCE_PROMPT_TOKENS, output_tokens=REFERENCE_OUTPUT_TOKENS)
    spec = PointSpec(workload="shared-prefix", profile="", load=1.0, rate=base_rate, window_s=window_s,
                     drain_s=drain_s, seed=seed, tag="overhead")
    return build_requests(ctx, spec, gateway.url, spread=gateway.urls)


def chains_ran_out(requests: list[LiveRequest], results: list[LiveResult]) -> int:
    """Closed-loop chains whose last request was sent: they stopped before the window ended (a chain too short for
    engines this fast), so the background thinned out; 0 for an open loop."""
    followed = {r.after for r in requests if r.after is not None}
    sent = {r.id for r in results}
    return sum(1 for r in requests if r.after is not None and r.id not in followed and r.id in sent)


def background_label(row: dict[str, Any]) -> str:
    """Which background an overhead row was measured under (rows written before there was a choice: shared-prefix)."""
    if row.get("background", "shared-prefix") == "reference":
        return f"reference background, {row.get('streams')} closed-loop streams"
    return "shared-prefix background at the base rate"


def overhead_line(row: dict[str, Any]) -> str:
    """The progress line of an overhead row."""
    return (f"overhead ({row['profile']}, {row['gateway_replicas']} gateway replica(s), {background_label(row)}): "
            f"+{row['idle_added_ms'][0]:.2f} ms idle, +{row['loaded_added_ms'][0]:.2f} ms "
            f"under load (95% {row['loaded_added_ms'][1]:.2f}..{row['loaded_added_ms'][2]:.2f}) = "
            f"{(row['added_share_of_ttft_p50'] or 0):.2%} of TTFT p50, gateway CPU "
            f"{row['gateway_cpu_ms_per_request']:.2f} ms/request at {row['output_tps']:.0f} tok/s; "
            f"background TTFT p50 {row['background_ttft_p50_s']:.3f} s, {row['background_requests']} requests")


async def run_overhead(ctx: LiveContext, *, profile: str, base_rate: float, window_s: float, drain_s: float,
                       seed: int, idle_pairs: int = 40, controls_ms: tuple[float, ...] = (), replicas: int = 0,
                       background: str = "shared-prefix", streams: int = 0) -> dict[str, Any]:
    """`streams`: the reference background's closed-loop streams per engine (ignored by the shared-prefix one)."""
    if background not in BACKGROUNDS:
        raise ValueError(f"overhead background {background!r}: expected one of {list(BACKGROUNDS)}")
    session, urls = ctx.session, ctx.urls
    total_streams = streams * len(urls) if background == "reference" else 0
    await live_engines.wait_idle(session, urls, timeout_s=30)
    if ctx.resets:
        await live_engines.reset_prefix_caches(session, urls)
    gateway = await start_gateway_door(ctx, ctx.profiles[profile], replicas=replicas)
    try:
        prober = Prober(ctx, gateway.url, replicas=gateway.urls)
        usage_before = await usage_each(session, gateway, ctx.keys.admin)
        before = await live_engines.counters(session, urls)
        await prober.warm()
        own0 = await live_own_time.scrape(session, gateway.metrics_urls)
        idle = await prober.pairs(count=idle_pairs, at_once=False)
        own1 = await live_own_time.scrape(session, gateway.metrics_urls)
        load = background_requests(ctx, gateway, background=background, streams=total_streams, base_rate=base_rate,
                                   window_s=window_s, drain_s=drain_s, seed=seed)
        cpu0, each0, redis0 = gateway.cpu_s(), gateway.cpu_each(), gateway.redis_cpu_s()
        probes_before = prober.gateway_requests
        mid0 = await live_engines.counters(session, urls)
        spy_dir, pid = ctx.py_spy_dir, gateway.replicas[0].popen.pid  # replica 0's profile
        sampler = (live_pyspy.start(pid, live_pyspy.point_file(spy_dir, f"overhead {profile} x{len(gateway.replicas)}"),
                                    duration_s=window_s)
                   if spy_dir else None)
        lag = LoopLag()
        lag.start()
        t0, wall0 = time.perf_counter(), time.time()
        load_task = asyncio.create_task(replay(session, load, drain_deadline_s=window_s + drain_s,
                                               send_until_s=window_s))
        loaded = await prober.pairs(until=t0 + window_s, controls_ms=controls_ms)
        mid1, own2 = await asyncio.gather(live_engines.counters(session, urls),
                                          live_own_time.scrape(session, gateway.metrics_urls))
        elapsed = time.perf_counter() - t0
        cpu = gateway.cpu_s() - cpu0
        cpu_each = [b - a for a, b in zip(each0, gateway.cpu_each(), strict=True)]
        redis1 = gateway.redis_cpu_s()
        await asyncio.to_thread(live_pyspy.finish, sampler)
        results, _ = await load_task
        await lag.stop()
        quiet = await live_engines.wait_idle(session, urls, timeout_s=30)
        after = await live_engines.counters(session, urls)
        charged, usage_shared = await settled_charges(session, gateway, ctx.keys.admin, usage_before)
    finally:
        await asyncio.to_thread(gateway.stop)
    # each gateway's own event loop over the loaded window: its lag (what a probe arriving then waited for) and GC
    loops = [load_summary(path, since=wall0, until=wall0 + elapsed) if path else None for path in gateway.loop_paths]
    served = len(results) + prober.gateway_requests - probes_before
    window = total(deltas(mid0, mid1))
    whole = total(deltas(before, after))
    ok = [r.ttft_s for r in results if r.ttft_s is not None and r.error is None]
    ttft_p50 = quantile(ok, 0.5) if ok else float("nan")
    loaded_ci = mean_ci(loaded)
    direct_prompt = sum(r.prompt_tokens or 0 for r in prober.direct)
    direct_completion = sum(r.completion_tokens or 0 for r in prober.direct)
    direct_known = all(r.prompt_tokens is not None and r.completion_tokens is not None for r in prober.direct)
    left_early = sum(1 for r in results if (r.cancelled or r.forced) and r.chunks == 0)
    prompts = [r.prompt_tokens for r in results if r.prompt_tokens is not None and r.error is None]
    row: dict[str, Any] = {
        "kind": "overhead", "profile": profile, "window_s": window_s,
        # an open loop's offered rate; a closed loop has none (its streams set the load)
        "background": background, "rate": None if total_streams else base_rate, "streams": total_streams or None,
        "background_chains_ran_out": chains_ran_out(load, results),
        "background_prompt_tokens_mean": statistics.fmean(prompts) if prompts else None,
        "idle_pairs": len(idle), "idle_added_ms": _ms(mean_ci(idle)), "idle_added_median_ms": _ms(median_ci(idle)),
        "loaded_pairs": len(loaded), "loaded_added_ms": _ms(loaded_ci),
        "loaded_added_median_ms": _ms(median_ci(loaded)),
        "loaded_added_p90_ms": round(quantile(loaded, 0.9) * 1000, 3) if loaded else None,
        "loaded_added_each_ms": [round(v * 1000, 2) for v in loaded],  # every pair, to see the tail's shape
        "loaded_share_over_5ms": round(over_5ms(loaded), 4),
        "controls": control_rows(prober.control_pairs),
        "background_requests": len(results), "background_ttft_p50_s": ttft_p50,
        "background_ttft_p90_s": quantile(ok, 0.9) if ok else None,
        "added_share_of_ttft_p50": loaded_ci[0] / ttft_p50 if ok and ttft_p50 > 0 else None,
        "output_tps": window.generation_tokens / elapsed,
        "gateway_cpu_s": cpu, "gateway_requests": served,
        "gateway_cpu_ms_per_request": 1000 * cpu / max(1, served),
        "gateway_cpu_ms_per_1k_output_tokens": 1000 * cpu / max(1.0, window.generation_tokens / 1000),
        "client_loop_lag_p99_s": lag.p99(), "gateway_loop": loops[0],
        "gateway_replicas": len(gateway.replicas), "usage_shared": usage_shared,
        "engine_prompt_tokens": whole.prompt_tokens, "engine_generation_tokens": whole.generation_tokens,
        "direct_prompt_tokens": direct_prompt, "direct_completion_tokens": direct_completion,
        "charged_prompt_tokens": charged["prompt_tokens"], "charged_completion_tokens": charged["completion_tokens"],
        "cancelled": sum(1 for r in results if r.cancelled), "forced": sum(1 for r in results if r.forced),
        "left_before_first_chunk": left_early,
    }
    row["lost_prompt_tokens"] = whole.prompt_tokens - direct_prompt - charged["prompt_tokens"]
    row["lost_completion_tokens"] = whole.generation_tokens - direct_completion - charged["completion_tokens"]
    row["comparable"] = bool(direct_known and quiet and left_early == 0)
    # the second method: the gateway's own clocks over the idle pairs and the loaded window (`live_own_time`)
    row.update(live_own_time.own_row(live_own_time.window(own0, own1), live_own_time.window(own1, own2),
                                     ttft_p50_s=ttft_p50 if ok else None))
    if len(gateway.replicas) > 1 or gateway.redis is not None:
        row["gateway_loops"] = loops
        row["loaded_added_by_replica_ms"] = by_replica(loaded, prober.pair_replicas, len(gateway.replicas))
        row["gateway_cpu_s_each"] = cpu_each
        row["redis_cpu_s"] = redis1 - redis0 if redis0 is not None and redis1 is not None else None
    return row
