"""What is left of an engine stream once its client is gone, or once the gateway ended it at its deadline: read,
never relayed, so the tenant is charged what the engine counted. Shared by both relays (`streaming.RelayStream`
for chat and completions, `event_relay.EventRelay` for the Responses and Messages APIs); each hands over its own
way of counting what arrives (`count(data) -> True` once nothing more is worth reading).

Why not hang up at once: vLLM counts a token when its engine step's output is processed, a moment before it
writes the chunk, and hangs up on an abort without sending what it counted but did not write, so hanging up at
an arbitrary moment loses those tokens to the tenant's charge. `EngineDrain.run` either

- drains (`cancel_drain_s`): takes in what already arrived, waits for the engine's next chunk (right after a
  write, nothing counted is pending) and what came with it, half-closes the connection (the engine sees the
  client leave and aborts; servers flush what they wrote before closing) and reads everything up to the
  engine's close, at most `drain_s`, then hangs up anyway. Costs the engine at most one more token. A gateway
  too busy to read that chunk within an engine step can still miss a token: on an H100 (~8 ms steps) 15 of
  629,503 generated tokens over 180 cancellations went uncharged that way; or
- finishes (`cancel_finish_tokens`, a client that left with few reserved tokens to come, `finishes`): reads the
  stream to its natural end without half-closing, so nothing is aborted and the charge is exactly the engine's
  count. Each read waits at most the inter-chunk timeout and all of them end by the stream's deadline (an
  engine that stalls is dropped, as during a relay); an engine that goes past its reservation is dropped there
  (it is charged no more than the cap anyway).

A stream the gateway ended at its deadline is drained, never finished (its time is up). `wanted` says when a
relay's `close()` drains rather than hangs up: output had begun (before it, nothing is counted-but-unwritten)
and the client left mid-stream, or the gateway ended the stream at its deadline while the engine generated.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp

from fleetgate.gateway.sse import StreamOutcome


async def buffered(response: aiohttp.ClientResponse) -> bytes:
    """Every byte that has arrived from the engine by now, without waiting for more (one event-loop turn first,
    so bytes already in the socket reach the reader)."""
    await asyncio.sleep(0)
    return response.content.read_nowait()


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineDrain:
    drain_s: float  # `server.cancel_drain_s`: the longest drain (0: hang up at once)
    finish_tokens: int  # `server.cancel_finish_tokens`: finish when at most this many reserved tokens are to come
    inter_chunk_s: float  # the longest wait for one read while finishing
    deadline: float | None  # loop time by which the stream must end (finishing stops there too)

    def wanted(self, out: StreamOutcome, *, ended: bool, cancelled: bool) -> bool:
        """`close()` drains instead of hanging up (see the module doc)."""
        return bool(out.output_chunks) and self.drain_s > 0 and (
            (cancelled and not ended) or out.error_kind == "deadline")

    def finishes(self, to_come: int | None) -> bool:
        """A client that left with this many reserved completion tokens still to come lets the engine finish."""
        return to_come is not None and 0 <= to_come <= self.finish_tokens

    async def run(self, response: aiohttp.ClientResponse, count: Callable[[bytes], bool], *, finish: bool) -> None:
        """Read what is left (`finish`: to the stream's natural end; else the drain), each read handed to `count`;
        what was read is counted whatever ends it. The connection is closed after."""
        content = response.content
        try:
            if finish:
                await self._read_to_end(response, count)
                return
            async with asyncio.timeout(self.drain_s):
                over = count(await buffered(response))
                data = b"" if over else await content.readany()
                if data:
                    data += await buffered(response)
                over = over or count(data)
                connection = response.connection
                transport = connection.transport if connection is not None else None
                if data and transport is not None and transport.can_write_eof():
                    transport.write_eof()
                while data and not over:
                    data = await content.readany()
                    over = count(data)
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            # What was read is counted; the rest is the engine's to drop. The response's reader keeps a broken
            # connection's error, whose traceback holds this frame and so the response: a reference cycle for
            # the cyclic GC unless the traceback goes.
            exc.__traceback__ = None
        finally:
            response.close()

    async def _read_to_end(self, response: aiohttp.ClientResponse, count: Callable[[bytes], bool]) -> None:
        content = response.content
        loop = asyncio.get_running_loop()
        deadline = self.deadline if self.deadline is not None else loop.time() + self.drain_s
        async with asyncio.timeout_at(deadline):
            while True:
                async with asyncio.timeout(self.inter_chunk_s):
                    data = await content.readany()
                if not data or count(data):
                    return
