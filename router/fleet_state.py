"""What the scheduler knows about each endpoint: scraped engine metrics, gateway-counted in-flight
requests, health and the LoRA adapters it has loaded; and of each model, the characters per token its engines
count (`chars_per_token`). One instance per scheduler, shared by its plugins."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from fleetgate.router.health import HealthTracker
from fleetgate.router.token_ratio import CharsPerToken


@dataclass(slots=True)
class EndpointStats:
    """From the engine's own `/metrics` (vLLM names)."""

    waiting: float = 0.0  # vllm:num_requests_waiting
    running: float = 0.0  # vllm:num_requests_running
    kv_usage: float = 0.0  # vllm:kv_cache_usage_perc, 0..1
    kv_capacity_tokens: int | None = None  # vllm:cache_config_info num_gpu_blocks * block_size
    scraped_at: float = 0.0  # clock time of the last successful scrape; 0 = never
    own_at_scrape: int = 0  # this gateway's in-flight count to the endpoint when it was scraped
    others_at_scrape: float = 0.0  # the other replicas' shared in-flight count there then (0 when not shared)
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
        # endpoint id -> requests the other gateway replicas have in flight there now, shared through the store
        # (`fleetgate.router.load_sync`); None: not shared, the scrapes alone tell of the others
        self.others: Callable[[], Mapping[str, float]] | None = None
        # model -> prompt characters per engine token, learned from the usage of completed requests (the scheduler's
        # `on_complete`); what the scorers with `charsPerToken: auto` read
        self.chars_per_token = CharsPerToken()

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
        st.others_at_scrape = self.others().get(endpoint_id, 0.0) if self.others is not None else 0.0
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
        (exact, fresh), plus, when the replicas share their counts (`others`), those the other replicas have
        there now (as of their last sync, ~0.1 s), plus the rest of what the engine reported at the last scrape
        (requests that came through no replica sharing counts), estimated as max(0, running + waiting scraped -
        this replica's and the shared others' in-flight counts at scrape time). Without sharing the last term
        stands for every other replica, as of the last scrape (0.5 s by default)."""
        own = float(self.inflight.get(endpoint_id, 0))
        others = self.others().get(endpoint_id, 0.0) if self.others is not None else 0.0
        st = self.stats.get(endpoint_id)
        if st is None:
            return own + others
        return own + others + max(0.0, st.waiting + st.running - st.own_at_scrape - st.others_at_scrape)

    def started(self, endpoint_id: str) -> None:
        self.inflight[endpoint_id] = self.inflight.get(endpoint_id, 0) + 1

    def finished(self, endpoint_id: str) -> None:
        n = self.inflight.get(endpoint_id, 0) - 1
        if n > 0:
            self.inflight[endpoint_id] = n
        else:
            self.inflight.pop(endpoint_id, None)
