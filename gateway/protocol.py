"""uvicorn's httptools protocol with a header deadline and OpenAI-shaped parser errors.

uvicorn bounds idle keep-alive connections but not a client that opens a connection and sends its
request line and headers slowly (slowloris): such connections were held for as long as the client
liked. `GuardedHttpProtocol` arms a timer when a connection opens and when a new request begins, and
closes the connection with a 408 if the headers are not complete within `header_timeout_s`. (The body
has its own deadline in the ASGI handler, `fastpath.read_body`.) A request the HTTP parser rejects is
answered with an OpenAI-shaped JSON 400 instead of uvicorn's plain text.

This subclasses uvicorn internals (`HttpToolsProtocol`: `connection_made`, `on_message_begin`,
`on_headers_complete`, `send_400_response`); the uvicorn version is pinned by a test of this module's
behaviour (`tests/component/test_hostile_input.py`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


def _json_answer(status: int, reason: str, message: str, code: str) -> bytes:
    body = orjson.dumps({"error": {"message": message, "type": "invalid_request_error", "param": None,
                                   "code": code}})
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


class GuardedHttpProtocol(HttpToolsProtocol):
    header_timeout_s: float = 10.0  # set per server by `guarded_protocol`

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        if self._header_timer is None:
            self._header_timer = self.loop.call_later(self.header_timeout_s, self._headers_too_slow)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        if not self.transport.is_closing():
            message = f"request headers not received within {self.header_timeout_s:g} s"
            self.transport.write(_json_answer(408, "Request Timeout", message, "request_timeout"))
            self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        busy = self.cycle is not None and not self.cycle.response_complete
        super().on_message_begin()
        if not busy:  # a request pipelined behind a running response: a 408 must not cut into that response
            self._arm()

    def on_headers_complete(self) -> None:
        self._disarm()
        super().on_headers_complete()

    def send_400_response(self, msg: str) -> None:
        self._disarm()
        self.transport.write(_json_answer(400, "Bad Request", f"malformed HTTP request: {msg}", "invalid_http"))
        self.transport.close()


def guarded_protocol(*, header_timeout_s: float) -> type[GuardedHttpProtocol]:
    """A protocol class for one server's settings (uvicorn instantiates the class per connection)."""
    return type("GuardedHttpProtocol", (GuardedHttpProtocol,), {"header_timeout_s": header_timeout_s})
