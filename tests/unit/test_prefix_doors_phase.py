"""`fleetgate bench gateway --prefix-gain` starts each door's arrivals at the same point of its router's scrape cycle.

The shipped profile's queue-depth and KV-usage scorers read the scraped snapshots, so two doors whose arrivals met
their scrapes at different phases decide differently from the same requests (docs/reports/epp.md, "Decision
parity"): `after_scrape` is what aligns them.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from fleetgate.bench.prefix_doors import after_scrape
from fleetgate.router.fleet_state import FleetState


def _store(state: FleetState, endpoint_id: str) -> None:
    state.update(endpoint_id, waiting=0.0, running=0.0, kv_usage=0.0)


async def test_returns_right_after_a_fresh_round_of_every_endpoint_not_on_older_scrapes() -> None:
    state = FleetState()
    _store(state, "a")  # a round stored before the call: not the round to start after
    _store(state, "b")
    stored: dict[str, float] = {}

    async def scraper() -> None:
        await asyncio.sleep(0.05)
        _store(state, "a")
        stored["a"] = time.perf_counter()
        await asyncio.sleep(0.03)  # the round's second endpoint, later
        _store(state, "b")
        stored["b"] = time.perf_counter()

    task = asyncio.create_task(scraper())
    await after_scrape(state, endpoints=2)
    returned = time.perf_counter()
    await task
    assert "b" in stored, "returned before the round was complete"
    assert returned - stored["b"] < 0.02  # at once, so every door starts at the same phase within a few ms


async def test_a_router_that_stores_no_scrape_is_an_error_not_a_wait_forever() -> None:
    state = FleetState()
    _store(state, "a")
    with pytest.raises(RuntimeError, match="no scrape of 1 endpoints"):
        await after_scrape(state, endpoints=1, timeout_s=0.05)
