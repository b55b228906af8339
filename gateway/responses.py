"""Sending a `ClientStream` to the client, and noticing when the client leaves.

`ClientWatch` is a task waiting for `http.disconnect`; when it comes before the response is complete
it cancels the request's task, so a client that leaves during a long prefill (or a long non-streaming
generation) frees the engine at once rather than at the next chunk. One watch serves a request from
the end of its body to the end of its response. The stream's `close()` runs exactly once, however
the response ends.
"""

from __future__ import annotations

import asyncio

from starlette.types import Receive, Scope, Send

from fleetgate.gateway.context import ClientStream


class ClientWatch:
    """Cancels the current task when the client disconnects, until `done()`."""

    def __init__(self, receive: Receive) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._task = task
        self._complete = False
        self.left = False
        self._watcher: asyncio.Task[None] | None = asyncio.ensure_future(self._watch(receive))

    async def _watch(self, receive: Receive) -> None:
        while (await receive())["type"] != "http.disconnect":
            pass
        if not self._complete:  # servers also report a disconnect once the response is complete
            self.left = True
            self._task.cancel()

    def complete(self) -> None:
        """The last byte is being sent: a disconnect from now on is the normal end."""
        self._complete = True

    def absorb(self) -> bool:
        """Inside `except CancelledError`: True, with the cancellation undone, when the client caused it."""
        if not self.left:
            return False
        self._task.uncancel()
        return True

    def stop(self) -> None:
        self._complete = True
        if self._watcher is not None:
            self._watcher.cancel()
            # The cancelled task keeps its CancelledError, whose traceback holds `_watch`'s frame and so this
            # watch: keeping the task here too would make a reference cycle through the request's task, its
            # context and its engine response, which only the cyclic GC frees (measured under streaming load:
            # every request's ~75 objects, and a full collection of that garbage stopped the loop ~120 ms).
            self._watcher = None


class StreamResponse:
    def __init__(self, stream: ClientStream, *, status: int, headers: dict[str, str], media_type: str) -> None:
        self.stream = stream
        self.status = status
        self.raw_headers = [
            (b"content-type", media_type.encode()),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),  # proxies (nginx) must not buffer the stream
            *((k.encode("latin-1"), v.encode("latin-1")) for k, v in headers.items()),
        ]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = ClientWatch(receive)
        try:
            await self.relay(send, watch)
        finally:
            watch.stop()

    async def relay(self, send: Send, watch: ClientWatch) -> None:
        finished = False
        try:
            await send({"type": "http.response.start", "status": self.status, "headers": self.raw_headers})
            async for chunk in self.stream:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            finished = True
            watch.complete()
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except asyncio.CancelledError:
            if not watch.absorb():
                raise
        except OSError:  # the transport broke while sending
            pass
        finally:
            self.stream.close(cancelled=not finished)
