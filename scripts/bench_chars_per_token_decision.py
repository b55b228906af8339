"""What `charsPerToken: auto` costs the scheduler per request: pick + on_start + on_complete of the shipped default
profile, auto (learning from a reported usage at every completion) against the same profile with `charsPerToken: 4`
fixed in both scorers and no usage (the old path), interleaved in rounds in one process; thread CPU time, best of
`--repeats` per request. Prints each variant's p50/p99 and the ratios auto / fixed.

    PYTHONSAFEPATH=1 .venv/bin/python scripts/bench_chars_per_token_decision.py [--requests 600] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import time

from fleetgate.core.types import Endpoint, Usage
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import RoutingConfig
from fleetgate.router.scheduler import PluginScheduler
from fleetgate.router.types import RoutingRequest
from fleetgate.sim.workloads import shared_prefix


def fixed_config() -> RoutingConfig:
    data = RoutingConfig().model_dump(by_alias=True)
    for plugin in data["plugins"]:
        if plugin["type"] in ("prefix-affinity-scorer", "prefill-queue-scorer"):
            plugin["parameters"] = {**plugin.get("parameters", {}), "charsPerToken": 4}
    return RoutingConfig.model_validate(data)


def quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def one_round(sched: PluginScheduler, reqs: list[RoutingRequest], endpoints: list[Endpoint], *,
                    usage: bool, repeats: int) -> list[float]:
    out = []
    for req in reqs:
        best = float("inf")
        for _ in range(repeats):  # the state moves once per request: the repeats time the same pick
            c0 = time.thread_time_ns()
            decision = await sched.pick(req, endpoints)
            best = min(best, time.thread_time_ns() - c0)
        c0 = time.thread_time_ns()
        sched.on_start(req, decision.endpoint)
        sched.on_complete(req, decision.endpoint, ok=True,
                          usage=Usage(prompt_tokens=len(req.prompt_text) * 10 // 65, completion_tokens=32)
                          if usage else None)
        out.append((best + time.thread_time_ns() - c0) / 1e3)
    return out


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--replicas", type=int, default=4)
    args = ap.parse_args()
    items = shared_prefix(seed=3, groups=12, prompts_per_group=max(1, args.requests // 12), chars_per_token=6.5)
    reqs = [RoutingRequest(request_id=i.id, model="m", prompt_text=i.prompt, session_key=i.session_key)
            for i in items]
    endpoints = [Endpoint(id=f"e{i}", url=f"http://e{i}", model="m") for i in range(args.replicas)]
    variants = {"fixed-4": (fixed_config(), False), "auto": (RoutingConfig(), True)}
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(args.rounds):
        for name, (cfg, usage) in (variants.items() if r % 2 == 0 else reversed(list(variants.items()))):
            sched = build_scheduler(cfg, scrape=False, seed=r)
            for e in endpoints:
                sched.state.update(e.id, waiting=0, running=0, kv_usage=0, kv_capacity_tokens=200_000)
            times[name] += await one_round(sched, reqs, endpoints, usage=usage, repeats=args.repeats)
            if usage:
                print(f"round {r}: auto learned {sched.state.chars_per_token.learned()}")
    print(f"{len(reqs)} requests x {args.rounds} rounds, {args.replicas} endpoints, best of {args.repeats} per pick")
    for name, t in times.items():
        print(f"{name:8s} per request (pick + on_start + on_complete) p50 {quantile(t, 0.5):7.1f} us"
              f"  p99 {quantile(t, 0.99):7.1f} us")
    base, auto = times["fixed-4"], times["auto"]
    print(f"ratio auto / fixed-4: p50 {quantile(auto, 0.5) / quantile(base, 0.5):.3f}"
          f"  p99 {quantile(auto, 0.99) / quantile(base, 0.99):.3f}")


if __name__ == "__main__":
    asyncio.run(main())
