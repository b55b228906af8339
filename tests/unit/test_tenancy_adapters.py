"""LoRA adapters in the bill: priced as their base, a GPU-priced base's cost split across its adapters by
tokens, usage rows and reports that carry the adapter and its base, bounded Prometheus series."""

from __future__ import annotations

import csv
import io
import random
from decimal import Decimal
from fractions import Fraction

from prometheus_client import CollectorRegistry

from fleetgate.core.kvstore import MemoryKVStore
from fleetgate.core.types import Usage
from fleetgate.gateway.stages import RequestRecord, Tenant
from fleetgate.gateway.tenancy.build import build_tenancy
from fleetgate.gateway.tenancy.config import GpuPrice, TenancyConfig
from fleetgate.gateway.tenancy.meter import TokenMeter
from fleetgate.gateway.tenancy.pricing import MICROS_PER_USD, PriceBook, cost_micros, gpu_hourly_usd, weighted
from fleetgate.gateway.tenancy.report import usage_csv, usage_json

GPU = GpuPrice(
    kind="gpu",
    gpu_type="L4",
    gpu_count=2,
    usd_per_gpu_hour=Decimal("1.80"),
    min_tokens=1,
    fallback_tokens_per_hour=1_000_000,
    output_weight=Decimal(3),
    cached_weight=Decimal("0.25"),
    refresh_s=3600,
)
ADAPTERS = {"legal": "base", "chef": "base"}
NOW = 1_800_000_000.0 + 45


def _usage(rng: random.Random) -> Usage:
    prompt = rng.randrange(1, 3000)
    return Usage(
        prompt_tokens=prompt, cached_tokens=rng.randrange(0, prompt + 1), completion_tokens=rng.randrange(0, 800)
    )


async def test_adapters_split_their_gpu_priced_base_deployment_cost_by_tokens() -> None:
    config = TenancyConfig.model_validate(
        {"prices": {"base": GPU.model_dump(), "other": {"input_usd_per_1m": "1", "output_usd_per_1m": "2"}}}
    )
    meter = TokenMeter(MemoryKVStore())
    book = PriceBook(config, meter=meter, clock=lambda: NOW, adapters=lambda: dict(ADAPTERS))
    rng = random.Random(7)
    served = [(rng.choice(["base", "legal", "legal", "chef"]), _usage(rng)) for _ in range(400)]
    for model, usage in served:
        await book.observe(model, usage)
    metered = await meter.served("base", window_s=GPU.window_s, now=NOW)
    assert metered.prompt == sum(u.prompt_tokens for _, u in served)  # adapters' tokens count for the base
    assert (await meter.served("legal", window_s=GPU.window_s, now=NOW)).prompt == 0
    await book.refresh_if_stale("legal")  # refreshes the base's rate
    assert book.rates("legal") == book.rates("chef") == book.rates("base") and book.rates("legal").basis == "gpu"
    assert book.base_of("legal") == "base" and book.base_of("base") is None and book.priced_as("other") == "other"

    per_model: dict[str, int] = {}
    weights: dict[str, Fraction] = {}
    for model, u in served:
        per_model[model] = per_model.get(model, 0) + cost_micros(u, book.rates(model))
        w = weighted(GPU, prompt=u.prompt_tokens, completion=u.completion_tokens, cached=u.cached_tokens)
        weights[model] = weights.get(model, Fraction(0)) + w
    deployment = gpu_hourly_usd(GPU) * MICROS_PER_USD * Fraction(metered.span_s) / 3600  # µ$ for the span
    rounding = Fraction(len(served), 2)  # at most 0.5 µ$ per request
    assert abs(sum(per_model.values()) - deployment) <= rounding
    total_w = sum(weights.values())
    for model in ("base", "legal", "chef"):  # each one's share of the deployment is its share of the tokens
        count = sum(1 for m, _ in served if m == model)
        assert abs(per_model[model] - deployment * weights[model] / total_w) <= Fraction(count, 2)


def _record(model: str, usage: Usage, *, cache: str = "miss") -> RequestRecord:
    return RequestRecord(
        request_id="r",
        tenant=Tenant(id="acme"),
        model=model,
        tier=None,
        endpoint="e:1",
        usage=usage,
        status=200,
        stream=False,
        cache_status=cache,
    )


async def test_usage_rows_reports_and_metrics_carry_the_adapter_and_its_base() -> None:
    registry = CollectorRegistry()
    config = TenancyConfig.model_validate(
        {
            "prices": {
                "base": {"input_usd_per_1m": "1", "output_usd_per_1m": "2"},
                "big": {"input_usd_per_1m": "10", "output_usd_per_1m": "30"},
            }
        }
    )
    stage = build_tenancy(config, registry=registry, auth_enabled=False, adapters=lambda: dict(ADAPTERS))
    u = Usage(prompt_tokens=1000, completion_tokens=500)
    for model in ("legal", "legal", "chef", "base"):
        await stage.accountant.record(_record(model, u))
    await stage.accountant.record(_record("legal", u, cache="hit-exact"))
    days = sorted({r.day for r in await stage.ledger.read(days=_days(), tenant=None)})
    rows = await stage.ledger.read(days=days, tenant=None)
    report = usage_json(rows, days=days, scope="all", adapters=stage.prices.adapters())
    one = 1000 + 500 * 2  # µ$: $1/1M prompt, $2/1M completion, at the base's price
    by_model = {g["model"]: g for g in report["by_model"]}
    assert {m: (g["base"], g["cost_micros"]) for m, g in by_model.items()} == {
        "legal": ("base", 2 * one),
        "chef": ("base", one),
        "base": ("", one),
    }
    assert by_model["legal"]["saved_cache_micros"] == one and by_model["legal"]["requests"] == 3
    assert report["by_base"] == [{"base": "base", **report["totals"]}]  # one deployment, all of it
    assert {(r["model"], r["base"]) for r in report["data"]} == {("legal", "base"), ("chef", "base"), ("base", "")}
    table = list(csv.DictReader(io.StringIO(usage_csv(rows, adapters=stage.prices.adapters()))))
    assert {(r["model"], r["base"], r["cost_micros"]) for r in table} == {
        ("legal", "base", str(2 * one)),
        ("chef", "base", str(one)),
        ("base", "", str(one)),
    }
    value = registry.get_sample_value
    assert value("fleetgate_adapter_info", {"model": "legal", "base": "base"}) == 1
    assert value("fleetgate_adapter_info", {"model": "base", "base": "base"}) is None
    assert value("fleetgate_tenant_cost_usd_total", {"tenant": "acme", "model": "legal", "tier": ""}) == 2 * one / 1e6
    assert (
        value("llm_cost_per_million_tokens", {"model_name": "chef", "phase": "generation", "cost_basis": "list"}) == 2
    )
    # a reservation for an adapter is estimated at its base's price, not the highest one
    assert stage.prices.estimate_rates("legal") == stage.prices.rates("base")


def _days() -> list[str]:
    from datetime import UTC, datetime, timedelta

    today = datetime.now(UTC).date()
    return [(today + timedelta(days=d)).isoformat() for d in (-1, 0, 1)]
