"""What a gateway shutting down waits for, and ends: requests in flight and the engine streams they relay.

`Activity` counts requests from the pipeline's start to their response's end (a stream: until it closes)
and holds the open `RelayStream`s (streamed to a client, or collected into a non-streaming answer).
The server's shutdown (`serve.GatewayServer`) stops accepting, waits `wait_idle(drain_s)` for the requests
in flight to finish by themselves, then `interrupt()`s the streams still open: each ends at once with an
OpenAI-shaped error event and `[DONE]` (a non-streaming answer being collected becomes a 503), and is
settled and recorded like any other ending, with the engine's usage so far.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class Interruptible(Protocol):
    def interrupt(self, message: str) -> None: ...


SHUTDOWN_MESSAGE = "the gateway is shutting down; the stream was ended early (retry the request)"


class Activity:
    def __init__(self) -> None:
        self._active = 0
        self._idle: asyncio.Event | None = None
        self._streams: set[Interruptible] = set()
        self.interrupted = False

    @property
    def active(self) -> int:
        return self._active

    @property
    def streams(self) -> int:
        return len(self._streams)

    def begin(self) -> None:
        self._active += 1

    def end(self) -> None:
        self._active -= 1
        if self._active <= 0 and self._idle is not None:
            self._idle.set()

    def opened(self, stream: Interruptible) -> None:
        """A stream started; a stream opened after the interruption is ended at once."""
        self._streams.add(stream)
        if self.interrupted:
            stream.interrupt(SHUTDOWN_MESSAGE)

    def closed(self, stream: Interruptible) -> None:
        self._streams.discard(stream)

    async def wait_idle(self, *, timeout_s: float) -> bool:
        """True once no request is in flight; False when `timeout_s` passed first."""
        if self._active <= 0:
            return True
        self._idle = asyncio.Event()
        try:
            async with asyncio.timeout(timeout_s):
                while self._active > 0:
                    self._idle.clear()
                    await self._idle.wait()
        except TimeoutError:
            return False
        return True

    def interrupt(self, message: str = SHUTDOWN_MESSAGE) -> int:
        """End every open stream now; the number ended."""
        self.interrupted = True
        streams = list(self._streams)
        for stream in streams:
            stream.interrupt(message)
        return len(streams)
