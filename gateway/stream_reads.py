"""The reads of one engine stream under the gateway's limits, shared by every relay (`streaming.RelayStream` for
chat and completions, `event_relay.EventRelay` for the Responses and Messages APIs).

`read(started=...)` waits for the next network read, at most the first-byte timeout before the first chunk and
the inter-chunk timeout after, and never past the stream's total `deadline` (loop time); `interrupt()` (the
gateway is shutting down) ends the read under way at once. Instead of bytes it returns a `StreamEnd` saying why
the stream ends: `kind` (what the outcome records: shutdown, deadline, timeout, midstream), a message fit for
the client, and the error code. An empty read (the engine closed the stream) is a `midstream` end; whether the
stream was complete by then is the relay's to say (it checks first). `close()` (the relay's, once) drops the
stream's timer.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import aiohttp

log = logging.getLogger("fleetgate.gateway.upstream")
# uvloop keeps time in milliseconds and rounds a timer's delay to the nearest one: a timer may fire up to half
# a millisecond before its time, which is then counted as reached (instead of setting a timer again at once).
_EARLY_S = 0.001


@dataclass(frozen=True, slots=True)
class StreamEnd:
    kind: str
    message: str
    code: str


class StreamReads:
    """One engine stream's reads. The timeouts are kept by one watchdog timer per stream rather than a timer per
    read: `asyncio.timeout_at` costs ~3 us of CPU a read on uvloop (it creates and cancels a timer), ~6% of what
    relaying a token costs in all, and a stream at GPU pace reads once per token. The watchdog is set for the
    end of the read under way; when it fires it ends the read still waiting (cancelling its task, as
    `asyncio.timeout` does), or, when later reads moved the end on, sets itself for the new end. So a read
    ends exactly when its own timeout says."""

    def __init__(self, response: aiohttp.ClientResponse, *, endpoint_id: str, first_byte_timeout_s: float,
                 inter_chunk_timeout_s: float, deadline: float | None = None) -> None:
        self._resp = response
        self._endpoint_id = endpoint_id
        self._first_timeout = first_byte_timeout_s
        self._inter_timeout = inter_chunk_timeout_s
        self._deadline = deadline  # loop time by which the whole stream must end
        self.interrupted: str | None = None
        self._waiting: asyncio.Task[Any] | None = None  # the task waiting in `read`, while it waits
        self._ends_at = 0.0  # loop time the waiting read ends at
        self._expired = False  # the waiting read was ended (its task cancelled) by the watchdog or `interrupt`
        self._timer: asyncio.TimerHandle | None = None  # the watchdog, set for `_timer_at`
        self._timer_at = 0.0

    def interrupt(self, message: str) -> None:
        if self.interrupted is None:
            self.interrupted = message
        if self._waiting is not None and not self._expired:
            self._expire(self._waiting)

    def shutdown(self) -> StreamEnd | None:
        """The end to report before reading, when the gateway is shutting down."""
        return StreamEnd("shutdown", self.interrupted, "server_shutting_down") if self.interrupted else None

    def close(self) -> None:
        """No more reads: the watchdog goes."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self, task: asyncio.Task[Any]) -> None:
        self._expired = True
        task.cancel()

    def _watch(self) -> None:
        """The watchdog fired: end the waiting read if its time is up, else set the watchdog for its end."""
        self._timer = None
        task = self._waiting
        if task is None or self._expired:
            return  # the next read sets it again
        loop = asyncio.get_running_loop()
        if loop.time() + _EARLY_S >= self._ends_at:
            self._expire(task)
        else:
            self._set(loop, self._ends_at)

    def _set(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        self._timer = loop.call_at(when, self._watch)
        self._timer_at = when

    async def read(self, *, started: bool) -> bytes | StreamEnd:
        timeout = self._inter_timeout if started else self._first_timeout
        loop = asyncio.get_running_loop()
        when = loop.time() + timeout
        if self._deadline is not None and self._deadline < when:
            when = self._deadline
        if self._timer is None or self._timer_at > when:  # else it fires first and moves itself on
            if self._timer is not None:
                self._timer.cancel()
            self._set(loop, when)
        task = asyncio.current_task()
        assert task is not None
        self._ends_at = when
        self._expired = False
        cancelling = task.cancelling()
        self._waiting = task
        try:
            data = await self._resp.content.readany()
        except asyncio.CancelledError:
            # ours only when nothing else (the client leaving, an outer timeout) cancelled the task too
            if not (self._expired and task.uncancel() <= cancelling):
                raise
            if self.interrupted is not None:
                return StreamEnd("shutdown", self.interrupted, "server_shutting_down")
            if self._deadline is not None and when >= self._deadline:  # this read's end was the deadline
                return StreamEnd("deadline", "the stream reached the gateway's deadline for a whole stream",
                                 "stream_deadline")
            return StreamEnd("timeout", f"the engine sent nothing for {timeout:g}s", "upstream_timeout")
        except aiohttp.ClientError as exc:
            log.warning("engine stream broke off", extra={"endpoint": self._endpoint_id, "error": repr(exc)})
            # the response's reader keeps this error; its traceback holds this frame, and so the response: a
            # reference cycle (the request's whole state) for the cyclic GC unless the traceback goes
            exc.__traceback__ = None
            return StreamEnd("midstream", "the engine broke off the stream", "upstream_error")
        finally:
            self._waiting = None
        if not data:
            return StreamEnd("midstream", "the engine closed the stream before it finished", "upstream_error")
        return data
