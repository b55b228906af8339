"""`fleetgate bench gateway`'s Envoy configurations, run small against the real Envoy.

- The latency phase: Envoy alone and Envoy + EPP (both answer modes) answer the benchmark tenant's requests, the
  blocks alternate direct and every front, and the picker's decision histogram counts exactly the blocks' requests.
- `--prefix-gain`: both doors (FleetGate's gateway, a real Envoy asking `fleetgate epp`) serve every request, and
  prefix routing beats the prefix-blind baseline through each of them.

The workload is sized so that the KV cache decides: 4 prompt groups sharing 512-token prefixes on 2 simulated
engines of 96 x 16-token blocks each hold two groups' prefixes per engine but not four, so a prefix-blind policy
evicts what the next request of a group would reuse, and a prefix-aware one keeps each group on one engine.
"""

from __future__ import annotations

import argparse

import aiohttp
import pytest

from fleetgate.bench import envoy_phase as ep
from fleetgate.bench.gateway_overhead import PROMPT, chat_body
from fleetgate.bench.gateway_stack import Pinning, stack
from fleetgate.bench.loadgen import HEADERS, PATH
from fleetgate.bench.prefix_doors import DOORS, POLICIES, add_arguments, gains, measure
from fleetgate.gateway.tenancy.keys import new_key

pytestmark = pytest.mark.slow


async def test_the_envoy_fronts_answer_the_tenant_and_the_picker_counts_its_decisions() -> None:
    key, key_hash = new_key()
    headers = {**HEADERS, "Authorization": f"Bearer {key}"}
    body = chat_body(PROMPT, temperature=0.8)
    with stack(Pinning.choose(None)) as s:
        engine = s.engine()
        pickers = [ep.start_picker(s, engine_url=engine.url, key_hash=key_hash, log_requests=False, assemble=a)
                   for a in (True, False)]
        fronts = ep.start_fronts(s, engine=engine, pickers=pickers)
        try:
            assert [f.name for f in fronts] == ["envoy alone", *ep.PICKED]
            async with aiohttp.ClientSession() as session:
                for front in fronts:
                    await ep.wait_answering(session, front.url, body, headers)
                for front in fronts[1:]:  # the picker refuses a client without the tenant's key; Envoy alone cannot
                    async with session.post(front.url + PATH, data=body, headers=HEADERS) as r:
                        assert r.status == 401, await r.text()
                figures = await ep.latency_blocks(session, direct=engine.url, fronts=fronts, template=body,
                                                  requests=6, headers=headers)
            assert len(figures.direct) == 6
            assert {name: len(v) for name, v in figures.fronts.items()} == {f.name: 6 for f in fronts}
            # the first picker decided each of its block's requests once, and nothing else in between
            assert max(figures.decision_buckets.values()) == 6
            assert 0 < ep.bucket_quantile({}, figures.decision_buckets, 0.99) <= 1.0
            envoy_cpu, picker_cpu = fronts[1].cpu_s()
            assert envoy_cpu > 0 and picker_cpu > 0 and fronts[0].cpu_s()[1] == 0.0
        finally:
            ep.stop_fronts(fronts)
            for picker in pickers:
                s.stop(picker)


def test_bucket_quantile_reads_the_bucket_the_quantile_falls_in() -> None:
    before = {0.001: 10.0, 0.002: 10.0, float("inf"): 10.0}
    after = {0.001: 50.0, 0.002: 59.0, float("inf"): 60.0}  # 40 under 1 ms, 9 more under 2 ms, 1 above
    assert ep.bucket_quantile(before, after, 0.5) == 0.001
    assert ep.bucket_quantile(before, after, 0.95) == 0.002
    assert ep.bucket_quantile(before, after, 0.99) == float("inf")
    assert ep.bucket_quantile(after, after, 0.99) != ep.bucket_quantile(after, after, 0.99)  # nothing observed: nan


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args([
        "--gain-replicas", "2", "--gain-kv-blocks", "80", "--gain-groups", "4", "--gain-requests", "40",
        "--gain-prefix-tokens", "512", "--gain-rate", "10", "--gain-time-scale", "0.05", "--gain-seeds", "1",
    ])


async def test_prefix_routing_gains_through_envoy_and_through_the_gateway() -> None:
    args = _args()
    runs = await measure(args)
    assert sorted((r.door, r.policy) for r in runs) == sorted((d, p) for d in DOORS for p in POLICIES)
    for r in runs:  # every request answered and streamed, through both doors, under both policies
        assert (r.done, r.errors) == (40, 0), (r.door, r.policy, r.done, r.errors)
        assert len(r.ttfts) == 40 and r.queries > 0
    by = {(r.door, r.policy): r for r in runs}
    for door in DOORS:
        shipped, blind = by[(door, "default")], by[(door, "least-loaded")]
        # prefix affinity through this door: most prompts after each group's first hit the cache
        assert shipped.hit_rate > blind.hit_rate + 0.15, (door, shipped.hit_rate, blind.hit_rate)
        assert shipped.hit_rate > 0.55, (door, shipped.hit_rate)
    # the picker behind Envoy keeps the groups together as well as the gateway does
    gateway, envoy = by[("gateway", "default")], by[("envoy+epp", "default")]
    assert abs(envoy.hit_rate - gateway.hit_rate) < 0.15, (envoy.hit_rate, gateway.hit_rate)
    assert all(g["hit"] > 1.2 for g in gains(runs).values()), gains(runs)
