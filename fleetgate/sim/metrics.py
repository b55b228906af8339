"""vLLM's `/metrics` names for a simulated engine, read from the engine's state at scrape time.

Same names, types and labels (`model_name`, `engine`) as vLLM 0.x's V1 engine, so scrapers and
dashboards cannot tell the difference: `vllm:num_requests_running|waiting`,
`vllm:kv_cache_usage_perc`, `vllm:prefix_cache_queries|hits` (tokens), `vllm:prompt_tokens`,
`vllm:generation_tokens`, `vllm:request_success`, `vllm:time_to_first_token_seconds`,
`vllm:cache_config_info` (block size and number of KV blocks, the capacity a router reads) and, with
LoRA enabled, `vllm:lora_requests_info` (labels `running_lora_adapters`, `waiting_lora_adapters`: the
comma-separated adapters of running and waiting requests; `max_lora`; the value is the scrape's Unix
time, as vLLM sets it so the newest series wins).
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fleetgate.sim.engine import SimEngine, SimRequest

# vLLM's TTFT buckets (seconds).
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)


class _EngineCollector(Collector):
    def __init__(self, engine: SimEngine) -> None:
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        e = self.engine
        labels = ["model_name", "engine"]
        values = [e.profile.model, "0"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=labels)
            g.add_metric(values, value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=labels)
            c.add_metric(values, value)
            return c

        c = e.counters
        yield gauge("vllm:num_requests_running", "Number of requests in model execution batches.", len(e.running))
        yield gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", len(e.waiting))
        yield gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", e.kv_usage)
        yield counter("vllm:prefix_cache_queries", "Prefix cache queries, in terms of number of queried tokens.",
                      c.prefix_queries)
        yield counter("vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.",
                      c.prefix_hits)
        yield counter("vllm:prompt_tokens", "Number of prefill tokens processed.", c.prompt_tokens)
        yield counter("vllm:generation_tokens", "Number of generation tokens processed.", c.generation_tokens)
        yield counter("vllm:request_success", "Count of successfully processed requests.", c.requests_success)
        info = GaugeMetricFamily("vllm:cache_config_info", "Information of the LLMEngine CacheConfig",
                                 labels=["block_size", "num_gpu_blocks", "enable_prefix_caching", "engine"])
        info.add_metric([str(e.profile.block_size), str(e.profile.num_blocks), "True", "0"], 1.0)
        yield info
        if e.lora is not None:
            lora = GaugeMetricFamily("vllm:lora_requests_info", "Running stats on lora requests.",
                                     labels=["running_lora_adapters", "waiting_lora_adapters", "max_lora"])
            lora.add_metric([",".join(e.adapters_of(e.running)), ",".join(e.adapters_of(e.waiting)),
                             str(e.profile.max_loras)], time.time())
            yield lora


class SimMetrics:
    """One registry per simulated engine."""

    def __init__(self, engine: SimEngine) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(engine))
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
            ["model_name", "engine"], buckets=TTFT_BUCKETS, registry=self.registry,
        ).labels(engine.profile.model, "0")
        engine.on_first_token = self._observe_ttft

    def _observe_ttft(self, req: SimRequest) -> None:
        if req.ttft_s is not None:
            self.ttft.observe(req.ttft_s)
