"""`fleetgate bench routing`: endpoint-picking policies compared on the same seeded workloads.

Default mode (in-process, virtual time): each workload of `fleetgate.sim.workloads` runs on
`--replicas` simulated engines (`fleetgate.sim.virtual_fleet`) once per policy:
- `round-robin`: `fleetgate.router.roundrobin.RoundRobinScheduler`, the baseline;
- `least-loaded`, `prefix-only`: presets of `fleetgate.router.config.preset`;
- `default`: `build_scheduler(RoutingConfig())`, the scheduler the gateway ships (or `--config`).
`--workload adapters` (not part of `all`) runs `workloads.adapter_mix` (N LoRA fine-tunes, Zipf mix) on
LoRA-enabled engines that load adapters on demand, comparing `least-loaded` (adapter-blind) with
`adapter-affinity` (least-loaded plus the adapter-affinity scorer) and `default`; it also prints the
engines' on-demand loads, disk loads and GPU slot swaps.
Figures per policy: TTFT p50/p90 (engine seconds), prefix-cache hit rate (the engines' own
`prefix_cache_hits / prefix_cache_queries`), output throughput, decision latency p99 (wall clock
and CPU), and ratios against round-robin (and least-loaded for unique prompts).

`--http` runs the shared-prefix workload over HTTP instead, against `--urls` (real vLLM engines)
or an in-process simulated fleet, and reads the prefix-cache counters from each engine's /metrics.

`--live` runs the live benchmark (`fleetgate.bench.live_routing`): shared-prefix, chat and unique
workloads at offered loads relative to round-robin's measured capacity, every request through the
real gateway of each routing profile (`--profiles`, incl. `precise-prefix` when main has it), with the
gateway's added latency and CPU per request, the accounting check against the engines' token counters,
and a report plus a measured throughput file in `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from dataclasses import asdict
from typing import Any

from fleetgate.bench.live_cli import add_live_arguments
from fleetgate.core.config import load_model
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import RoutingConfig, preset
from fleetgate.router.roundrobin import RoundRobinScheduler
from fleetgate.router.types import Scheduler
from fleetgate.sim import workloads
from fleetgate.sim.profile import PROFILES, get_profile
from fleetgate.sim.report import Row, print_table, quantile
from fleetgate.sim.virtual_fleet import RunResult, VirtualClock, run_virtual_fleet
from fleetgate.sim.workloads import WorkItem

POLICIES = ("round-robin", "least-loaded", "prefix-only", "default", "adapter-affinity")
WORKLOADS = ("shared-prefix", "chat", "unique")
DEFAULT_POLICIES = ("round-robin", "least-loaded", "prefix-only", "default")
ADAPTER_POLICIES = ("least-loaded", "adapter-affinity", "default")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", choices=[*WORKLOADS, "adapters", "all"], default="all",
                        help="all: the three prefix workloads; adapters: the LoRA mix, on its own")
    parser.add_argument("--replicas", type=int, default=4, help="simulated engines (default 4)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policies", default=None, help="comma-separated: " + ", ".join(POLICIES) + " (default: "
                        + ", ".join(DEFAULT_POLICIES) + "; with --workload adapters: " + ", ".join(ADAPTER_POLICIES)
                        + ")")
    parser.add_argument("--adapters", type=int, default=8, help="adapters workload: LoRA fine-tunes (default 8)")
    parser.add_argument("--zipf", type=float, default=1.1, help="adapters workload: Zipf exponent of the mix")
    parser.add_argument("--max-loras", type=int, default=4, help="adapters workload: engines' --max-loras")
    parser.add_argument("--max-cpu-loras", type=int, default=None,
                        help="adapters workload: engines' --max-cpu-loras (default: --adapters, all fit host memory)")
    parser.add_argument("--config", default=None, help="routing YAML for the `default` policy (default: shipped)")
    parser.add_argument("--profile", default="vllm-cpu-gemma3-270m", choices=sorted(PROFILES))
    parser.add_argument("--rate", type=float, default=0.6,
                        help="arrivals per engine second (shared-prefix, unique; 0.6 loads 4 replicas of the "
                        "default CPU profile to about 60-70%% under round-robin; try 6 with --profile gpu-8b)")
    parser.add_argument("--groups", type=int, default=24, help="shared-prefix groups (hot prefixes)")
    parser.add_argument("--prompts-per-group", type=int, default=32)
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--http", action="store_true", help="run shared-prefix over HTTP (see --urls)")
    parser.add_argument("--urls", default=None, help="with --http: comma-separated engine base URLs (real vLLM)")
    parser.add_argument("--model", default=None, help="with --http: served model name (default: from /v1/models)")
    parser.add_argument("--max-requests", type=int, default=48, help="with --http: requests per policy")
    parser.add_argument("--kv-tokens", type=int, default=None,
                        help="with --http: one engine's KV capacity in tokens for sizing the workload (default: "
                        "from vllm:cache_config_info; set it for hybrid-attention models such as Gemma 3, whose "
                        "blocks are shared by several KV groups)")
    parser.add_argument("--prefix-tokens", type=int, default=None,
                        help="shared prefix length in tokens (default: 1024 with --http, 2048 with --live)")
    parser.add_argument("--live", action="store_true",
                        help="the live benchmark: every workload, profile and load through FleetGate's gateway to "
                        "--urls (or simulated engines), with the gateway's overhead and the accounting check")
    add_live_arguments(parser)


def make_scheduler(policy: str, *, config: RoutingConfig | None, seed: int, clock: VirtualClock) -> Scheduler:
    if policy == "round-robin":
        return RoundRobinScheduler()
    cfg = (config or RoutingConfig()) if policy == "default" else preset(policy)
    return build_scheduler(cfg, scrape=False, seed=seed, clock=clock)


def make_workload(name: str, args: argparse.Namespace) -> list[WorkItem]:
    if name == "shared-prefix":
        return workloads.shared_prefix(seed=args.seed, groups=args.groups, prompts_per_group=args.prompts_per_group,
                                       rate_rps=args.rate)
    if name == "chat":
        return workloads.multi_round_chat(seed=args.seed)
    if name == "adapters":
        return workloads.adapter_mix(seed=args.seed, adapters=args.adapters, zipf_s=args.zipf, rate_rps=args.rate)
    return workloads.unique_prompts(seed=args.seed, rate_rps=args.rate)


def to_row(policy: str, r: RunResult) -> Row:
    return Row(
        policy=policy,
        ttft_p50=quantile(r.ttft_s, 0.5),
        ttft_p90=quantile(r.ttft_s, 0.9),
        hit_rate=r.hit_rate,
        throughput=r.throughput_tps,
        decision_p99_us=quantile(r.decision_s, 0.99) * 1e6,
        decision_cpu_p99_us=quantile(r.decision_cpu_s, 0.99) * 1e6,
        spread=sorted(r.per_endpoint.values(), reverse=True),
    )


async def run_virtual(args: argparse.Namespace, policies: list[str], config: RoutingConfig | None) -> dict[str, Any]:
    profile = get_profile(args.profile)
    chosen = list(WORKLOADS) if args.workload == "all" else [args.workload]
    print(f"fleetgate bench routing: {args.replicas} simulated replicas, profile {profile.name} "
          f"(KV {profile.capacity_tokens} tokens each, max {profile.max_num_seqs} running), seed {args.seed}")
    out: dict[str, Any] = {}
    for wl in chosen:
        items = make_workload(wl, args)
        rows = []
        prof = profile
        if wl == "adapters":
            prof = profile.with_(enable_lora=True, max_loras=args.max_loras,
                                 max_cpu_loras=args.max_cpu_loras or max(args.adapters, args.max_loras))
        for policy in policies:
            clock = VirtualClock()
            sched = make_scheduler(policy, config=config, seed=args.seed, clock=clock)
            result = await run_virtual_fleet(scheduler=sched, items=items, replicas=args.replicas, profile=prof,
                                             clock=clock)
            rows.append(to_row(policy, result))
            if wl == "adapters":
                print(f"  {policy}: {result.adapter_loads} on-demand loads, {result.disk_loads} disk loads, "
                      f"{result.slot_swaps} GPU slot swaps, {result.busy_s:.1f} engine-s busy")
        baseline = "least-loaded" if wl == "adapters" else "round-robin"
        print_table(f"{wl}: {len(items)} requests", rows, baseline=baseline)
        if wl == "unique" and "least-loaded" in policies:
            print_table(f"{wl}: against least-loaded", rows, baseline="least-loaded")
        out[wl] = [asdict(r) for r in rows]
        if wl == "shared-prefix" and "default" in policies:
            lat = await decision_latency(items, config=config, seed=args.seed, replicas=args.replicas)
            out["decision_latency"] = lat
            print(f"\ndecision CPU time of the default scheduler on these {len(items)} prompts, {args.replicas} "
                  f"endpoints: single shot p50 {lat['single_p50_us']:.0f}us p99 {lat['single_p99_us']:.0f}us; "
                  f"best of 3 per decision p50 {lat['best_p50_us']:.0f}us p99 {lat['best_p99_us']:.0f}us")
    return out


async def decision_latency(items: list[WorkItem], *, config: RoutingConfig | None, seed: int, replicas: int,
                           repeats: int = 3) -> dict[str, float]:
    """CPU time of the shipped scheduler's `pick` over the workload's prompts, in a tight loop.

    Each decision is timed `repeats` times on the same state (thread CPU time); the single-shot
    figures include interruptions by other processes on a shared machine, the best-of figures
    filter them out (the usual `timeit` practice) and show the decision's own cost."""
    from fleetgate.core.types import Endpoint
    from fleetgate.router.types import RoutingRequest

    sched = build_scheduler(config or RoutingConfig(), scrape=False, seed=seed)
    endpoints = [Endpoint(id=f"sim-{i}", url=f"sim://{i}", model="sim-model") for i in range(replicas)]
    single: list[float] = []
    best: list[float] = []
    for item in items:
        req = RoutingRequest(request_id=item.id, model="sim-model", prompt_text=item.prompt,
                             session_key=item.session_key)
        times = []
        for _ in range(repeats):
            c0 = time.thread_time_ns()
            decision = await sched.pick(req, endpoints)
            times.append((time.thread_time_ns() - c0) / 1e3)
        single.append(times[0])
        best.append(min(times))
        sched.on_start(req, decision.endpoint)
        sched.on_complete(req, decision.endpoint, ok=True, usage=None)
    return {"single_p50_us": quantile(single, 0.5), "single_p99_us": quantile(single, 0.99),
            "best_p50_us": quantile(best, 0.5), "best_p99_us": quantile(best, 0.99)}


def run(args: argparse.Namespace) -> int:
    if args.live:
        from fleetgate.bench.live_cli import run_live_cli

        return run_live_cli(args)
    chosen = args.policies or ",".join(ADAPTER_POLICIES if args.workload == "adapters" else DEFAULT_POLICIES)
    policies = [p.strip() for p in chosen.split(",") if p.strip()]
    unknown = [p for p in policies if p not in POLICIES]
    if unknown:
        print(f"unknown policies: {', '.join(unknown)}; choose from {', '.join(POLICIES)}")
        return 2
    config = load_model(RoutingConfig, args.config) if args.config else None
    if args.http:
        from fleetgate.sim.http_run import run_http_bench

        figures = asyncio.run(run_http_bench(args=args, policies=policies, config=config))
    else:
        figures = asyncio.run(run_virtual(args, policies, config))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(figures, fh, indent=2)
    return 0
