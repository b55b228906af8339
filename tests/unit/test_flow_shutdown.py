"""`Flow.shutdown`'s bound holds even when a settle task does not end on its first cancel: Python 3.11's
`asyncio.wait_for` (inside redis-py's every command) can drop a cancellation that lands as its inner work
completes, and the task then carries on (gh-86296). The shutdown must re-cancel (`core.tasks.cancel_and_wait`),
or a gateway whose Redis stalled at SIGTERM never exits."""

from __future__ import annotations

import asyncio
import logging
import time
from types import SimpleNamespace

from fleetgate.gateway.flow import Flow


def bare_flow() -> Flow:
    flow = Flow.__new__(Flow)  # only what shutdown touches: its tasks, the accountant, the log
    flow._tasks = set()
    flow._unwritten = []
    flow._log = logging.getLogger("test.flow")
    flow.stages = SimpleNamespace(accountant=SimpleNamespace())  # type: ignore[assignment]
    flow.metrics = SimpleNamespace()  # type: ignore[assignment]  # nothing unwritten to count here
    return flow


async def test_a_settle_task_that_swallows_its_first_cancel_still_ends_by_the_deadline() -> None:
    swallowed = 0

    async def stubborn_settle() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(3600)  # a write stalled on Redis
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed > 1:  # the second cancel ends it, as the re-cancel does for a dropped one
                    raise

    flow = bare_flow()
    flow.spawn(stubborn_settle())
    await asyncio.sleep(0)
    start = time.perf_counter()
    async with asyncio.timeout(5):  # one cancel and a plain wait: this never returns
        reported = await flow.shutdown(timeout_s=0.2)
    assert reported == 0 and not flow._tasks
    assert swallowed == 2
    assert time.perf_counter() - start < 2.0
