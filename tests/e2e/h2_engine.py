"""A minimal HTTP/2 (h2c) engine whose answers end with trailers, for the proxy's trailers path.

vLLM speaks HTTP/1.1, but a proxy that talks HTTP/2 to its upstream (a mesh, a gateway's own hop) passes an
upstream's trailers on, and then the response body ends without `end_of_stream`: the trailers end it. It
answers every POST with one chat completion streamed as SSE (`TEXT`, then a usage chunk and `[DONE]`), then
the trailers `x-engine-done: 1`; it records what it received. Loopback only; `stop` closes it.
"""

from __future__ import annotations

import asyncio
import contextlib

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import orjson

TEXT = ["hel", "lo"]


def sse(model: str, prompt_tokens: int) -> bytes:
    def chunk(delta: dict[str, str], finish: str | None = None, usage: dict[str, int] | None = None) -> bytes:
        body = {"id": "h2", "object": "chat.completion.chunk", "created": 1, "model": model,
                "choices": [] if usage else [{"index": 0, "delta": delta, "finish_reason": finish}]}
        if usage:
            body["usage"] = usage
        return b"data: " + orjson.dumps(body) + b"\n\n"

    out = chunk({"role": "assistant", "content": TEXT[0]}) + chunk({"content": TEXT[1]}, "stop")
    out += chunk({}, usage={"prompt_tokens": prompt_tokens, "completion_tokens": len(TEXT),
                            "total_tokens": prompt_tokens + len(TEXT)})
    return out + b"data: [DONE]\n\n"


class H2Engine:
    def __init__(self, *, model: str = "m1", prompt_tokens: int = 3) -> None:
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.received: list[bytes] = []
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> H2Engine:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False, header_encoding="utf-8"))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        bodies: dict[int, bytearray] = {}
        paths: dict[int, str] = {}
        try:
            while data := await asyncio.wait_for(reader.read(65_536), 30):
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.RequestReceived):
                        bodies[event.stream_id] = bytearray()
                        paths[event.stream_id] = dict(event.headers).get(":path", "")
                    elif isinstance(event, h2.events.DataReceived):
                        bodies.setdefault(event.stream_id, bytearray()).extend(event.data)
                        conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                    elif isinstance(event, h2.events.StreamEnded):
                        self._answer(conn, event.stream_id, paths.pop(event.stream_id, ""),
                                     bytes(bodies.pop(event.stream_id, b"")))
                writer.write(conn.data_to_send())
                await writer.drain()
        except (TimeoutError, ConnectionError, h2.exceptions.ProtocolError):  # idle, gone, or an HTTP/1 poll
            pass
        finally:
            writer.close()

    def _answer(self, conn: h2.connection.H2Connection, stream_id: int, path: str, body: bytes) -> None:
        if path in ("/health", "/metrics"):  # the scraper's polls: nothing to report
            conn.send_headers(stream_id, [(":status", "200"), ("content-length", "0")], end_stream=True)
            return
        self.received.append(body)
        conn.send_headers(stream_id, [(":status", "200"), ("content-type", "text/event-stream")])
        conn.send_data(stream_id, sse(self.model, self.prompt_tokens))
        conn.send_headers(stream_id, [("x-engine-done", "1")], end_stream=True)
