"""Small asyncio helpers shared by the parts that own background tasks."""

from __future__ import annotations

import asyncio
from typing import Any

RECANCEL_S = 0.1


async def cancel_and_wait(*tasks: asyncio.Task[Any] | None, recancel_s: float = RECANCEL_S) -> None:
    """Cancel `tasks` (None entries are skipped) and wait until every one has finished; the first exception
    one ended with (other than its cancellation) is raised then. A cancellation of the caller itself is not
    swallowed: it propagates, leaving the tasks cancelled.

    A task still running `recancel_s` after a cancel is cancelled again, until it ends. Why: one `cancel()`
    does not always end a task on Python 3.11. `asyncio.wait_for` there returns its awaitable's result and
    drops the cancellation when both land in the same loop iteration (CPython gh-86296, fixed in 3.12), and
    redis-py wraps every socket write in `wait_for`: a background loop cancelled mid Redis command goes on
    looping, and a shutdown that awaits it never ends (measured: 2-3 in 100 cancels of the prefill queue sync
    loop at random moments, each one a gateway that did not exit). So cancellation here is level-triggered, as
    in anyio: a task must not await in its clean-up (closing sockets in a `finally` is fine)."""
    pending = {t for t in tasks if t is not None}
    while pending:
        for task in pending:
            task.cancel()
        _, pending = await asyncio.wait(pending, timeout=recancel_s)
    for ended in tasks:
        error = None if ended is None or ended.cancelled() else ended.exception()
        if error is not None:
            raise error
