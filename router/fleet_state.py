"""What the scheduler knows about each endpoint: scraped engine metrics, gateway-counted in-flight
requests and health. One instance per scheduler, shared by its plugins."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from fleetgate.router.health import HealthTracker


@dataclass(slots=True)
class EndpointStats:
    """From the engine's own `/metrics` (vLLM names)."""

    waiting: float = 0.0  # vllm:num_requests_waiting
    running: float = 0.0  # vllm:num_requests_running
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0..1
    kv_capacity_tokens: int | None = None  # vllm:cache_config_info num_gpu_blocks * block_size
    scraped_at: float = 0.0  # clock time of the last successful scrape; 0 = never


class FleetState:
    def __init__(self, *, health: HealthTracker | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.health = health or HealthTracker(clock=clock)
        self.stats: dict[str, EndpointStats] = {}
        self.inflight: dict[str, int] = {}

    def stats_of(self, endpoint_id: str) -> EndpointStats:
        st = self.stats.get(endpoint_id)
        if st is None:
            st = self.stats[endpoint_id] = EndpointStats()
        return st

    def load(self, endpoint_id: str) -> float:
        """Requests the endpoint has to work through: in flight from this gateway (exact, fresh) or
        running + waiting as the engine last reported (covers other gateway replicas), whichever
        is larger."""
        st = self.stats.get(endpoint_id)
        scraped = st.waiting + st.running if st is not None else 0.0
        return max(float(self.inflight.get(endpoint_id, 0)), scraped)

    def started(self, endpoint_id: str) -> None:
        self.inflight[endpoint_id] = self.inflight.get(endpoint_id, 0) + 1

    def finished(self, endpoint_id: str) -> None:
        n = self.inflight.get(endpoint_id, 0) - 1
        if n > 0:
            self.inflight[endpoint_id] = n
        else:
            self.inflight.pop(endpoint_id, None)
