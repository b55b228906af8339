"""Pricing: exact integer micro-dollars for list prices, GPU-derived prices from measured tokens."""

from __future__ import annotations

import random
from decimal import Decimal
from fractions import Fraction

from fleetgate.core.kvstore import MemoryKVStore
from fleetgate.core.types import Usage
from fleetgate.gateway.tenancy.config import GpuPrice, ListPrice, TenancyConfig
from fleetgate.gateway.tenancy.meter import TokenMeter
from fleetgate.gateway.tenancy.pricing import (
    PriceBook,
    cost_micros,
    gpu_rates,
    list_rates,
    micros_to_usd,
    usd_to_micros,
)

CHEAP = ListPrice(input_usd_per_1m=Decimal("0.15"), output_usd_per_1m=Decimal("0.60"),
                  cached_usd_per_1m=Decimal("0.075"))


def test_list_price_of_a_million_tokens_is_the_price_exactly() -> None:
    r = list_rates(CHEAP)
    assert cost_micros(Usage(prompt_tokens=1_000_000), r) == 150_000
    assert cost_micros(Usage(completion_tokens=1_000_000), r) == 600_000
    assert cost_micros(Usage(prompt_tokens=1_000_000, cached_tokens=1_000_000), r) == 75_000


def test_cached_tokens_are_part_of_prompt_tokens_and_priced_at_the_cached_rate() -> None:
    r = list_rates(CHEAP)
    # 600k uncached * 0.15 + 400k cached * 0.075 + 10k * 0.60 (micro-dollars per token)
    assert cost_micros(Usage(prompt_tokens=1_000_000, cached_tokens=400_000, completion_tokens=10_000), r) == (
        90_000 + 30_000 + 6_000
    )


def test_per_request_rounding_is_half_up_to_a_micro_dollar() -> None:
    r = list_rates(CHEAP)
    assert cost_micros(Usage(prompt_tokens=3), r) == 0  # 0.45 µ$
    assert cost_micros(Usage(prompt_tokens=10), r) == 2  # 1.5 µ$ rounds up
    assert cost_micros(Usage(prompt_tokens=9), r) == 1  # 1.35 µ$


def test_totals_of_many_requests_are_integer_sums_without_float_drift() -> None:
    rng = random.Random(7)
    r = list_rates(ListPrice(input_usd_per_1m=Decimal("3"), output_usd_per_1m=Decimal("15")))
    usages = [Usage(prompt_tokens=rng.randint(1, 4000), completion_tokens=rng.randint(1, 800)) for _ in range(5000)]
    costs = [cost_micros(u, r) for u in usages]
    total = sum(costs)
    exact = sum(3 * u.prompt_tokens + 15 * u.completion_tokens for u in usages)  # µ$: $3/1M = 3 µ$/token
    assert total == exact  # prices with whole micro-dollars per token never round
    float_total = 0.0
    for c in costs:
        float_total += c / 1e6
    assert micros_to_usd(total) == f"{exact // 1_000_000}.{exact % 1_000_000:06d}"
    assert abs(float_total - total / 1e6) < 1e-6  # floats only for display


def test_usd_conversions_are_exact() -> None:
    assert usd_to_micros(Decimal("12.345678")) == 12_345_678
    assert micros_to_usd(12_345_678) == "12.345678"
    assert micros_to_usd(-5) == "-0.000005"


GPU = GpuPrice(kind="gpu", gpu_type="L4", gpu_count=2, usd_per_gpu_hour=Decimal("2.50"),
               fallback_tokens_per_hour=1_000_000, min_tokens=1000)


def test_gpu_price_is_hourly_cost_over_tokens_served() -> None:
    # 2 GPUs x $2.50 = $5/hour; 10M tokens served in one hour -> $0.50 per 1M tokens.
    r = gpu_rates(GPU, weighted_tokens=Fraction(10_000_000), span_s=3600)
    assert r.basis == "gpu"
    assert cost_micros(Usage(prompt_tokens=500_000, completion_tokens=500_000), r) == 500_000
    # Half an hour measured with 10M tokens: twice the throughput, half the price.
    r_half = gpu_rates(GPU, weighted_tokens=Fraction(10_000_000), span_s=1800)
    assert cost_micros(Usage(completion_tokens=1_000_000), r_half) == 250_000


def test_gpu_price_uses_the_fallback_until_enough_tokens_are_measured() -> None:
    r = gpu_rates(GPU, weighted_tokens=Fraction(999), span_s=3600)
    # $5/hour over the assumed 1M tokens/hour: $5 per 1M tokens.
    assert cost_micros(Usage(prompt_tokens=1_000_000), r) == 5_000_000


async def test_price_book_measures_served_tokens_for_gpu_models() -> None:
    config = TenancyConfig.model_validate({
        "prices": {"big": GPU.model_dump(), "small": CHEAP.model_dump()},
    })
    store = MemoryKVStore()
    meter = TokenMeter(store)
    now = 1_800_000_000.0 + 30  # 30 s into a minute
    book = PriceBook(config, meter=meter, clock=lambda: now)
    assert cost_micros(Usage(prompt_tokens=1_000_000), book.rates("big")) == 5_000_000  # fallback
    await book.observe("big", Usage(prompt_tokens=4_000_000, completion_tokens=1_000_000))
    await book.observe("small", Usage(prompt_tokens=10))  # list-priced: not metered
    served = await meter.served("big", window_s=3600, now=now)
    assert (served.prompt, served.completion, served.span_s) == (4_000_000, 1_000_000, 30.0)
    assert await meter.served("small", window_s=3600, now=now) == type(served)(0, 0, 0, 0.0)
    await book.refresh_if_stale("big")
    # $5/hour for the 30 s metered so far, over 5M tokens: 5e6 µ$ * (30/3600) / 5e6 tokens.
    assert book.rates("big").input == book.rates("big").output == Fraction(30, 3600)
    assert cost_micros(Usage(completion_tokens=3_600_000), book.rates("big")) == 30_000
    assert book.rates("unknown").basis == "none" and cost_micros(Usage(prompt_tokens=99), book.rates("x")) == 0


def test_integer_cost_equals_the_exact_fraction_formula() -> None:
    """cost_micros runs on integers over a common denominator; it must equal round-half-up of the exact sum."""
    import math

    rng = random.Random(13)
    prices = [CHEAP, ListPrice(input_usd_per_1m=Decimal("3"), output_usd_per_1m=Decimal("15"))]
    rates = [list_rates(p) for p in prices]
    rates.append(gpu_rates(GpuPrice(kind="gpu", gpu_type="L4", gpu_count=2, usd_per_gpu_hour=Decimal("2.17"),
                                    fallback_tokens_per_hour=1_000_000, output_weight=3, min_tokens=1),
                           weighted_tokens=Fraction(123_457), span_s=37.3))
    for r in rates:
        for _ in range(2000):
            prompt = rng.randrange(0, 200_000)
            usage = Usage(prompt_tokens=prompt, cached_tokens=rng.randrange(0, prompt + 1),
                          completion_tokens=rng.randrange(0, 50_000))
            cached = usage.cached_tokens
            exact = (prompt - cached) * r.input + cached * r.cached + usage.completion_tokens * r.output
            assert cost_micros(usage, r) == math.floor(exact + Fraction(1, 2))
