"""Prices per model and the exact cost of one request in integer micro-dollars.

Inputs: the engine's `Usage` (prompt tokens, of which `cached_tokens` hit the prefix cache, and
completion tokens) and a model's `Rates` (micro-dollars per token of each kind, as exact fractions).

Formula::

    cost_micros = round_half_up( (prompt - cached) * r_in + cached * r_cached + completion * r_out )

Rates are `fractions.Fraction`, so there is no float anywhere: a list price of $0.15 per 1M tokens is
r = 150_000 / 1_000_000 micro-dollars per token, exactly. Per request the sum is computed in plain
integers over the rates' common denominator D (each rate's numerator scaled to D, once per `Rates`):
round_half_up(S / D) = (2S + D) // 2D, the same exact result without Fraction objects (which cost
tens of µs per request). Only the per-request result is rounded to a
whole micro-dollar (at most 0.5 µ$ per request, i.e. 50 cents per million requests); every total and
budget is then a sum of integers, so totals never drift.

Two kinds of price (`TenancyConfig.prices`):
- `list`: $ per 1M input / output / cached tokens.
- `gpu`: infrastructure-derived. hourly = gpu_count * usd_per_gpu_hour; the gateway measures the tokens
  the model's engines served over `window_s` (shared through the KV store, see `meter.TokenMeter`) and
  charges r = hourly * span_hours / weighted_tokens_in_span per weighted token (weights per token kind).
  Until `min_tokens` are measured it assumes `fallback_tokens_per_hour`. Refreshed every `refresh_s`.

LoRA adapters run on their base model's engines, so an adapter without a price of its own is priced as its
base (`PriceBook(adapters=...)`: adapter name -> base model). For a GPU-priced base the adapter's tokens
are metered under the base too: the base deployment's hourly cost is divided by every token its engines
served, base and adapters alike, and each request pays its own weighted tokens at that one rate. Summed,
the adapters' dollars plus the base's own are the deployment's cost for the tokens served (up to 0.5 µ$ of
rounding per request): the base's cost is split across the adapters that used it, by (weighted) tokens.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Literal

from fleetgate.core.types import Usage
from fleetgate.gateway.tenancy.config import GpuPrice, ListPrice, TenancyConfig
from fleetgate.gateway.tenancy.meter import TokenMeter

MICROS_PER_USD = 1_000_000
_PER_1M = 1_000_000
ZERO = Fraction(0)


@dataclass(frozen=True, slots=True)
class Rates:
    """Micro-dollars per token, by kind."""

    input: Fraction
    output: Fraction
    cached: Fraction
    basis: Literal["list", "gpu", "none"] = "list"
    # (input, cached, output numerators, common denominator): integer arithmetic per request
    scaled: tuple[int, int, int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        den = math.lcm(self.input.denominator, self.cached.denominator, self.output.denominator)
        object.__setattr__(self, "scaled", (
            self.input.numerator * (den // self.input.denominator),
            self.cached.numerator * (den // self.cached.denominator),
            self.output.numerator * (den // self.output.denominator),
            den,
        ))

    def per_million_usd(self) -> dict[str, float]:
        """For display and gauges only (floats never feed a total)."""
        return {
            "prompt": float(self.input),
            "generation": float(self.output),
            "cached": float(self.cached),
        }


FREE = Rates(input=ZERO, output=ZERO, cached=ZERO, basis="none")


def cost_micros(usage: Usage, rates: Rates) -> int:
    cached = min(usage.cached_tokens, usage.prompt_tokens)
    uncached = usage.prompt_tokens - cached
    r_in, r_cached, r_out, den = rates.scaled
    total = uncached * r_in + cached * r_cached + usage.completion_tokens * r_out  # = exact cost * den
    return (2 * total + den) // (2 * den)  # floor(total / den + 1/2), in integers


def usd_to_micros(usd: Decimal) -> int:
    micros = Fraction(usd) * MICROS_PER_USD
    return math.floor(micros + Fraction(1, 2))


def micros_to_usd(micros: int) -> str:
    """Exact decimal string, e.g. 1234567 -> '1.234567'."""
    sign = "-" if micros < 0 else ""
    whole, frac = divmod(abs(micros), MICROS_PER_USD)
    return f"{sign}{whole}.{frac:06d}"


def list_rates(price: ListPrice) -> Rates:
    per_token = Fraction(MICROS_PER_USD, _PER_1M)  # micro-dollars per token for $1 per 1M tokens
    cached = price.cached_usd_per_1m if price.cached_usd_per_1m is not None else price.input_usd_per_1m
    return Rates(
        input=Fraction(price.input_usd_per_1m) * per_token,
        output=Fraction(price.output_usd_per_1m) * per_token,
        cached=Fraction(cached) * per_token,
        basis="list",
    )


def gpu_hourly_usd(price: GpuPrice) -> Fraction:
    return price.gpu_count * Fraction(price.usd_per_gpu_hour)


def gpu_rates(price: GpuPrice, *, weighted_tokens: Fraction, span_s: float) -> Rates:
    """Rates from the GPUs' cost over `span_s` divided by the weighted tokens served in it."""
    hourly_micros = gpu_hourly_usd(price) * MICROS_PER_USD
    if weighted_tokens < price.min_tokens or span_s <= 0:
        per_weighted = hourly_micros / price.fallback_tokens_per_hour
    else:
        per_weighted = hourly_micros * Fraction(span_s).limit_denominator(1000) / 3600 / weighted_tokens
    return Rates(
        input=per_weighted * Fraction(price.input_weight),
        output=per_weighted * Fraction(price.output_weight),
        cached=per_weighted * Fraction(price.cached_weight),
        basis="gpu",
    )


