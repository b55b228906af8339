"""`cancel_and_wait` (fleetgate.core.tasks): a background task is ended even when it drops a cancellation, the
caller's own cancellation is never swallowed, and a task's failure is not hidden."""

from __future__ import annotations

import asyncio

import pytest

from fleetgate.core.tasks import cancel_and_wait


class DroppingLoop:
    """A `while True` background loop whose first `drops` cancellations are lost, as Python 3.11's
    `asyncio.wait_for` loses one that lands with its awaitable's result (redis-py's writes go through it)."""

    def __init__(self, *, drops: int) -> None:
        self.drops = drops
        self.dropped = 0

    async def run(self) -> None:
        while True:
            try:
                await asyncio.sleep(0.005)
            except asyncio.CancelledError:
                if self.dropped >= self.drops:
                    raise
                self.dropped += 1


async def test_a_task_that_drops_its_cancellations_is_cancelled_again_until_it_ends() -> None:
    dropping = DroppingLoop(drops=3)
    task = asyncio.create_task(dropping.run())
    await asyncio.sleep(0.02)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    closing = asyncio.create_task(cancel_and_wait(task, recancel_s=0.05))
    done, _ = await asyncio.wait([closing], timeout=5)
    took = loop.time() - t0
    if not done:  # end it, then fail
        dropping.drops = 0
        task.cancel()
        await asyncio.wait([closing, task])
    assert task.cancelled() and dropping.dropped == 3
    assert took < 1.0


async def test_a_task_that_ends_at_its_first_cancel_is_not_waited_for_longer() -> None:
    tasks = [asyncio.create_task(asyncio.sleep(3600)) for _ in range(3)]
    await asyncio.sleep(0)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await cancel_and_wait(*tasks, None, recancel_s=5.0)
    assert all(t.cancelled() for t in tasks)
    assert loop.time() - t0 < 1.0  # no re-cancel interval was waited out


async def test_the_callers_own_cancellation_propagates() -> None:
    """The helper it replaced awaited under `suppress(CancelledError)`, which also swallowed the caller's cancel: a
    shutdown bounded by a timeout then waited on past its bound."""
    dropping = DroppingLoop(drops=10**9)
    stuck = asyncio.create_task(dropping.run())
    closing = asyncio.create_task(cancel_and_wait(stuck, recancel_s=0.05))
    await asyncio.sleep(0.1)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(closing, 1.0)
    assert dropping.dropped >= 2  # it was being cancelled over and over until the caller left
    dropping.drops = 0
    await cancel_and_wait(stuck)


async def test_a_task_that_failed_raises_its_error_and_a_finished_one_nothing() -> None:
    async def fail() -> None:
        raise RuntimeError("boom")

    failed, finished = asyncio.create_task(fail()), asyncio.create_task(asyncio.sleep(0))
    await asyncio.sleep(0.01)
    with pytest.raises(RuntimeError, match="boom"):
        await cancel_and_wait(finished, failed)
    await cancel_and_wait(finished, None)
