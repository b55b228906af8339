"""The router's Prometheus metrics, registered in the registry the caller owns (one per app)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from fleetgate.core.telemetry import DECISION_BUCKETS
from fleetgate.router.timing import TimingHistogram
from fleetgate.router.token_ratio import CharsPerToken


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.plugin_seconds = TimingHistogram(
            "fleetgate_router_plugin_seconds", "Time spent in one routing plugin call.",
            ["plugin", "stage"], buckets=DECISION_BUCKETS,
        )
        self.decision_seconds = TimingHistogram(
            "fleetgate_router_decision_seconds", "Time to pick an endpoint, all plugins included.",
            ["profile"], buckets=DECISION_BUCKETS,
        )
        r.register(self.plugin_seconds)
        r.register(self.decision_seconds)
        self.picks = Counter("fleetgate_router_picks", "Requests routed, by endpoint.", ["endpoint"], registry=r)
        self.plugin_errors = Counter(
            "fleetgate_router_plugin_errors", "Producer failures (the request was still routed).", ["plugin"],
            registry=r,
        )
        self.ejections = Counter(
            "fleetgate_router_ejections", "Endpoints ejected after a connect error, timeout or failed health poll.",
            ["endpoint", "reason"], registry=r,
        )
        self.metrics_age = Gauge(
            "fleetgate_router_endpoint_metrics_age_seconds",
            "Seconds since the endpoint's /metrics were last scraped successfully (+Inf: never).",
            ["endpoint"], registry=r,
        )
        self.scrape_errors = Counter(
            "fleetgate_router_scrape_errors", "Failed /metrics scrapes.", ["endpoint"], registry=r
        )
        self.ejected = Gauge("fleetgate_router_endpoint_ejected", "1 while the endpoint is ejected.", ["endpoint"],
                             registry=r)


class CharsPerTokenCollector(Collector):
    """Renders the learned characters per token at scrape time (nothing to update on the request path)."""

    def __init__(self, ratios: CharsPerToken) -> None:
        self.ratios = ratios

    def collect(self) -> Iterator[GaugeMetricFamily]:
        gauge = GaugeMetricFamily(
            "fleetgate_router_chars_per_token",
            "Prompt characters per token the model's engines count, learned from their usage: what scorers with "
            "charsPerToken auto use (absent until 20 requests with usage were seen; 4 is used until then).",
            labels=["model"])
        for model, value in sorted(self.ratios.learned().items()):
            gauge.add_metric([model], value)
        yield gauge
