"""Prometheus metrics of the tenancy stages, registered in the app's own registry.

Per tenant, model and tier: `fleetgate_tenant_*` counters (snake_case, `_total`, base units, like the
Gateway API Inference Extension's `inference_*` and vLLM's counters). Request counts and TTFT/TPOT
histograms with the same tenant/model/tier labels are the gateway's own (`fleetgate_requests_total`,
`fleetgate_time_to_first_token_seconds`, ...), not repeated here. OpenCost-aligned per-model gauges:
`llm_cost_per_million_tokens{model_name, phase, cost_basis}` and `llm_total_hourly_cost` (GPU-priced
models), read from the price book at scrape time so they show the rates requests are charged at.
Dollar counters are floats for Prometheus only; the exact ledger is in integer micro-dollars.

LoRA adapters: the `model` label of a request for an adapter is the adapter's name (a name from the
config or discovery: refused and unknown names are recorded under placeholders, so labels stay bounded).
`fleetgate_adapter_info{model, base} 1`, one series per adapter discovery knows, joins them to their base
model in PromQL, e.g. spend per base deployment with its adapters:
`sum by (base) (fleetgate_tenant_cost_usd_total * on (model) group_left (base) fleetgate_adapter_info)`.
Adapters also get `llm_cost_per_million_tokens` series (their base's rates).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fleetgate.gateway.tenancy.config import GpuPrice, TenancyConfig
from fleetgate.gateway.tenancy.pricing import PriceBook, gpu_hourly_usd

TENANT_LABELS = ("tenant", "model", "tier")


class PriceCollector(Collector):
    def __init__(self, prices: PriceBook) -> None:
        self._prices = prices

    def collect(self) -> Iterator[GaugeMetricFamily]:
        per_m = GaugeMetricFamily(
            "llm_cost_per_million_tokens",
            "Dollars per 1M tokens the gateway charges, by model and phase (prompt, generation, cached).",
            labels=["model_name", "phase", "cost_basis"],
        )
        hourly = GaugeMetricFamily(
            "llm_total_hourly_cost",
            "Hourly infrastructure cost (GPU count x $/GPU-hour) of GPU-priced models.",
            labels=["model_name", "cost_basis"],
        )
        info = GaugeMetricFamily(
            "fleetgate_adapter_info", "1 for each LoRA adapter the gateway serves, with its base model.",
            labels=["model", "base"],
        )
        adapters = self._prices.adapters()
        for model in self._prices.models:
            rates = self._prices.rates(model)
            for phase, usd in rates.per_million_usd().items():
                per_m.add_metric([model, phase, rates.basis], usd)
            price = self._prices.price(model)
            if isinstance(price, GpuPrice):
                hourly.add_metric([model, "gpu"], float(gpu_hourly_usd(price)))
        for adapter, base in sorted(adapters.items()):
            info.add_metric([adapter, base], 1.0)
            if adapter not in self._prices.models and self._prices.price(adapter) is not None:
                rates = self._prices.rates(adapter)
                for phase, usd in rates.per_million_usd().items():
                    per_m.add_metric([adapter, phase, rates.basis], usd)
        yield per_m
        yield hourly
        yield info

    def describe(self) -> Iterator[GaugeMetricFamily]:
        return iter(())


class TenancyMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.tokens = Counter(
            "fleetgate_tenant_tokens",
            "Tokens by kind (prompt, completion, cached; cached prompt tokens are part of prompt) and source "
            "(engine: processed by an engine; cache: replayed from the response cache).",
            [*TENANT_LABELS, "kind", "source"], registry=registry,
        )
        self.cost = Counter(
            "fleetgate_tenant_cost_usd", "Dollars charged (engine-served tokens at the model's rates).",
            TENANT_LABELS, registry=registry,
        )
        self.savings = Counter(
            "fleetgate_tenant_savings_usd",
            "Dollars saved: source=cache (what the engine would have cost) or tiering (baseline model minus "
            "the tier that served).",
            [*TENANT_LABELS, "source"], registry=registry,
        )
        self.limited = Counter(
            "fleetgate_tenant_limited_requests", "Requests refused with 429 by limit (rpm, tpm, daily_budget, "
            "monthly_budget).", ["tenant", "limit"], registry=registry,
        )
        self.store_errors = Counter(
            "fleetgate_tenancy_store_errors", "Limits/ledger store failures by operation.", ["op"],
            registry=registry,
        )
        self.budget = Gauge(
            "fleetgate_tenant_budget_usd", "Configured dollar budget by tenant and period (day, month).",
            ["tenant", "period"], registry=registry,
        )

    def set_budgets(self, config: TenancyConfig) -> None:
        for t in config.tenants:
            if t.daily_budget_usd is not None:
                self.budget.labels(tenant=t.id, period="day").set(float(t.daily_budget_usd))
            if t.monthly_budget_usd is not None:
                self.budget.labels(tenant=t.id, period="month").set(float(t.monthly_budget_usd))


def register_price_gauges(registry: CollectorRegistry, prices: PriceBook) -> None:
    registry.register(PriceCollector(prices))
