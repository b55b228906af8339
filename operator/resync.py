"""Delayed re-checks of one InferenceService, for what no watch event announces.

Some states change without an event the operator watches: a LoRA adapter that failed to load can load once
the engine at that pod IP answers; a pending engine pod gets its scheduler verdict (FailedScheduling) or a
container waiting reason (ImagePullBackOff, CreateContainerConfigError) on the Pod, not on the Deployment.
After each pass the reconciler asks for a re-check of such a service after a delay; `Resync` keeps at most
one pending re-check per service (the earliest asked for wins), runs it, and forgets it. A re-check that
still finds something pending asks again, so it repeats only while there is something to wait for.

Not a Kopf timer: Kopf puts a finalizer on every object a timer serves, and a stopped operator would then
block deletions. `paused`, when given, is asked before each run (a peer operator with a higher priority
is active: Kopf pauses its handlers then, and these background runs pause with them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from fleetgate.core.tasks import cancel_and_wait

log = logging.getLogger(__name__)
Key = tuple[str, str]  # (namespace, name)


class Resync:
    def __init__(
        self,
        *,
        run: Callable[[Key], Awaitable[None]],
        paused: Callable[[], Awaitable[bool]] | None = None,
        retry_s: float = 30.0,
    ) -> None:
        """`retry_s`: a re-check that raised (the API server did not answer) is tried again after this long."""
        self._run = run
        self._paused = paused
        self._retry_s = retry_s
        self._pending: dict[Key, tuple[float, asyncio.TimerHandle]] = {}
        self._running: set[asyncio.Task[None]] = set()

    def pending(self, key: Key) -> float | None:
        """When the re-check of `key` is due (the loop's clock), or None."""
        entry = self._pending.get(key)
        return entry[0] if entry is not None else None

    def schedule(self, key: Key, *, after_s: float) -> None:
        """Re-check `key` in `after_s` seconds, unless one is already due sooner."""
        loop = asyncio.get_running_loop()
        due = loop.time() + after_s
        current = self._pending.get(key)
        if current is not None:
            if current[0] <= due:
                return
            current[1].cancel()
        self._pending[key] = (due, loop.call_at(due, self._fire, key))

    def cancel(self, key: Key) -> None:
        entry = self._pending.pop(key, None)
        if entry is not None:
            entry[1].cancel()

    def _fire(self, key: Key) -> None:
        self._pending.pop(key, None)
        task = asyncio.get_running_loop().create_task(self._one(key))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _one(self, key: Key) -> None:
        try:
            if self._paused is not None and await self._paused():
                log.info("re-check of %s/%s skipped: a peer operator with a higher priority is active", *key)
                return
            await self._run(key)
        except Exception as exc:  # never lost: tried again later
            log.warning("re-check of %s/%s failed (again in %.0f s): %s", key[0], key[1], self._retry_s, exc)
            self.schedule(key, after_s=self._retry_s)

    async def aclose(self) -> None:
        for _due, handle in self._pending.values():
            handle.cancel()
        self._pending.clear()
        with contextlib.suppress(Exception):  # a re-check's own failure was logged by it
            await cancel_and_wait(*self._running)
