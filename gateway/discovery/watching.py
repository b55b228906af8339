"""Keeping a Kubernetes discovery source current: one watch per kind, a periodic re-list, recovery from errors.

A source lists everything once before it starts serving (`relist`), then `WatchLoop` runs one task per watched
kind, folding each event into the source (`apply`), and one task that re-lists every `resync_s` anyway (a
missed event is repaired within one period). A broken watch never takes discovery down: it is logged, the
source re-lists after `retry_s`, and the watch starts again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any

from fleetgate.core.tasks import cancel_and_wait

log = logging.getLogger("fleetgate.gateway.discovery")

Events = Callable[[], AsyncIterator[tuple[str, Mapping[str, Any]]]]


class WatchLoop:
    def __init__(
        self, *, name: str, relist: Callable[[], Awaitable[None]], watches: Mapping[str, Events],
        apply: Callable[[str, str, Mapping[str, Any]], None], resync_s: float, retry_s: float,
    ) -> None:
        self._name = name
        self._relist = relist
        self._watches = dict(watches)
        self._apply = apply
        self._resync_s = resync_s
        self._retry_s = retry_s
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._watch(kind)) for kind in self._watches]
        self._tasks.append(asyncio.create_task(self._resync()))

    async def _watch(self, kind: str) -> None:
        while True:
            try:
                async for event, obj in self._watches[kind]():
                    self._apply(kind, event, obj)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # re-list and go on
                log.warning("%s: %s watch failed (%s); re-listing in %.0fs", self._name, kind, exc, self._retry_s)
                await asyncio.sleep(self._retry_s)
                with contextlib.suppress(Exception):
                    await self._relist()

    async def _resync(self) -> None:
        while True:
            await asyncio.sleep(self._resync_s)
            try:
                await self._relist()
            except Exception as exc:
                log.warning("%s: resync failed: %s", self._name, exc)

    async def stop(self) -> None:
        with contextlib.suppress(Exception):
            await cancel_and_wait(*self._tasks)
        self._tasks = []


class WatchedSource:
    """`start()` / `aclose()` of a discovery source: a client, one first list, then a `WatchLoop` over `KINDS`.
    A subclass implements `relist`, `apply_event` and `_watched` (what to watch for each kind)."""

    NAME = "discovery"
    KINDS: tuple[str, ...] = ()

    def __init__(self, *, client_factory: Any, resync_s: float, retry_s: float) -> None:
        self._client_factory = client_factory
        self._resync_s = resync_s
        self._retry_s = retry_s
        self._client: Any = None
        self._loop: WatchLoop | None = None

    async def relist(self) -> None:
        raise NotImplementedError

    def apply_event(self, kind: str, event: str, obj: Mapping[str, Any]) -> None:
        raise NotImplementedError

    def _watched(self, kind: str) -> tuple[Any, str, dict[str, Any] | None]:
        """(lightkube resource, namespace, label selector) of one kind."""
        raise NotImplementedError

    @staticmethod
    def _plain(obj: Any) -> dict[str, Any]:
        return dict(obj) if isinstance(obj, dict) else dict(obj.to_dict())

    def _events(self, kind: str) -> Events:
        res, namespace, labels = self._watched(kind)

        async def events() -> AsyncIterator[tuple[str, Mapping[str, Any]]]:
            assert self._client is not None
            async for event, obj in self._client.watch(res, namespace=namespace, labels=labels):
                yield event, self._plain(obj)

        return events

    async def start(self) -> None:
        self._client = self._client_factory()
        await self.relist()
        self._loop = WatchLoop(name=self.NAME, relist=self.relist, apply=self.apply_event,
                               watches={kind: self._events(kind) for kind in self.KINDS},
                               resync_s=self._resync_s, retry_s=self._retry_s)
        self._loop.start()

    async def aclose(self) -> None:
        if self._loop is not None:
            await self._loop.stop()
            self._loop = None
        if self._client is not None:
            await self._client.close()
            self._client = None
