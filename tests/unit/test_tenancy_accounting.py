"""Accounting: cost, cache savings and tiering savings per request; ledger rows, metrics and reports agree."""

from __future__ import annotations

import csv
import io
from collections.abc import AsyncIterator
from datetime import UTC, date, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from fleetgate.core.errors import InvalidRequestError
from fleetgate.core.kvstore import StoreUnavailableError
from fleetgate.core.types import Usage
from fleetgate.gateway.stages import RequestRecord, Tenant
from fleetgate.gateway.tenancy.accounting import TenancyAccountant
from fleetgate.gateway.tenancy.build import build_tenancy
from fleetgate.gateway.tenancy.config import TenancyConfig
from fleetgate.gateway.tenancy.ledger import RedisLedger
from fleetgate.gateway.tenancy.redis_client import redis_client
from fleetgate.gateway.tenancy.report import day_range, usage_csv, usage_json
from fleetgate.gateway.tenancy.stage import TenancyStage

CONFIG = {
    "tenants": [{"id": "acme", "daily_budget_usd": "5"}, {"id": "globex"}],
    "prices": {
        "small": {"input_usd_per_1m": "0.10", "output_usd_per_1m": "0.40"},
        "large": {"input_usd_per_1m": "2", "output_usd_per_1m": "8", "cached_usd_per_1m": "0.5"},
        "own": {"kind": "gpu", "gpu_type": "L4", "gpu_count": 2, "usd_per_gpu_hour": "0.80",
                "fallback_tokens_per_hour": 3_200_000},
    },
    "savings_baseline_model": "large",
}


def rec(tenant: str, model: str, usage: Usage, *, cache: str = "miss", status: int = 200) -> RequestRecord:
    return RequestRecord(request_id="r", tenant=Tenant(id=tenant), model=model, tier="t1", endpoint="e1",
                         usage=usage, status=status, stream=False, cache_status=cache)


@pytest.fixture(params=["memory", "redis"])
async def tenancy(request: pytest.FixtureRequest) -> AsyncIterator[tuple[TenancyStage, CollectorRegistry]]:
    url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    registry = CollectorRegistry()
    t = build_tenancy(TenancyConfig.model_validate(CONFIG), registry=registry, redis_url=url, auth_enabled=False)
    yield t, registry
    await t.aclose()


async def test_miss_hit_and_tiering_figures(tenancy: tuple[TenancyStage, CollectorRegistry]) -> None:
    t, _ = tenancy
    u = Usage(prompt_tokens=1000, completion_tokens=500, cached_tokens=200)
    miss = t.accountant.figures(rec("acme", "small", u))
    # small: 800 * 0.1 + 200 * 0.1 + 500 * 0.4 = 300 µ$; large: 800*2 + 200*0.5 + 500*8 = 5700 µ$
    assert miss["cost_micros"] == 300 and miss["saved_tier_micros"] == 5400 and miss["prompt_tokens"] == 1000
    hit = t.accountant.figures(rec("acme", "small", u, cache="hit-semantic"))
    assert "cost_micros" not in hit and hit["saved_cache_micros"] == 300 and hit["cache_prompt_tokens"] == 1000
    on_baseline = t.accountant.figures(rec("acme", "large", u))
    assert on_baseline["cost_micros"] == 5700 and on_baseline["saved_tier_micros"] == 0


