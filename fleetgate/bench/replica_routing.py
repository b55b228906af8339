"""Gateway replicas on a virtual clock (issue 24): one seeded shared-prefix workload routed by one scheduler, and
by N schedulers that take its requests in turn and share their state as replicas sharing Redis do.

Each arm runs `fleetgate.sim.virtual_fleet` on the same simulated engines and requests: the replicas' schedulers
share one in-memory store that presents itself as a networked one (`LoopbackStore`), so every `shared: auto`
sync is on as it is with Redis, and each replica's syncs run every `--sync-interval` of engine time
(`PluginScheduler.sync_now`; the plugins' every `--plugin-sync-every` of those ticks), staggered, so shared state
arrives as late as it does between processes; each replica
has its own scraper (every 0.5 s, staggered). Engine time is virtual: results do not depend on this machine's load.

Arms: `1` (one replica), `N` (N replicas, the config as given), `N-noload` (N replicas with `loadSync.shared: false`,
the in-flight counts not shared: how replicas routed before `fleetgate.router.load_sync`), `N-alone` (N replicas
sharing nothing: each its own store). Figures per arm and seed: TTFT p50/p90 (engine seconds), the engines' prefix
hit rate, the group placement figures of `fleetgate.sim.report.group_split`, requests per engine.

    python -m fleetgate.bench.replica_routing --seeds 1,2,3 --rate 16 --arms 1,2,2-noload
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections.abc import Sequence
from typing import Any

from fleetgate.core.config import load_model
from fleetgate.core.kvstore import KVStore, MemoryKVStore
from fleetgate.router.build import build_scheduler
from fleetgate.router.config import LoadSyncConfig, RoutingConfig, preset
from fleetgate.router.scheduler import PluginScheduler
from fleetgate.sim.profile import get_profile
from fleetgate.sim.report import group_split, quantile
from fleetgate.sim.virtual_fleet import VirtualClock, run_virtual_fleet
from fleetgate.sim.workloads import shared_prefix


class LoopbackStore:
    """The replicas' shared store in one process: a `MemoryKVStore` behind a class that is not one, so the
    plugins' `shared: auto` treats it as the networked store it stands for."""

    def __init__(self) -> None:
        self._m = MemoryKVStore()

    async def get(self, key: str) -> bytes | None:
        return await self._m.get(key)

    async def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        return await self._m.mget(keys)

    async def set(self, key: str, value: bytes, *, ttl_s: float | None = None) -> None:
        await self._m.set(key, value, ttl_s=ttl_s)

    async def delete(self, key: str) -> None:
        await self._m.delete(key)

    async def incr(self, key: str, amount: int = 1, *, ttl_s: float | None = None) -> int:
        return await self._m.incr(key, amount, ttl_s=ttl_s)

    async def keys(self, pattern: str) -> list[str]:
        return await self._m.keys(pattern)

    async def log_append(self, log: str, value: bytes, *, max_len: int | None = None) -> str:
        return await self._m.log_append(log, value, max_len=max_len)

    async def log_read(self, log: str, *, after: str = "0", count: int = 1000) -> list[tuple[str, bytes]]:
        return await self._m.log_read(log, after=after, count=count)

    async def ping(self) -> bool:
        return True

    async def close(self) -> None:
        return None


def arm_config(arm: str, config: RoutingConfig) -> tuple[int, RoutingConfig, bool]:
    """(replicas, config, whether the replicas share one store) of an arm name: `1`, `N`, `N-noload`, `N-alone`."""
    count, _, variant = arm.partition("-")
    try:
        replicas = int(count)
    except ValueError:
        raise ValueError(f"arm {arm!r}: want N, N-noload or N-alone") from None
    if replicas < 1 or variant not in ("", "noload", "alone"):
        raise ValueError(f"arm {arm!r}: want N, N-noload or N-alone with N >= 1")
    if variant == "noload":
        config = config.model_copy(update={"load_sync": LoadSyncConfig(shared=False)})
    return replicas, config, variant != "alone"


