"""The reads of one engine stream under the gateway's limits, shared by every relay (`streaming.RelayStream` for
chat and completions, `event_relay.EventRelay` for the Responses and Messages APIs).

`read(started=...)` waits for the next network read, at most the first-byte timeout before the first chunk and
the inter-chunk timeout after, and never past the stream's total `deadline` (loop time); `interrupt()` (the
gateway is shutting down) ends the read under way at once. Instead of bytes it returns a `StreamEnd` saying why
the stream ends: `kind` (what the outcome records: shutdown, deadline, timeout, midstream), a message fit for
the client, and the error code. An empty read (the engine closed the stream) is a `midstream` end; whether the
stream was complete by then is the relay's to say (it checks first).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

import aiohttp

log = logging.getLogger("fleetgate.gateway.upstream")


@dataclass(frozen=True, slots=True)
class StreamEnd:
    kind: str
    message: str
    code: str


class StreamReads:
    def __init__(self, response: aiohttp.ClientResponse, *, endpoint_id: str, first_byte_timeout_s: float,
                 inter_chunk_timeout_s: float, deadline: float | None = None) -> None:
        self._resp = response
        self._endpoint_id = endpoint_id
        self._first_timeout = first_byte_timeout_s
        self._inter_timeout = inter_chunk_timeout_s
        self._deadline = deadline  # loop time by which the whole stream must end
        self.interrupted: str | None = None
        self._timer: asyncio.Timeout | None = None  # the running read's timeout, rescheduled by `interrupt`

    def interrupt(self, message: str) -> None:
        if self.interrupted is None:
            self.interrupted = message
        if self._timer is not None:
            self._timer.reschedule(asyncio.get_running_loop().time())

    def shutdown(self) -> StreamEnd | None:
        """The end to report before reading, when the gateway is shutting down."""
        return StreamEnd("shutdown", self.interrupted, "server_shutting_down") if self.interrupted else None

    async def read(self, *, started: bool) -> bytes | StreamEnd:
        timeout = self._inter_timeout if started else self._first_timeout
        loop = asyncio.get_running_loop()
        when = loop.time() + timeout
        if self._deadline is not None:
            when = min(when, self._deadline)
        try:
            async with asyncio.timeout_at(when) as self._timer:
                data = await self._resp.content.readany()
        except TimeoutError:
            if self.interrupted is not None:
                return StreamEnd("shutdown", self.interrupted, "server_shutting_down")
            if self._deadline is not None and loop.time() >= self._deadline:
                return StreamEnd("deadline", "the stream reached the gateway's deadline for a whole stream",
                                 "stream_deadline")
            return StreamEnd("timeout", f"the engine sent nothing for {timeout:g}s", "upstream_timeout")
        except aiohttp.ClientError as exc:
            log.warning("engine stream broke off", extra={"endpoint": self._endpoint_id, "error": repr(exc)})
            return StreamEnd("midstream", "the engine broke off the stream", "upstream_error")
        finally:
            self._timer = None
        if not data:
            return StreamEnd("midstream", "the engine closed the stream before it finished", "upstream_error")
        return data
