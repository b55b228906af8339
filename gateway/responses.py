"""The ASGI response that relays a `ClientStream` to the client and notices when the client leaves.

A watcher task waits for `http.disconnect`; when it comes first it cancels the sending task, so a
client that leaves during a long prefill frees the engine at once rather than at the next chunk.
The stream's `close()` runs exactly once, however the response ends.
"""

from __future__ import annotations

import asyncio

from starlette.types import Receive, Scope, Send

from fleetgate.gateway.context import ClientStream


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
        task = asyncio.current_task()
        assert task is not None
        left = asyncio.Event()
        sent_all = False

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    if not sent_all:  # servers also report a disconnect once the response is complete
                        left.set()
                        task.cancel()
                    return

        watcher = asyncio.ensure_future(watch())
        finished = False
        try:
            await send({"type": "http.response.start", "status": self.status, "headers": self.raw_headers})
            async for chunk in self.stream:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            finished = True
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            sent_all = True
        except asyncio.CancelledError:
            if not left.is_set():
                raise
            task.uncancel()
        except OSError:  # the transport broke while sending
            pass
        finally:
            watcher.cancel()
            self.stream.close(cancelled=not finished)
