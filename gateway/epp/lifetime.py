"""How long one ext_proc stream may live, and its early end when the Endpoint Picker shuts down.

Every stream (one proxied request: its request and its response) runs under one timer, `StreamLife`, the
picker's own bound whatever the proxy's route timeouts say:
- it starts at `server.stream_deadline_s` (the gateway's bound on a whole streamed response) and is tightened
  to `server.request_timeout_s` once the request is known not to stream (the gateway's bound on a whole
  non-streaming engine call);
- `interrupt` brings it forward to now: the picker is draining (`server.EppServer.stop`) and this stream is
  still open when `server.drain_s` is over.
When it fires, the exchange ends the request the way the gateway ends it (`Exchange.expire`): a relayed
stream gets an OpenAI-shaped error event and `[DONE]` as its last body chunk; an answer not yet sent to the
client (a request still being admitted, an engine that has not answered, a non-streaming answer being
collected) becomes a 504 (the deadline) or a 503 (shutting down). Either way the request is settled, charged
the engine's work so far and recorded, like any other ending.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import TracebackType

from fleetgate.core.errors import FleetGateError, UpstreamTimeoutError, UpstreamUnavailableError
from fleetgate.gateway.drain import SHUTDOWN_MESSAGE


@dataclass(frozen=True, slots=True)
class Ending:
    """Why a stream is ended early: the stream's event and, for an answer not yet sent, the error."""

    kind: str  # the stream outcome's error kind: "deadline" or "shutdown"
    message: str
    code: str

    def error(self) -> FleetGateError:
        if self.kind == "shutdown":
            return UpstreamUnavailableError("the gateway is shutting down; retry the request")
        return UpstreamTimeoutError("the request did not finish within the gateway's time limit",
                                    code="request_deadline")


DEADLINE = Ending("deadline", "the stream reached the gateway's deadline for a whole stream", "stream_deadline")


class StreamLife:
    """One stream's timer; `async with life:` around the stream's reads and writes raises TimeoutError when it
    fires (`ending` says why)."""

    def __init__(self, deadline_s: float) -> None:
        self._loop = asyncio.get_running_loop()
        self._start = self._loop.time()
        self._timer = asyncio.timeout_at(self._start + deadline_s)
        self._entered = False
        self.interrupted: str | None = None

    async def __aenter__(self) -> StreamLife:
        await self._timer.__aenter__()
        self._entered = True
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        self._entered = False
        await self._timer.__aexit__(exc_type, exc, tb)  # raises TimeoutError when it fired

    def expired(self) -> bool:
        """The timer fired (a TimeoutError from anything else is not the stream's end)."""
        return self._timer.expired()

    def tighten(self, limit_s: float) -> None:
        """End at most `limit_s` after the stream began."""
        when = self._start + limit_s
        current = self._timer.when()
        if self._entered and (current is None or when < current):
            self._timer.reschedule(when)

    def interrupt(self, message: str = SHUTDOWN_MESSAGE) -> None:
        """End the stream now: the picker is shutting down (`drain.Interruptible`)."""
        if self.interrupted is None:
            self.interrupted = message
        if self._entered:
            self._timer.reschedule(self._loop.time())

    @property
    def ending(self) -> Ending:
        if self.interrupted is not None:
            return Ending("shutdown", self.interrupted, "server_shutting_down")
        return DEADLINE