def weighted(price: GpuPrice, *, prompt: int, completion: int, cached: int) -> Fraction:
    return (
        (prompt - cached) * Fraction(price.input_weight)
        + completion * Fraction(price.output_weight)
        + cached * Fraction(price.cached_weight)
    )


class PriceBook:
    """Current rates per model. List prices are fixed; GPU-derived ones are refreshed from the meter."""

    def __init__(
        self, config: TenancyConfig, *, meter: TokenMeter, clock: Callable[[], float] = time.time,
        adapters: Callable[[], Mapping[str, str]] | None = None,
        base_of: Callable[[str], str | None] | None = None,
    ) -> None:
        self._clock = clock
        self._adapters = adapters
        self._base_of = base_of  # a fast lookup for the request path; else `adapters()` is searched
        self._prices = dict(config.prices)
        self._default = list_rates(config.default_price) if config.default_price is not None else FREE
        self._meter = meter
        self._rates: dict[str, Rates] = {}
        self._refreshed: dict[str, float] = {}
        for model, price in self._prices.items():
            if isinstance(price, ListPrice):
                self._rates[model] = list_rates(price)
            else:
                self._rates[model] = gpu_rates(price, weighted_tokens=ZERO, span_s=0.0)

    @property
    def models(self) -> list[str]:
        return sorted(self._prices)

    def adapters(self) -> dict[str, str]:
        """Adapter name -> base model, as discovery knows them now."""
        return dict(self._adapters()) if self._adapters is not None else {}

    def base_of(self, model: str) -> str | None:
        """The base model of an adapter; None for any other name."""
        if self._base_of is not None:
            return self._base_of(model)
        return self.adapters().get(model) if self._adapters is not None else None

    def priced_as(self, model: str) -> str:
        """The name whose price `model` pays: its own when it has one, else an adapter's base."""
        if model in self._prices:
            return model
        base = self.base_of(model)
        return base if base is not None else model

    def price(self, model: str) -> ListPrice | GpuPrice | None:
        return self._prices.get(self.priced_as(model))

    def rates(self, model: str) -> Rates:
        return self._rates.get(self.priced_as(model), self._default)

    def estimate_rates(self, model: str) -> Rates:
        """Rates for a reservation: the model's own (an adapter's: its base's), or for an unpriced name (a tier
        alias) the highest."""
        model = self.priced_as(model)
        if model in self._rates or not self._rates:
            return self.rates(model)
        every = [*self._rates.values(), self._default]
        return Rates(input=max(r.input for r in every), output=max(r.output for r in every),
                     cached=max(r.cached for r in every), basis="list")

    async def refresh_if_stale(self, model: str) -> None:
        model = self.priced_as(model)
        price = self._prices.get(model)
        if not isinstance(price, GpuPrice):
            return
        now = time.monotonic()
        if now - self._refreshed.get(model, -math.inf) < price.refresh_s:
            return
        self._refreshed[model] = now
        served = await self._meter.served(model, window_s=price.window_s, now=self._clock())
        tokens = weighted(price, prompt=served.prompt, completion=served.completion, cached=served.cached)
        self._rates[model] = gpu_rates(price, weighted_tokens=tokens, span_s=served.span_s)

    async def observe(self, model: str, usage: Usage) -> None:
        """Feed engine-served tokens of GPU-priced models to the meter (an adapter's under its base's name)."""
        model = self.priced_as(model)
        if isinstance(self._prices.get(model), GpuPrice):
            await self._meter.add(model, usage, now=self._clock())
