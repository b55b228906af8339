"""What the scheduler knows about each endpoint: scraped engine metrics, gateway-counted in-flight
requests, health and the LoRA adapters it has loaded. One instance per scheduler, shared by its plugins."""

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
    own_at_scrape: int = 0  # this gateway's in-flight count to the endpoint when it was scraped
    active_adapters: frozenset[str] | None = None  # vllm:lora_requests_info running + waiting; None: unknown
    max_loras: int | None = None  # GPU LoRA slots (vllm:lora_requests_info max_lora); None: unknown


class FleetState:
    def __init__(self, *, health: HealthTracker | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.health = health or HealthTracker(clock=clock)
        self.stats: dict[str, EndpointStats] = {}
        self.inflight: dict[str, int] = {}
        # endpoint id -> names of the LoRA adapters loaded there (from its `/v1/models`, or a load the
        # gateway made); an endpoint never seen has no entry, which reads as "none loaded".
        self.adapters: dict[str, frozenset[str]] = {}
        self._adapter_added_at: dict[str, float] = {}  # endpoint id -> clock time of the last gateway-made load

    def stats_of(self, endpoint_id: str) -> EndpointStats:
        st = self.stats.get(endpoint_id)
        if st is None:
            st = self.stats[endpoint_id] = EndpointStats()
        return st

    def update(
        self, endpoint_id: str, *, waiting: float, running: float, kv_usage: float,
        kv_capacity_tokens: int | None = None, active_adapters: frozenset[str] | None = None,
        max_loras: int | None = None,
    ) -> None:
        """Store one scrape of the engine's metrics."""
        st = self.stats_of(endpoint_id)
        st.waiting, st.running, st.kv_usage = waiting, running, kv_usage
        st.active_adapters, st.max_loras = active_adapters, max_loras
        if kv_capacity_tokens:
            st.kv_capacity_tokens = kv_capacity_tokens
        st.own_at_scrape = self.inflight.get(endpoint_id, 0)
        st.scraped_at = self.clock()

    def set_adapters(
        self, endpoint_id: str, names: frozenset[str] | set[str] | list[str], *, as_of: float | None = None
    ) -> None:
        """Replace what the endpoint is known to have loaded. `as_of`: when the answer was asked for; an
        answer older than a load the gateway made since is merged instead, so it cannot undo that load."""
        new = frozenset(names)
        added = self._adapter_added_at.get(endpoint_id)
        if as_of is not None and added is not None and as_of <= added:
            new |= self.adapters.get(endpoint_id, frozenset())
        self.adapters[endpoint_id] = new

    def add_adapter(self, endpoint_id: str, name: str) -> None:
        """The endpoint has loaded `name` (a load the gateway asked for succeeded)."""
        self.adapters[endpoint_id] = self.adapters.get(endpoint_id, frozenset()) | {name}
        self._adapter_added_at[endpoint_id] = self.clock()

    def drop_adapter(self, endpoint_id: str, name: str) -> None:
        """The endpoint does not have `name` loaded after all (it answered that it does not know it)."""
        names = self.adapters.get(endpoint_id)
        if names is not None and name in names:
            self.adapters[endpoint_id] = names - {name}
        self._adapter_added_at.pop(endpoint_id, None)

    def has_adapter(self, endpoint_id: str, name: str) -> bool:
        return name in self.adapters.get(endpoint_id, frozenset())

    def forget_adapters(self, keep: set[str]) -> None:
        """Drop the adapter state of endpoints no longer discovered."""
        for endpoint_id in [e for e in self.adapters if e not in keep]:
            del self.adapters[endpoint_id]
            self._adapter_added_at.pop(endpoint_id, None)

    def load(self, endpoint_id: str) -> float:
        """Requests the endpoint has to work through: those this gateway has in flight there now
        (exact, fresh) plus those other gateway replicas had there at the last scrape, estimated as
        max(0, running + waiting scraped - this gateway's in-flight count at scrape time)."""
        own = float(self.inflight.get(endpoint_id, 0))
        st = self.stats.get(endpoint_id)
        if st is None:
            return own
        return own + max(0.0, st.waiting + st.running - st.own_at_scrape)

    def started(self, endpoint_id: str) -> None:
        self.inflight[endpoint_id] = self.inflight.get(endpoint_id, 0) + 1

    def finished(self, endpoint_id: str) -> None:
        n = self.inflight.get(endpoint_id, 0) - 1
        if n > 0:
            self.inflight[endpoint_id] = n
        else:
            self.inflight.pop(endpoint_id, None)
