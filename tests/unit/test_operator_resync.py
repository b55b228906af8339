"""Delayed re-checks: one pending per service, the earliest wins, a failure is tried again, a pause skips."""

from __future__ import annotations

import asyncio

from fleetgate.operator.resync import Key, Resync


async def test_one_pending_recheck_per_key_and_the_earliest_wins() -> None:
    runs: list[Key] = []

    async def run(key: Key) -> None:
        runs.append(key)

    resync = Resync(run=run)
    resync.schedule(("ml", "a"), after_s=0.2)
    resync.schedule(("ml", "a"), after_s=5.0)  # later: the pending one stays
    resync.schedule(("ml", "a"), after_s=0.05)  # sooner: replaces it
    resync.schedule(("ml", "b"), after_s=0.05)
    await asyncio.sleep(0.4)
    assert sorted(runs) == [("ml", "a"), ("ml", "b")]
    assert resync.pending(("ml", "a")) is None
    await resync.aclose()


async def test_a_failed_recheck_is_tried_again_and_a_paused_operator_runs_none() -> None:
    calls = 0
    paused = False

    async def run(key: Key) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("API server unavailable")

    async def is_paused() -> bool:
        return paused

    resync = Resync(run=run, paused=is_paused, retry_s=0.05)
    resync.schedule(("ml", "a"), after_s=0.01)
    await asyncio.sleep(0.3)
    assert calls == 2  # failed once, retried once, then nothing pending
    paused = True
    resync.schedule(("ml", "a"), after_s=0.01)
    await asyncio.sleep(0.1)
    assert calls == 2
    resync.schedule(("ml", "a"), after_s=10)
    await resync.aclose()
    assert resync.pending(("ml", "a")) is None