async def test_ledger_report_and_metrics_agree(tenancy: tuple[TenancyStage, CollectorRegistry]) -> None:
    t, registry = tenancy
    records = [
        rec("acme", "small", Usage(prompt_tokens=120, completion_tokens=30)),
        rec("acme", "large", Usage(prompt_tokens=1000, completion_tokens=10, cached_tokens=600)),
        rec("acme", "small", Usage(prompt_tokens=120, completion_tokens=30), cache="hit-exact"),
        rec("globex", "small", Usage(prompt_tokens=7, completion_tokens=3), status=499),
    ]
    for r in records:
        await t.accountant.record(r)
    days = day_range(start=None, end=None, today=datetime.now(UTC).date())
    rows = await t.ledger.read(days=days, tenant=None)
    report = usage_json(rows, days=days, scope="all")
    expected_cost = sum(t.accountant.figures(r).get("cost_micros", 0) for r in records)
    assert report["totals"]["cost_micros"] == expected_cost
    assert report["totals"]["requests"] == 4 and report["totals"]["errors"] == 1
    assert report["totals"]["prompt_tokens"] == 120 + 1000 + 7 and report["totals"]["cache_prompt_tokens"] == 120
    assert {g["tenant"]: g["requests"] for g in report["by_tenant"]} == {"acme": 3, "globex": 1}
    assert {g["model"]: g["requests"] for g in report["by_model"]} == {"large": 1, "small": 3}
    only_acme = await t.ledger.read(days=days, tenant="acme")
    assert {r.tenant for r in only_acme} == {"acme"}
    cost_metric = sum(
        s.value for m in registry.collect() if m.name == "fleetgate_tenant_cost_usd"
        for s in m.samples if s.name.endswith("_total")
    )
    assert cost_metric == pytest.approx(expected_cost / 1e6)
    assert registry.get_sample_value(
        "fleetgate_tenant_tokens_total",
        {"tenant": "acme", "model": "small", "tier": "t1", "kind": "prompt", "source": "cache"},
    ) == 120
    assert registry.get_sample_value("fleetgate_tenant_budget_usd", {"tenant": "acme", "period": "day"}) == 5
    assert registry.get_sample_value(
        "llm_cost_per_million_tokens", {"model_name": "large", "phase": "generation", "cost_basis": "list"}
    ) == 8
    # GPU-priced model: $1.60/hour over the assumed 3.2M tokens/hour = $0.50 per 1M tokens, OpenCost names.
    assert registry.get_sample_value("llm_total_hourly_cost", {"model_name": "own", "cost_basis": "gpu"}) == 1.6
    assert registry.get_sample_value(
        "llm_cost_per_million_tokens", {"model_name": "own", "phase": "prompt", "cost_basis": "gpu"}
    ) == 0.5
    table = list(csv.DictReader(io.StringIO(usage_csv(rows))))
    assert sum(int(r["cost_micros"]) for r in table) == expected_cost
    assert {r["tenant"] for r in table} == {"acme", "globex"}


def test_day_range_validates() -> None:
    assert day_range(start="2026-01-30", end="2026-02-02", today=date(2026, 3, 1)) == [
        "2026-01-30", "2026-01-31", "2026-02-01", "2026-02-02"]
    assert len(day_range(start=None, end=None, today=date(2026, 3, 1))) == 30
    with pytest.raises(InvalidRequestError):
        day_range(start="2026-02-02", end="2026-01-01", today=date(2026, 3, 1))
    with pytest.raises(InvalidRequestError):
        day_range(start="yesterday", end=None, today=date(2026, 3, 1))
    with pytest.raises(InvalidRequestError):
        day_range(start="2020-01-01", end="2026-01-01", today=date(2026, 3, 1))


class FlakyLedger:
    """A real ledger behind a switch: `down` fails every call; `lost_replies` applies, then fails."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.down = False
        self.lost_replies = 0

    async def add(self, **kw: Any) -> None:
        if self.down:
            raise StoreUnavailableError("down")
        await self.inner.add(**kw)
        if self.lost_replies:
            self.lost_replies -= 1
            raise StoreUnavailableError("timeout after the write")

    async def read(self, **kw: Any) -> Any:
        return await self.inner.read(**kw)


async def test_ledger_outage_is_retried_exactly_once(tenancy: tuple[TenancyStage, CollectorRegistry]) -> None:
    t, _ = tenancy
    flaky = FlakyLedger(t.ledger)
    accountant = TenancyAccountant(ledger=flaky, prices=t.prices)
    usage = Usage(prompt_tokens=100, completion_tokens=10)
    flaky.down = True
    for _ in range(3):
        await accountant.record(rec("acme", "small", usage))  # store down: kept in memory
    assert accountant.pending == 3
    flaky.down = False
    flaky.lost_replies = 1  # the next write lands but its reply is lost: it stays pending and is retried
    await accountant.record(rec("acme", "small", usage))
    assert accountant.pending >= 1
    await accountant.record(rec("acme", "small", usage))
    assert accountant.pending == 0
    days = [datetime.now(UTC).date().isoformat()]
    totals = usage_json(await t.ledger.read(days=days, tenant="acme"), days=days, scope="acme")["totals"]
    assert totals["requests"] == 5 and totals["prompt_tokens"] == 500


async def test_redis_ledger_applies_a_one_time_addition_once(redis_url: str) -> None:
    client = redis_client(redis_url)
    ledger = RedisLedger(client, prefix="t:", retention_days=1)
    for once in ("a", "a", "b", "", ""):
        await ledger.add(day="2026-01-01", tenant="x", model="m", tier="", values={"requests": 1}, once=once)
    (row,) = await ledger.read(days=["2026-01-01"], tenant="x")
    assert row.values["requests"] == 4  # "a" once, "b" once, and both additions without a token
    await client.aclose()
