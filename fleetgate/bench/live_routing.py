"""The live routing benchmark: routing profiles, the gateway's cost and exact accounting, on real engines.

`run_live(urls, options)` drives engines that are already serving (two vLLM replicas on GPUs, vLLM CPU
engines, or simulated ones) through FleetGate's gateway, within a hard time budget, writing one JSON
row per measurement to `results.jsonl` as soon as it is known (a run cut short keeps what it did):

1. `meta`: the engines' model, KV capacity (`vllm:cache_config_info`, or `--kv-tokens`), the tokenizer's
   characters per token on the workloads' words, sizes and options;
2. `calibration` (optional): TTFT against prompt length and TPOT against batch size on one engine
   (`fleetgate.sim.calibrate.probe`), fitted to the simulator's step-time constants;
3. `capacity`: a closed loop of `probe_concurrency` streams of the shared-prefix workload sent straight
   to the engines in turn (round-robin) for `probe_s`: the completions per second over its second half
   are the *base rate*, round-robin's capacity; offered loads are multiples of it;
4. `point` rows (`fleetgate.bench.live_points`), in priority order: shared-prefix at the first two
   loads for every profile, the accounting point (the default profile at `accounting_load` with
   `accounting_cancel_share` of the requests leaving mid-stream), the gateway-overhead phase
   (`fleetgate.bench.live_overhead`, on its chosen background load), unique prompts, shared-prefix at the
   other loads, chat. Every
   profile of one (workload, load) gets the same seed, so the same requests; last, with `epp_loads`, issue 27's
   door points and door-latency phase (`fleetgate.bench.live_epp`);
5. `accounting`: the sum over every comparable row of the engines' prompt and generation token counters
   against what the gateway charged the tenants; `PASS` when nothing is lost either way.
A point that would not end before the budget is skipped (a `skipped` row says so).
`gateway_replicas` > 1 makes every gateway door (points and the overhead phase; not issue 27's door-latency phase)
that many gateway processes sharing a fresh redis-server (`fleetgate.bench.live_replicas`); a run that needs one
and finds none fails at its start.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp

from fleetgate.bench import live_engines, live_pyspy
from fleetgate.bench.live_client import LiveRequest, LiveResult, stream_one
from fleetgate.bench.live_gateway import Keys, Profile, kv_event_routes, resolve_profile, template_vars
from fleetgate.bench.live_overhead import BACKGROUNDS, overhead_line, run_overhead
from fleetgate.bench.live_points import LiveContext, PointSpec, run_point
from fleetgate.bench.live_replicas import require_redis
from fleetgate.bench.live_workloads import Sizes, Target, sized_items, to_requests
from fleetgate.core.errors import ConfigError
from fleetgate.engine.vllm_counters import deltas, total
from fleetgate.sim.report import quantile


@dataclass
class LiveOptions:
    profiles: list[str] = field(default_factory=lambda: ["round-robin", "least-loaded", "default"])
    profile_configs: dict[str, Path] = field(default_factory=dict)
    loads: list[float] = field(default_factory=lambda: [1.5, 1.0, 0.5])  # priority order
    window_s: float = 10.0
    short_window_s: float = 8.0  # points after the first two loads
    drain_s: float = 20.0
    unique_loads: list[float] = field(default_factory=lambda: [0.8])
    unique_profiles: list[str] = field(default_factory=lambda: ["least-loaded", "default", "round-robin"])  # in turn
    chat_loads: list[float] = field(default_factory=lambda: [1.0])
    chat_users: int = 48
    chat_profiles: list[str] = field(default_factory=lambda: ["round-robin", "least-loaded", "default"])
    accounting_profile: str = "default"
    accounting_load: float = 1.0
    accounting_cancel_share: float = 0.3
    # > 0: a second accounting row whose gateway lets the engine finish an answer a client left with at most
    # this many tokens to come (`server.cancel_finish_tokens`): no abort, so no step in flight is lost
    accounting_finish_tokens: int = 0
    overhead_profiles: list[str] = field(default_factory=lambda: ["default"])  # each once per replica count
    overhead_window_s: float = 12.0
    overhead_idle_pairs: int = 40
    overhead_controls_ms: tuple[float, ...] = ()  # control pairs' offsets (`live_overhead.Prober.pairs`)
    # the overhead phase's background load (`live_overhead.BACKGROUNDS`): "shared-prefix" (open loop at the base
    # rate) or "reference" (issue 24's scale: `overhead_streams` closed-loop streams per engine, ~1k-token unique
    # prompts, 128-token answers)
    overhead_background: str = "shared-prefix"
    overhead_streams: int = 64
    probe_s: float = 10.0
    probe_concurrency: int = 0  # 0: 96 per engine
    base_rate: float | None = None  # skip the capacity probe
    calibrate: bool = True
    calibration_lengths: tuple[int, ...] = (128, 512, 1024, 2048, 4096)
    calibration_batches: tuple[int, ...] = (1, 16, 64, 128)
    calibration_reps: int = 3
    budget_s: float = 400.0
    seed: int = 24
    # more seeds for the first load's shared-prefix points (each profile again on other requests, tagged
    # `seed-N`), right after the main loads: a second sample of the comparison that matters most near saturation
    repeat_seeds: list[int] = field(default_factory=list)
    accounting: bool = True  # False: no accounting row (a run that measures something else)
    sizes: Sizes = field(default_factory=Sizes)
    kv_tokens: int | None = None
    kv_events: list[str] = field(default_factory=list)  # engine i's ZMQ publisher
    kv_replays: list[str] = field(default_factory=list)  # engine i's replay address
    kv_topic: str = "kv-events"
    model_dir: str = ""
    block_size: int = 16
    # Issue 27 (`fleetgate.bench.live_epp`), after every other point: the shared-prefix workload at each of
    # `epp_loads` through the gateway and through Envoy + `fleetgate epp`, for each of `epp_profiles` (the same
    # requests for all four), then the door-latency phase at the first of them (`epp_latency_window_s` > 0)
    epp_loads: list[float] = field(default_factory=list)
    epp_profiles: list[str] = field(default_factory=lambda: ["least-loaded", "default"])
    epp_window_s: float | None = None  # None: short_window_s
    epp_latency_window_s: float = 10.0
    epp_idle_rounds: int = 24
    epp_latency_profile: str = "default"
    epp_site: str = ""  # a site directory first on the picker's path (the GPU machine's gRPC packages)
    py_spy_dir: Path | None = None  # py-spy samples of each gateway point (`fleetgate.bench.live_pyspy`)
    gateway_replicas: int = 1  # gateway processes per door, sharing one Redis when > 1 (`live_replicas`)
    overhead_replicas: tuple[int, ...] = ()  # the overhead phase once per count (same requests); (): gateway_replicas
    gateway_redis: bool = False  # state in Redis even with one replica (the shared state's own cost)


class Recorder:
    """Appends JSON rows to a file (flushed and synced each time) and prints a stamped line per row."""

    def __init__(self, path: Path, *, log: Callable[[str], None]) -> None:
        self.path = path
        self.log = log
        self.rows: list[dict[str, Any]] = []
        path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, row: dict[str, Any]) -> None:
        row = {"at": time.strftime("%Y-%m-%dT%H:%M:%S"), **row}
        self.rows.append(row)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row, default=str) + "\n")
            fh.flush()
            os.fsync(fh.fileno())


def stamp(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _seed(base: int, workload: str, load: float) -> int:
    return base + zlib.crc32(f"{workload}:{load:g}".encode()) % 100_000


async def capacity_probe(ctx: LiveContext, *, seconds: float, concurrency: int, seed: int) -> dict[str, Any]:
    """Round-robin's capacity on the shared-prefix workload: a closed loop straight to the engines, in turn."""
    items = sized_items("shared-prefix", seed=seed, rate=max(1.0, concurrency / seconds) * 4, window_s=seconds * 2,
                      sizes=ctx.sizes, chars_per_token=ctx.chars_per_token, capacity_tokens=ctx.capacity_tokens,
                      replicas=len(ctx.urls))
    target = Target(url="", model=ctx.model, keys={}, engine_urls=tuple(ctx.urls))
    reqs = to_requests(items, target=target, tenants=ctx.sizes.tenants, path="direct",
                       output_tokens=ctx.sizes.output_tokens)
    queue = list(reversed(reqs))
    done: list[LiveResult] = []
    before = await live_engines.counters(ctx.session, ctx.urls)
    t0 = time.perf_counter()
    deadline = t0 + seconds

    async def worker() -> None:
        while queue and time.perf_counter() < deadline:
            req: LiveRequest = queue.pop()
            out = LiveResult(id=req.id, path=req.path, tenant="", group=req.group, sent_s=time.perf_counter() - t0)
            await stream_one(ctx.session, req, out, t0=t0)
            done.append(out)

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    await asyncio.sleep(seconds / 2)
    half = await live_engines.counters(ctx.session, ctx.urls)
    await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
    end = await live_engines.counters(ctx.session, ctx.urls)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    # The second half's generated tokens, per request's worth of tokens: the fleet's steady request rate
    # (completions alone would be few and lumpy when a request lasts a good part of the probe).
    late = total(deltas(half, end))
    whole = total(deltas(before, end))
    ttfts = [r.ttft_s for r in done if r.ttft_s is not None and r.error is None]
    return {"kind": "capacity", "seconds": seconds, "concurrency": concurrency, "completed": len(done),
            "ttft_p50_s": quantile(ttfts, 0.5) if ttfts else None,
            "ttft_p90_s": quantile(ttfts, 0.9) if ttfts else None,
            "base_rate": late.generation_tokens / (seconds / 2) / ctx.sizes.output_tokens,
            "output_tps": late.generation_tokens / (seconds / 2), "hit_rate": late.hit_rate,
            "uncached_prompt_tps": late.uncached_prompt_tokens / (seconds / 2),
            "whole_hit_rate": whole.hit_rate,
            "errors": sum(1 for r in done if r.error), "error_sample": next((r.error for r in done if r.error), None)}


