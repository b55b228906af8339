"""Shares each gateway replica's in-flight request counts with the other replicas through the `KVStore` log.

Why (issue 24): `FleetState.load(e)`, which the inflight scorer balances and the affinity scorers' hotspot guards
read, counts this replica's own requests to e exactly and everyone else's only through e's `/metrics`, scraped
every 0.5 s. With N replicas behind one Service, (N-1)/N of every engine's load is then a scrape old, and the guards
(2 requests of excess load, `hotspotMargin`) act on that error: see `docs/reports/gateway-replicas.md`.

How: the replicas' maps (endpoint id -> requests in flight) travel exactly like the queued-prefill maps
(`fleetgate.router.prefill_sync.PrefillQueueSync`, topic `inflight`: a background task every `interval_s`,
maps older than `max_age_s` ignored, this replica's own figures alone while the store is down). `FleetState`
asks `others()` for the other replicas' current counts; decisions never wait on the store.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from fleetgate.core.kvstore import KVStore
from fleetgate.core.tasks import cancel_and_wait
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.prefill_sync import PrefillQueueSync


class FleetLoadSync:
    def __init__(self, *, state: FleetState, kvstore: KVStore, namespace: str = "default", interval_s: float = 0.02,
                 max_age_s: float = 2.0, replica_id: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.state = state
        self.maps = PrefillQueueSync(kvstore=kvstore, namespace=namespace, replica_id=replica_id,
                                     interval_s=interval_s, max_age_s=max_age_s, clock=clock, topic="inflight")
        self._task: asyncio.Task[None] | None = None
        state.others = self.maps.others

    def _snapshot(self) -> dict[str, float]:
        return {endpoint_id: float(n) for endpoint_id, n in self.state.inflight.items()}

    def ensure_started(self) -> None:
        """Start the background sync (it needs the running loop: the first decision calls this)."""
        if self._task is None:
            self._task = asyncio.create_task(self.maps.run(self._snapshot), name="inflight-sync")

    async def sync_now(self) -> bool:
        return await self.maps.sync(self._snapshot())

    async def aclose(self) -> None:
        # re-cancels until the task ends: Python 3.11's wait_for inside redis-py can drop a cancel (core.tasks)
        await cancel_and_wait(self._task)
