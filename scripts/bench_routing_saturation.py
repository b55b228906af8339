"""Routing profiles past saturation on the simulator at issue 24's GPU scale (docs/reports/routing-saturation.md).

Each point is one workload at one offered load and seed, routed by one profile over two simulated engines in
virtual time (`fleetgate.sim.virtual_fleet`): the `vllm-v1` engine model (KV blocks, prefix-cache lookups counted as
vLLM 0.26 counts them, recompute preemption) with the H200 constants fitted in docs/reports/sim-calibration-gpu.md
(read from its data file), 65,536 KV tokens per engine, max_num_seqs 128, 8,192 batched tokens, and the GPU runs'
workload sizes; a load is a multiple of `--base-rate` (61.55 requests/s: the rate runs 9a-9b used for two H200s).
Every profile of a (workload, load, seed) gets the same requests. Figures: TTFT p50/p90 over every request,
output tokens/s over the 10 s window, the engines' prefix-cache hit rate, and `moves`: the share of a prompt
group's consecutive requests sent to a different engine than the one before (0 for a partition that holds).
Ratios are against baselines from the same run, per seed, then the geometric mean over seeds (and the worst seed).

Workloads: `shared-prefix` (48 groups of 2,048-token prompts, uniform popularity), `unique` (256-2,048 tokens),
`hot:S` (shared-prefix, with each request moved to group 0 with probability S: one hot system prompt).

    PYTHONSAFEPATH=1 .venv/bin/python scripts/bench_routing_saturation.py \
        --profiles default,round-robin,default-sticky=scripts/gpu/profiles/default-sticky.yaml \
        --workloads shared-prefix --loads 1.0,1.2,1.35,1.5 --seeds 101,102 --baselines default,round-robin

A profile is a preset name (`fleetgate.router.config.preset`), `round-robin`, or NAME=PATH of a routing YAML. The
simulator cannot run `precise-prefix-scorer` (its engines publish no KV events). ~0.5 s of CPU per point.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIT = ROOT / "docs" / "reports" / "data" / "sim-calibration-gpu-fit.json"
SIZES: dict[str, Any] = {
    "prefix_tokens": 2048, "question_tokens": 96, "output_tokens": 64, "hot_factor": None, "tenants": 8,
    "chat_system_tokens": 1024, "chat_turn_tokens": 96, "chat_rounds": 6, "chat_think_s": 1.0,
    "unique_min_tokens": 256, "unique_max_tokens": 2048}
REPLICAS, KV_TOKENS, WINDOW_S = 2, 65_536, 10.0


def h200_constants() -> dict[str, float]:
    data = json.loads(FIT.read_text())
    return {k: float(v) for k, v in data["cards"]["h200"]["models"]["vllm-v1"]["fitted"].items()}


def load_config(spec: str) -> tuple[str, Any]:
    """(name, RoutingConfig or None for round-robin)."""
    import yaml

    from fleetgate.router.config import RoutingConfig, preset

    name, _, path = spec.partition("=")
    if path:
        return name, RoutingConfig.model_validate(yaml.safe_load(Path(path).read_text()))
    return name, None if name == "round-robin" else preset(name)


def items_for(workload: str, *, seed: int, rate: float) -> list[Any]:
    from fleetgate.sim.workloads import Sizes, sized_items

    base = "shared-prefix" if workload.startswith("hot:") else workload
    items = sized_items(base, seed=seed, rate=rate, window_s=WINDOW_S, sizes=Sizes(**SIZES), chars_per_token=4,
                        capacity_tokens=KV_TOKENS, replicas=REPLICAS)
    if workload.startswith("hot:"):
        share = float(workload[4:])
        rng = random.Random(seed * 7 + 1)
        head = next(it.prompt.split("\nQuestion ")[0] for it in items if it.group == "g0")
        items = [dataclasses.replace(it, group="g0", prompt=head + "\nQuestion " + it.prompt.split("\nQuestion ", 1)[1])
                 if rng.random() < share else it for it in items]
    return items


async def point(name: str, config: Any, *, workload: str, load: float, seed: int, base_rate: float,
                constants: dict[str, float]) -> dict[str, Any]:
    from fleetgate.router.build import build_scheduler
    from fleetgate.router.roundrobin import RoundRobinScheduler
    from fleetgate.router.types import Scheduler
    from fleetgate.sim.fit import Setup
    from fleetgate.sim.fit_split import start_profile
    from fleetgate.sim.report import quantile
    from fleetgate.sim.virtual_fleet import VirtualClock, run_virtual_fleet

    setup = Setup(replicas=REPLICAS, capacity_tokens=KV_TOKENS, max_num_seqs=128, max_batched_tokens=8192,
                  sizes=SIZES)
    profile = start_profile([], setup, card="h200", scheduler="vllm-v1").with_(**constants)
    items = items_for(workload, seed=seed, rate=base_rate * load)
    clock = VirtualClock()
    sched: Scheduler = (RoundRobinScheduler() if config is None
                        else build_scheduler(config, scrape=False, seed=seed, clock=clock))
    r = await run_virtual_fleet(scheduler=sched, items=items, replicas=REPLICAS, profile=profile, clock=clock,
                                window_s=WINDOW_S, send_until_s=WINDOW_S)
    last: dict[str, str] = {}
    moved = follow = 0
    for group, endpoint in r.placements:
        if group in last:
            follow += 1
            moved += last[group] != endpoint
        last[group] = endpoint
    return {"profile": name, "workload": workload, "load": load, "seed": seed, "requests": len(items),
            "ttft_p50_s": quantile(r.ttft_s, 0.5), "ttft_p90_s": quantile(r.ttft_s, 0.9),
            "output_tps": r.window_output_tokens / WINDOW_S, "hit_rate": r.hit_rate,
            "moves": moved / follow if follow else 0.0, "preemptions": r.preemptions,
            "per_engine": sorted(r.per_endpoint.values())}


def _gmean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs and all(x > 0 for x in xs) else math.nan


def table(rows: list[dict[str, Any]], baselines: list[str]) -> str:
    """Markdown: per (workload, load, profile) the mean hit rate and moves, median TTFT and mean tok/s over seeds;
    per baseline, the geometric mean over seeds of the profile's TTFT p90 and tok/s over the baseline's (same
    seed), with the worst seed in brackets (highest p90 ratio, lowest tok/s ratio)."""
    idx = {(r["profile"], r["workload"], r["load"], r["seed"]): r for r in rows}
    keys = sorted({(r["workload"], r["load"]) for r in rows})
    profiles = list(dict.fromkeys(r["profile"] for r in rows))
    head = "| workload | load | profile | seeds | hit rate | moves | TTFT p50 s | TTFT p90 s | output tok/s |"
    sep = "|---|---:|---|---:|---:|---:|---:|---:|---:|"
    for b in baselines:
        head += f" p90 / {b} | tok/s / {b} |"
        sep += "---:|---:|"
    out = [head, sep]
    for workload, load in keys:
        for p in profiles:
            rs = [r for r in rows if r["profile"] == p and r["workload"] == workload and r["load"] == load]
            if not rs:
                continue
            line = (f"| {workload} | {load:g} | {p} | {len(rs)} | {statistics.mean(r['hit_rate'] for r in rs):.3f} "
                    f"| {statistics.mean(r['moves'] for r in rs):.3f} "
                    f"| {statistics.median(r['ttft_p50_s'] for r in rs):.3f} "
                    f"| {statistics.median(r['ttft_p90_s'] for r in rs):.3f} "
                    f"| {statistics.mean(r['output_tps'] for r in rs):.0f} |")
            for b in baselines:
                pairs = [(r, idx.get((b, workload, load, r["seed"]))) for r in rs]
                p90 = [r["ttft_p90_s"] / q["ttft_p90_s"] for r, q in pairs if q]
                tps = [r["output_tps"] / q["output_tps"] for r, q in pairs if q]
                line += (f" {_gmean(p90):.2f} ({max(p90):.2f}) | {_gmean(tps):.2f} ({min(tps):.2f}) |"
                         if p90 else " - | - |")
            out.append(line)
    return "\n".join(out)


async def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profiles", required=True, help="comma-separated: preset, round-robin or NAME=PATH")
    ap.add_argument("--workloads", default="shared-prefix", help="shared-prefix, unique, hot:S (comma-separated)")
    ap.add_argument("--loads", default="1.0,1.2,1.35,1.5")
    ap.add_argument("--seeds", required=True)
    ap.add_argument("--baselines", default="default,round-robin", help="profiles the ratios are against")
    ap.add_argument("--base-rate", type=float, default=61.55, help="requests/s at load 1.0 (two H200s, runs 9a-9b)")
    ap.add_argument("--jsonl", type=Path, help="also write every point here")
    args = ap.parse_args(argv)
    configs = [load_config(s) for s in args.profiles.split(",") if s]
    constants = h200_constants()
    rows: list[dict[str, Any]] = []
    for workload in args.workloads.split(","):
        for load in (float(x) for x in args.loads.split(",")):
            for seed in (int(x) for x in args.seeds.split(",")):
                for name, config in configs:
                    row = await point(name, config, workload=workload, load=load, seed=seed,
                                      base_rate=args.base_rate, constants=constants)
                    rows.append(row)
                    print(json.dumps(row), file=sys.stderr, flush=True)
    if args.jsonl:
        args.jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    names = {n for n, _ in configs}
    print(table(rows, [b for b in args.baselines.split(",") if b in names]))
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