async def calibration(ctx: LiveContext, options: LiveOptions) -> dict[str, Any]:
    from fleetgate.sim.calibrate import fit_line, probe

    real = await probe(url=ctx.urls[0], model=ctx.model, prompt_lengths=options.calibration_lengths,
                       batch_sizes=options.calibration_batches, reps=options.calibration_reps,
                       output_tokens=32, decode_prompt_tokens=64, chars_per_token=ctx.chars_per_token)
    a, b = fit_line(real.ttft_by_len)
    c, d = fit_line(real.tpot_by_batch)
    return {"kind": "calibration", "ttft_by_len": real.ttft_by_len, "tpot_by_batch": real.tpot_by_batch,
            "ttft_intercept_s": a, "prefill_s_per_token": b, "step_overhead_s": c, "decode_s_per_seq": d,
            "chars_per_token": real.chars_per_token}


def plan(options: LiveOptions, base_rate: float) -> list[PointSpec]:
    """Every measurement in priority order (see the module docstring)."""
    o = options
    out: list[PointSpec] = []

    def shared(loads: list[float], window: float, *, seed: int, tag: str = "routing") -> None:
        for load in loads:
            for profile in o.profiles:
                out.append(PointSpec(workload="shared-prefix", profile=profile, load=load, rate=base_rate * load,
                                     window_s=window, drain_s=o.drain_s, seed=_seed(seed, "shared-prefix", load),
                                     tag=tag))

    shared(o.loads[:2], o.window_s, seed=o.seed)
    for extra in o.repeat_seeds:
        shared(o.loads[:1], o.window_s, seed=extra, tag=f"seed-{extra}")
    if o.accounting:
        accounting = PointSpec(workload="shared-prefix", profile=o.accounting_profile, load=o.accounting_load,
                               rate=base_rate * o.accounting_load, window_s=o.window_s, drain_s=o.drain_s,
                               seed=_seed(o.seed, "accounting", o.accounting_load),
                               cancel_share=o.accounting_cancel_share, tag="accounting")
        out.append(accounting)
        if o.accounting_finish_tokens > 0:  # the same requests, through a gateway that lets the engine finish
            out.append(replace(accounting, tag="accounting-finish",
                               server=(("cancel_finish_tokens", o.accounting_finish_tokens),)))
    if o.overhead_window_s > 0:
        if o.overhead_background not in BACKGROUNDS:
            raise ConfigError(f"overhead background {o.overhead_background!r}: expected one of {list(BACKGROUNDS)}")
        reference = o.overhead_background == "reference"
        if reference and o.overhead_streams < 1:
            raise ConfigError(f"the reference background needs at least one stream per engine, got "
                              f"{o.overhead_streams}")
        for profile in o.overhead_profiles:  # the same requests for every profile and replica count
            for replicas in o.overhead_replicas or (o.gateway_replicas,):
                out.append(PointSpec(workload=o.overhead_background, profile=profile, load=1.0, rate=base_rate,
                                     window_s=o.overhead_window_s, drain_s=o.drain_s, replicas=replicas,
                                     seed=_seed(o.seed, "overhead", 1.0), tag="overhead",
                                     streams=o.overhead_streams if reference else 0))
    for load in o.unique_loads:
        for profile in o.unique_profiles:
            out.append(PointSpec(workload="unique", profile=profile, load=load, rate=base_rate * load,
                                 window_s=o.short_window_s, drain_s=o.drain_s, seed=_seed(o.seed, "unique", load)))
    shared(o.loads[2:], o.short_window_s, seed=o.seed)
    for load in o.chat_loads:
        users = max(1, round(o.chat_users * load))
        for profile in o.chat_profiles:
            out.append(PointSpec(workload="chat", profile=profile, load=load, rate=users / (o.short_window_s / 2),
                                 window_s=o.short_window_s, drain_s=o.drain_s, seed=_seed(o.seed, "chat", load),
                                 users=users))
    out += door_plan(o, base_rate)
    return out