async def run_arm(arm: str, *, config: RoutingConfig, seed: int, rate: float, engines: int, kv_blocks: int,
                  groups: int, prompts_per_group: int, prefix_tokens: int, sync_interval_s: float,
                  scrape_interval_s: float = 0.5, plugin_sync_every: int = 1) -> dict[str, Any]:
    replicas, cfg, shared = arm_config(arm, config)
    profile = get_profile("gpu-8b").with_(num_blocks=kv_blocks)
    items = shared_prefix(seed=seed, groups=groups, prompts_per_group=prompts_per_group,
                          prefix_tokens=prefix_tokens, question_tokens=96, max_tokens=64, rate_rps=rate)
    clock = VirtualClock()
    common = LoopbackStore()
    schedulers: list[PluginScheduler] = []
    for k in range(replicas):
        store: KVStore | None = (common if shared else LoopbackStore()) if replicas > 1 else None
        schedulers.append(build_scheduler(cfg, kvstore=store, scrape=False, seed=seed * 100 + k, clock=clock))

    ticks = [0] * replicas

    async def sync(k: int) -> bool:
        """Replica k's in-flight counts every tick, its plugins' shared state every `plugin_sync_every` ticks."""
        sched = schedulers[k]
        ticks[k] += 1
        if ticks[k] % plugin_sync_every:
            return await sched.load_sync.sync_now() if sched.load_sync is not None else True
        return await sched.sync_now()

    try:
        result = await run_virtual_fleet(scheduler=schedulers, items=items, replicas=engines, profile=profile,
                                         clock=clock, sync=sync if replicas > 1 else None,
                                         sync_interval_s=sync_interval_s, scrape_interval_s=scrape_interval_s)
    finally:
        for s in schedulers:
            await s.aclose()
    return {"arm": arm, "seed": seed, "rate": rate, "requests": len(items),
            "ttft_p50_s": quantile(result.ttft_s, 0.5), "ttft_p90_s": quantile(result.ttft_s, 0.9),
            "hit_rate": result.hit_rate, "per_endpoint": dict(sorted(result.per_endpoint.items())),
            **group_split(result.placements)}


def render(rows: list[dict[str, Any]], base_arm: str) -> str:
    lines = ["| seed | rate | arm | TTFT p50 s | TTFT p90 s | p90 x base | hit rate | group switches | "
             "off-majority | groups split | requests per engine |",
             "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    base = {(r["seed"], r["rate"]): r for r in rows if r["arm"] == base_arm}
    for r in rows:
        b = base.get((r["seed"], r["rate"]))
        ratio = f"{r['ttft_p90_s'] / b['ttft_p90_s']:.2f}" if b else "-"
        spread = ", ".join(str(n) for n in r["per_endpoint"].values())
        lines.append(f"| {r['seed']} | {r['rate']:g} | {r['arm']} | {r['ttft_p50_s']:.3f} | {r['ttft_p90_s']:.3f} | "
                     f"{ratio} | {r['hit_rate']:.1%} | {r['group_switch_share']:.1%} | "
                     f"{r['group_off_majority_share']:.1%} | {r['groups_split']} | {spread} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleetgate.bench.replica_routing",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--arms", default="1,2,2-noload", help="comma-separated: 1, N, N-noload, N-alone")
    parser.add_argument("--policy", default="default", help="a routing preset (default, precise-prefix needs KV "
                        "events the simulator here does not publish: use default)")
    parser.add_argument("--config", default=None, help="a routing YAML instead of --policy")
    parser.add_argument("--seeds", default="1,2,3")
    parser.add_argument("--rate", default="16", help="arrivals per second (comma-separated for several)")
    parser.add_argument("--engines", type=int, default=2)
    parser.add_argument("--kv-blocks", type=int, default=4096, help="each engine's KV blocks of 16 tokens")
    parser.add_argument("--groups", type=int, default=48)
    parser.add_argument("--prompts-per-group", type=int, default=12)
    parser.add_argument("--prefix-tokens", type=int, default=2048)
    parser.add_argument("--sync-interval", type=float, default=0.05, help="each replica's syncs (engine s)")
    parser.add_argument("--plugin-sync-every", type=int, default=1, help="the plugins' syncs (prefix index, queued "
                        "prefill) every this many --sync-interval ticks; the in-flight counts every tick")
    parser.add_argument("--scrape-interval", type=float, default=0.5, help="each replica's scrapes (engine s)")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    args = parser.parse_args(argv)
    config = load_model(RoutingConfig, args.config) if args.config else preset(args.policy)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    rows = []
    for rate in [float(x) for x in args.rate.split(",") if x.strip()]:
        for seed in [int(x) for x in args.seeds.split(",") if x.strip()]:
            for arm in arms:
                row = asyncio.run(run_arm(arm, config=config, seed=seed, rate=rate, engines=args.engines,
                                          kv_blocks=args.kv_blocks, groups=args.groups,
                                          prompts_per_group=args.prompts_per_group, prefix_tokens=args.prefix_tokens,
                                          sync_interval_s=args.sync_interval,
                                          scrape_interval_s=args.scrape_interval,
                                          plugin_sync_every=args.plugin_sync_every))
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(render(rows, arms[0]))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(rows, fh, indent=2)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
