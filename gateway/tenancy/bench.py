"""`fleetgate bench tenancy`: exactness and overhead of the tenancy stage, in process, on a real Redis.

Three measurements, each printed with its raw numbers:
1. Exact totals: R gateway replicas (R `TenancyStage`s, each with its own Redis client, as R pods would
   have) run N concurrent simulated requests that follow the pipeline's order (reserve -> engine time ->
   settle -> record): plain, cancelled (only part of the completion produced) and cache hits. The
   ledger's tokens and micro-dollars must equal the sums of the simulated engine usage, and each
   tenant's budget counter must equal its ledger spend (no reservation leaked).
2. Budget race: N concurrent requests of one tenant against a small daily budget, a share of them using
   more completion tokens than reserved. Reported: spend / budget and the overshoot against its bound
   (the overruns of the requests in flight when the budget was reached).
3. Overhead: sequential reserve + settle + record cycles per backend (memory, Redis) against the
   no-op stages (`NoLimits` + `NoAccounting`) measured in the same run; p50/p99 in microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from collections import defaultdict
from contextlib import ExitStack
from datetime import UTC, datetime
from typing import Any

from prometheus_client import CollectorRegistry

from fleetgate.core.localredis import LocalRedis
from fleetgate.core.types import Usage
from fleetgate.gateway.stages import NoAccounting, NoLimits, RequestRecord, Tenant
from fleetgate.gateway.tenancy.build import build_tenancy
from fleetgate.gateway.tenancy.config import TenancyConfig
from fleetgate.gateway.tenancy.pricing import cost_micros, micros_to_usd
from fleetgate.gateway.tenancy.stage import TenancyStage

PRICES = {"small": {"input_usd_per_1m": "0.15", "output_usd_per_1m": "0.60", "cached_usd_per_1m": "0.075"},
          "large": {"input_usd_per_1m": "2.5", "output_usd_per_1m": "10"}}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=1000, help="concurrent requests per phase")
    parser.add_argument("--replicas", type=int, default=3, help="gateway replicas sharing Redis")
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--cycles", type=int, default=2000, help="sequential cycles for the overhead phase")
    parser.add_argument("--redis-url", help="use this Redis (default: start a throwaway redis-server)")
    parser.add_argument("--seed", type=int, default=7)


def _config(tenants: list[dict[str, Any]]) -> TenancyConfig:
    return TenancyConfig.model_validate({"tenants": tenants, "prices": PRICES, "savings_baseline_model": "large"})


def _stages(config: TenancyConfig, *, replicas: int, redis_url: str | None) -> list[TenancyStage]:
    return [build_tenancy(config, registry=CollectorRegistry(), auth_enabled=False, redis_url=redis_url)
            for _ in range(replicas)]


async def _request(stage: TenancyStage, tenant: Tenant, model: str, usage: Usage, *, max_tokens: int,
                   cache: str, rng: random.Random) -> bool:
    from fleetgate.core.errors import RateLimitError

    try:
        reservation = await stage.reserve(tenant, model, prompt_tokens=usage.prompt_tokens, max_tokens=max_tokens)
    except RateLimitError:
        return False
    await asyncio.sleep(rng.random() * 0.02)  # engine time: other requests interleave here
    record = RequestRecord(request_id="b", tenant=tenant, model=model, tier=None, endpoint=None, usage=usage,
                           status=200, stream=True, cache_status=cache)

    async def settle_and_record() -> None:  # the pipeline's order, in one task
        await stage.settle(reservation, Usage() if cache.startswith("hit") else usage)
        await stage.record(record)

    await asyncio.ensure_future(settle_and_record())
    return True


async def exactness(args: argparse.Namespace, redis_url: str) -> None:
    rng = random.Random(args.seed)
    tenants = [{"id": f"t{i}", "daily_budget_usd": "1000", "tpm": 10**9} for i in range(args.tenants)]
    stages = _stages(_config(tenants), replicas=args.replicas, redis_url=redis_url)
    expected: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    jobs = []
    for i in range(args.requests):
        tenant, model = Tenant(id=f"t{rng.randrange(args.tenants)}"), rng.choice(["small", "large"])
        prompt, max_tokens = rng.randint(10, 4000), rng.randint(16, 1024)
        kind = rng.choices(["plain", "cancelled", "hit-exact"], weights=[7, 2, 1])[0]
        completion = max_tokens if kind != "cancelled" else rng.randint(0, max_tokens - 1)
        usage = Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=rng.randint(0, prompt))
        if kind != "hit-exact":
            e = expected[tenant.id]
            e[0] += usage.prompt_tokens
            e[1] += usage.completion_tokens
            e[2] += cost_micros(usage, stages[0].prices.rates(model))
        expected[tenant.id][3] += 1
        jobs.append(_request(stages[i % args.replicas], tenant, model, usage, max_tokens=max_tokens,
                             cache="miss" if kind != "hit-exact" else kind, rng=rng))
    t0 = time.perf_counter()
    await asyncio.gather(*jobs)
    elapsed = time.perf_counter() - t0
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    rows = await stages[1].ledger.read(days=[day], tenant=None)
    got: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])
    for r in rows:
        g = got[r.tenant]
        g[0] += r.values["prompt_tokens"]
        g[1] += r.values["completion_tokens"]
        g[2] += r.values["cost_micros"]
        g[3] += r.values["requests"]
    leaks = 0
    for tid in expected:
        used = (await stages[2].limiter.status(tid))["daily_budget"]["used"]
        leaks += int(used != got[tid][2])
    total = [sum(v[k] for v in expected.values()) for k in range(4)]
    ledger = [sum(v[k] for v in got.values()) for k in range(4)]
    print(f"[exact] {args.requests} concurrent requests over {args.replicas} replicas sharing Redis, "
          f"{elapsed:.2f} s ({args.requests / elapsed:.0f} req/s incl. simulated engine time)")
    print(f"[exact] engine usage: prompt={total[0]} completion={total[1]} cost=${micros_to_usd(total[2])} "
          f"requests={total[3]}")
    print(f"[exact] ledger      : prompt={ledger[0]} completion={ledger[1]} cost=${micros_to_usd(ledger[2])} "
          f"requests={ledger[3]}")
    print(f"[exact] per-tenant match: {sum(expected[t] == got[t] for t in expected)}/{len(expected)}; "
          f"budget counters equal to ledger spend: {len(expected) - leaks}/{len(expected)}")
    for s in stages:
        await s.aclose()


async def budget_race(args: argparse.Namespace, redis_url: str) -> None:
    rng = random.Random(args.seed + 1)
    budget_usd = "0.50"
    stages = _stages(_config([{"id": "acme", "daily_budget_usd": budget_usd}]), replicas=args.replicas,
                     redis_url=redis_url)
    tenant = Tenant(id="acme")
    overruns: list[int] = []
    jobs = []
    rates = stages[0].prices.rates("large")
    for i in range(args.requests):
        max_tokens = 200
        # One request in four generates 50% more than it reserved (a client that under-declares max_tokens).
        completion = 300 if rng.random() < 0.25 else rng.randint(50, 200)
        usage = Usage(prompt_tokens=500, completion_tokens=completion)
        estimate = cost_micros(Usage(prompt_tokens=500, completion_tokens=max_tokens), rates)
        overruns.append(max(0, cost_micros(usage, rates) - estimate))
        jobs.append(_request(stages[i % args.replicas], tenant, "large", usage, max_tokens=max_tokens,
                             cache="miss", rng=rng))
    admitted = await asyncio.gather(*jobs)
    day = datetime.now(UTC).strftime("%Y-%m-%d")
    spent = sum(r.values["cost_micros"] for r in await stages[0].ledger.read(days=[day], tenant="acme"))
    budget = 500_000
    bound = budget + sum(o for o, ok in zip(overruns, admitted, strict=True) if ok)
    print(f"[budget] {args.requests} concurrent requests, budget ${budget_usd}: admitted {sum(admitted)}, "
          f"refused {len(admitted) - sum(admitted)}; spent ${micros_to_usd(spent)} = {spent / budget:.3f} x budget; "
          f"overshoot ${micros_to_usd(max(0, spent - budget))}; bound (budget + overruns of admitted requests) "
          f"${micros_to_usd(bound)}")
    for s in stages:
        await s.aclose()


async def _cycle_times(limiter: Any, accountant: Any, cycles: int) -> list[float]:
    tenant = Tenant(id="acme")
    usage = Usage(prompt_tokens=300, completion_tokens=100)
    record = RequestRecord(request_id="b", tenant=tenant, model="small", tier=None, endpoint=None, usage=usage,
                           status=200, stream=False, cache_status="miss")
    out = []
    for _ in range(cycles):
        t0 = time.perf_counter()
        reservation = await limiter.reserve(tenant, "small", prompt_tokens=300, max_tokens=100)
        await limiter.settle(reservation, usage)
        await accountant.record(record)
        out.append(time.perf_counter() - t0)
    return out


async def overhead(args: argparse.Namespace, redis_url: str) -> None:
    config = _config([{"id": "acme", "rpm": 10**9, "tpm": 10**12, "daily_budget_usd": "1000000",
                       "monthly_budget_usd": "1000000"}])
    baseline = await _cycle_times(NoLimits(), NoAccounting(), args.cycles)
    b50 = statistics.median(baseline)
    for name, url in (("memory", None), ("redis", redis_url)):
        (stage,) = _stages(config, replicas=1, redis_url=url)
        times = await _cycle_times(stage, stage, args.cycles)
        await stage.aclose()
        p50, p99 = statistics.median(times), statistics.quantiles(times, n=100)[98]
        print(f"[overhead] {name:6s}: reserve+settle+record p50 {p50 * 1e6:.0f} us, p99 {p99 * 1e6:.0f} us "
              f"(no-op stages p50 {b50 * 1e6:.1f} us; ratio {p50 / b50:.0f}x), {args.cycles} cycles, "
              "4 limits (rpm, tpm, day, month)")


def run(args: argparse.Namespace) -> int:
    with ExitStack() as stack:
        url = args.redis_url or stack.enter_context(LocalRedis()).url

        async def main() -> None:
            await exactness(args, url)
            await budget_race(args, url)
            await overhead(args, url)

        asyncio.run(main())
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="fleetgate bench tenancy", description=__doc__)
    add_arguments(parser)
    raise SystemExit(run(parser.parse_args()))