def door_plan(o: LiveOptions, base_rate: float) -> list[PointSpec]:
    """Issue 27's points (`LiveOptions.epp_loads`): per load, each profile through both doors with one seed, the
    doors' order alternating between profiles (gateway, Envoy + EPP, Envoy + EPP, gateway, ...) so that a drift
    of the machine over the group favours neither; the door-latency phase after the first load."""
    out: list[PointSpec] = []
    window = o.epp_window_s or o.short_window_s
    for n, load in enumerate(o.epp_loads):
        for i, profile in enumerate(o.epp_profiles):
            doors = ("gateway", "envoy+epp") if i % 2 == 0 else ("envoy+epp", "gateway")
            out += [PointSpec(workload="shared-prefix", profile=profile, load=load, rate=base_rate * load,
                              window_s=window, drain_s=o.drain_s, seed=_seed(o.seed, "door", load), tag="door",
                              door=door) for door in doors]
        if n == 0 and o.epp_latency_window_s > 0:
            out.append(PointSpec(workload="shared-prefix", profile=o.epp_latency_profile, load=load,
                                 rate=base_rate * load, window_s=o.epp_latency_window_s, drain_s=o.drain_s,
                                 seed=_seed(o.seed, "door-latency", load), tag="door-latency", door="envoy+epp"))
    return out


