"""Endpoint ejection with capped exponential back-off.

Inputs: connect errors and timeouts reported by the gateway (`Scheduler.on_connect_error`),
failed `/health` polls, and successes. After the n-th consecutive failure an endpoint is ejected
for `min(base_s * 2**(n-1), max_s)` seconds; a success resets n to 0 and lifts the ejection.
Parameters: `base_s` (default 1 s), `max_s` (default 30 s). Time comes from an injected clock.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(slots=True)
class _State:
    failures: int = 0
    ejected_until: float = 0.0


class HealthTracker:
    def __init__(self, *, base_s: float = 1.0, max_s: float = 30.0, clock: Callable[[], float] = time.monotonic):
        if base_s <= 0 or max_s < base_s:
            raise ValueError("need 0 < base_s <= max_s")
        self.base_s = base_s
        self.max_s = max_s
        self.clock = clock
        self._states: dict[str, _State] = {}

    def record_failure(self, endpoint_id: str) -> float:
        """Eject `endpoint_id`; returns the back-off in seconds."""
        st = self._states.setdefault(endpoint_id, _State())
        st.failures += 1
        backoff = min(self.base_s * 2 ** (st.failures - 1), self.max_s)
        st.ejected_until = self.clock() + backoff
        return backoff

    def record_success(self, endpoint_id: str) -> None:
        st = self._states.get(endpoint_id)
        if st is not None:
            st.failures = 0
            st.ejected_until = 0.0

    @property
    def any_tracked(self) -> bool:
        """False when no endpoint has ever failed (or all were forgotten): filters can skip work."""
        return bool(self._states)

    def is_ejected(self, endpoint_id: str, *, now: float | None = None) -> bool:
        st = self._states.get(endpoint_id)
        return st is not None and st.ejected_until > (self.clock() if now is None else now)

    def ejected_until(self, endpoint_id: str) -> float:
        st = self._states.get(endpoint_id)
        return 0.0 if st is None else st.ejected_until

    def failures(self, endpoint_id: str) -> int:
        st = self._states.get(endpoint_id)
        return 0 if st is None else st.failures

    def forget(self, keep: set[str]) -> None:
        """Drop state of endpoints no longer discovered."""
        for eid in [e for e in self._states if e not in keep]:
            del self._states[eid]