DOOR_START_S = 4.0  # Envoy and the picker starting, and Envoy's first health check of the picker
LATENCY_FIXED_S = 20.0  # the door-latency phase: three doors starting, the idle rounds, the drain
# a closed loop's tail: the requests in flight when the window ends run to their end (at issue 24's scale a
# 128-token answer takes ~3-4 s: TTFT p50 0.58 s plus 128 steps of a 64-stream batch)
CLOSED_LOOP_TAIL_S = 8.0


def estimate_s(spec: PointSpec) -> float:
    """A point's expected duration: its window, the backlog it leaves past saturation (a closed loop: the requests in
    flight at the window's end), the fixed costs."""
    backlog = CLOSED_LOOP_TAIL_S - 3.0 if spec.streams else spec.window_s * max(0.0, spec.load - 1.0)
    base = spec.window_s + min(spec.drain_s, backlog + 3.0) + 5.0
    if spec.tag == "door-latency":
        return spec.window_s + LATENCY_FIXED_S
    return base + (DOOR_START_S if spec.door != "gateway" else 0.0)


def accounting_summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The engines' counters against the tenants' charges over every row that measured both."""
    measured = [r for r in rows if r.get("kind") in ("point", "overhead") and "lost_prompt_tokens" in r]
    comparable = [r for r in measured if r.get("comparable")]
    sums = {k: sum(float(r.get(k) or 0) for r in comparable) for k in (
        "engine_prompt_tokens", "engine_generation_tokens", "charged_prompt_tokens", "charged_completion_tokens",
        "direct_prompt_tokens", "direct_completion_tokens", "lost_prompt_tokens", "lost_completion_tokens",
        "cancelled")}
    verdict = "PASS" if comparable and sums["lost_prompt_tokens"] == 0 and sums["lost_completion_tokens"] == 0 \
        else "FAIL"
    return {"kind": "accounting", "verdict": verdict, "rows": len(comparable),
            "excluded": [f"{r.get('workload', r.get('kind'))} {r.get('profile')} x{r.get('load', 1)}"
                         for r in measured if not r.get("comparable")],
            "lossy": [f"{r.get('workload', r.get('kind'))} {r.get('profile')} x{r.get('load', 1)} [{r.get('tag')}]: "
                      f"{r.get('lost_prompt_tokens', 0):.0f} prompt, "
                      f"{r.get('lost_completion_tokens', 0):.0f} completion over "
                      f"{r.get('cancelled', 0):.0f} cancellations" for r in comparable
                      if r.get("lost_prompt_tokens") or r.get("lost_completion_tokens")],
            **sums}


def accounting_line(summary: dict[str, Any]) -> str:
    s = summary
    return (f"ACCOUNTING {s['verdict']}: over {s['rows']} rows ({s['cancelled']:.0f} requests cancelled mid-stream), "
            f"engines counted {s['engine_prompt_tokens']:.0f} prompt + {s['engine_generation_tokens']:.0f} generated "
            f"tokens (direct probes {s['direct_prompt_tokens']:.0f} + {s['direct_completion_tokens']:.0f}); tenants "
            f"were charged {s['charged_prompt_tokens']:.0f} prompt + {s['charged_completion_tokens']:.0f} completion; "
            f"lost {s['lost_prompt_tokens']:.0f} prompt, {s['lost_completion_tokens']:.0f} completion"
            + (f"; rows that lost tokens: {s['lossy']}" if s.get("lossy") else "")
            + (f"; not comparable (left before a first chunk, or engines not idle): {s['excluded']}"
               if s["excluded"] else ""))


def _point_line(row: dict[str, Any]) -> str:
    def f(v: Any, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    lost = (f"lost {row['lost_prompt_tokens']:.0f}/{row['lost_completion_tokens']:.0f}" if "lost_prompt_tokens" in row
            else "charges not read")
    door = "" if row.get("door", "gateway") == "gateway" else f" via {row['door']}"
    events = row.get("kv_events") or {}
    kv = (f"KV events {events.get('batches', 0):.0f} batches in {events.get('wakes', 0):.0f} wakes, "
          if events else "")
    return (f"{row['workload']} x{row['load']:g} {row['profile']} [{row['tag']}]{door}: {row['requests']} req "
            f"({row['errors']} err, {row['cancelled']} cancelled, {row['forced']} forced), TTFT p50 "
            f"{f(row['ttft_p50_s'], '.3f')}s p90 {f(row['ttft_p90_s'], '.3f')}s, {row['output_tps']:.0f} tok/s, "
            f"hit {row['hit_rate']:.1%}, {lost}, door CPU {row['gateway_cpu_ms_per_request']:.2f} ms/req, "
            f"{kv}{row['elapsed_s']:.1f}s")


async def _context(session: aiohttp.ClientSession, urls: list[str], options: LiveOptions, workdir: Path
                   ) -> tuple[LiveContext, dict[str, Any]]:
    # before anything runs
    redis = require_redis(max((options.gateway_replicas, *options.overhead_replicas)), redis=options.gateway_redis)
    model = await live_engines.model_name(session, urls[0])
    cpt = await live_engines.chars_per_token(session, urls[0], model=model)
    snaps = await live_engines.counters(session, urls)
    capacity = options.kv_tokens or min(s.kv_capacity_tokens for s in snaps) or 16_384
    variables = template_vars(urls=urls, kv_events=options.kv_events, model_dir=options.model_dir,
                              block_size=options.block_size)
    doors = [*options.epp_profiles, options.epp_latency_profile] if options.epp_loads else []
    wanted = dict.fromkeys([*options.profiles, *options.unique_profiles, *options.chat_profiles,
                            options.accounting_profile, *options.overhead_profiles, *doors])
    profiles: dict[str, Profile] = {}
    unknown: dict[str, str] = {}
    for name in wanted:
        try:
            profiles[name] = resolve_profile(name, configs=options.profile_configs, variables=variables)
        except ConfigError as exc:
            unknown[name] = str(exc)
    ctx = LiveContext(session=session, urls=urls, model=model, keys=Keys.make(options.sizes.tenants),
                      sizes=options.sizes, chars_per_token=cpt, capacity_tokens=capacity, workdir=workdir,
                      profiles=profiles, epp_site=options.epp_site, py_spy_dir=options.py_spy_dir,
                      gateway_replicas=options.gateway_replicas, redis_server=redis)
    if options.py_spy_dir and live_pyspy.binary() is None:
        ctx.log(f"--py-spy-dir {options.py_spy_dir}: no py-spy on PATH or in $FLEETGATE_PY_SPY: no samples")
    ctx.resets = await live_engines.reset_prefix_caches(session, urls)
    ctx.kv_events = kv_event_routes(urls=urls, publishers=options.kv_events, replays=options.kv_replays,
                                    topic=options.kv_topic)
    meta = {"kind": "meta", "urls": urls, "model": model, "chars_per_token": cpt, "kv_capacity_tokens": capacity,
            "gateway_chars_per_token": "auto",  # what the presets' scorers use (a replay of older runs pins 4)
            "kv_capacity_reported": [s.kv_capacity_tokens for s in snaps], "replicas": len(urls),
            "groups": options.sizes.groups(capacity_tokens=capacity, replicas=len(urls)),
            "prefix_cache_reset": ctx.resets, "profiles": list(profiles), "unknown_profiles": unknown,
            "kv_events": ctx.kv_events, "gateway_replicas": options.gateway_replicas, "redis_server": redis,
            "cpus": os.cpu_count(), "load_average": os.getloadavg()[0],
            "options": {k: v for k, v in asdict(options).items() if k != "sizes"}, "sizes": asdict(options.sizes)}
    return ctx, meta


async def run_live(urls: list[str], options: LiveOptions, *, out_dir: Path, workdir: Path,
                   log: Callable[[str], None] = stamp) -> list[dict[str, Any]]:
    start = time.monotonic()
    rec = Recorder(out_dir / "results.jsonl", log=log)

    def left() -> float:
        return options.budget_s - (time.monotonic() - start)

    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        ctx, meta = await _context(session, urls, options, workdir)
        rec.add(meta)
        log(f"engines {urls} serve {ctx.model!r}; KV {ctx.capacity_tokens} tokens each; "
            f"{ctx.chars_per_token:.2f} chars/token; {meta['groups']} shared-prefix groups; profiles "
            f"{list(ctx.profiles)}" + (f"; unavailable: {list(meta['unknown_profiles'])}" if meta["unknown_profiles"]
                                       else "") + f"; prefix-cache reset {'on' if ctx.resets else 'NOT served'}")
        if options.calibrate and left() > 60:
            with contextlib.suppress(Exception):
                row = await calibration(ctx, options)
                rec.add(row)
                log(f"calibration: prefill {row['prefill_s_per_token'] * 1e6:.1f} us/token, TPOT = "
                    f"{row['step_overhead_s'] * 1000:.2f} ms + {row['decode_s_per_seq'] * 1000:.3f} ms x batch")
        base = options.base_rate
        if base is None:
            await live_engines.wait_idle(session, urls, timeout_s=30)
            conc = options.probe_concurrency or 96 * len(urls)
            cap = await capacity_probe(ctx, seconds=options.probe_s, concurrency=conc, seed=options.seed + 7)
            rec.add(cap)
            base = float(cap["base_rate"])
            log(f"capacity (round-robin, direct, {conc} streams): {base:.2f} req/s, {cap['output_tps']:.0f} tok/s, "
                f"hit {cap['hit_rate']:.1%}, {cap['errors']} errors")
            if base <= 0:
                raise RuntimeError(f"the capacity probe completed nothing: {cap.get('error_sample')}")
        specs = plan(options, base)
        doors = [s for s in specs if s.tag in ("door", "door-latency")]
        if doors:
            log(f"issue 27 (Envoy + EPP): {len(doors)} points planned, ~{sum(map(estimate_s, doors)):.0f}s, after "
                f"~{sum(estimate_s(s) for s in specs if s not in doors):.0f}s of the others; {left():.0f}s left")
        for spec in specs:
            if spec.profile not in ctx.profiles:
                rec.add({"kind": "skipped", "point": spec.name, "why": "profile unavailable"})
                continue
            need = estimate_s(spec)
            if left() < need:
                why = f"budget: {left():.0f}s left, needs ~{need:.0f}s"
                rec.add({"kind": "skipped", "point": spec.name, "why": why})
                log(f"skip {spec.name}: {left():.0f}s left, needs ~{need:.0f}s")
                continue
            drain = max(2.0, min(spec.drain_s, left() - spec.window_s - 8.0))
            spec = PointSpec(**{**asdict(spec), "drain_s": drain})
            log(f"run {spec.name} " + (f"({spec.streams * len(urls)} closed-loop streams)" if spec.streams
                                        else f"at {spec.rate:.2f}/s") + f" for {spec.window_s:g}s")
            try:
                if spec.tag == "door-latency":
                    from fleetgate.bench.live_epp import door_line, run_door_latency

                    row = await run_door_latency(ctx, spec, idle_rounds=options.epp_idle_rounds)
                    rec.add(row)
                    log(door_line(row))
                elif spec.tag == "overhead":
                    row = await run_overhead(ctx, profile=spec.profile, base_rate=spec.rate, window_s=spec.window_s,
                                             drain_s=spec.drain_s, seed=spec.seed,
                                             idle_pairs=options.overhead_idle_pairs,
                                             controls_ms=options.overhead_controls_ms, replicas=spec.replicas,
                                             background=spec.workload, streams=spec.streams)
                    rec.add(row)
                    log(overhead_line(row))
                else:
                    row = await run_point(ctx, spec)
                    rec.add(row)
                    log(_point_line(row))
            except Exception as exc:  # one failed point must not lose the others
                rec.add({"kind": "error", "point": spec.name, "error": repr(exc)})
                log(f"ERROR in {spec.name}: {exc!r}")
        summary = accounting_summary(rec.rows)
        rec.add(summary)
        log(accounting_line(summary))
    return rec.rows
