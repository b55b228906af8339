"""The stream's read timeouts, kept by one timer per stream (`stream_reads.StreamReads`): each read still ends
exactly at its own first-byte / inter-chunk timeout or the stream's deadline, on asyncio's loop and uvloop's."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any

import pytest
import uvloop

from fleetgate.gateway.stream_reads import StreamEnd, StreamReads


class PacedContent:
    """`count` reads `gap_s` apart, then silence (an engine holding the stream open)."""

    def __init__(self, count: int, gap_s: float) -> None:
        self.left = count
        self.gap_s = gap_s

    async def readany(self) -> bytes:
        if self.left <= 0:
            await asyncio.Event().wait()
        self.left -= 1
        await asyncio.sleep(self.gap_s)
        return b"data: x\n\n"


class Response:
    def __init__(self, content: PacedContent) -> None:
        self.content = content


def reads(count: int, gap_s: float, **kw: Any) -> StreamReads:
    options: dict[str, Any] = {"first_byte_timeout_s": 5.0, "inter_chunk_timeout_s": 0.15, **kw}
    return StreamReads(Response(PacedContent(count, gap_s)), endpoint_id="e:1", **options)  # type: ignore[arg-type]


Run = Callable[[Coroutine[Any, Any, Any]], Any]
LOOPS: dict[str, Run] = {"asyncio": asyncio.run, "uvloop": uvloop.run}


async def read_all(r: StreamReads) -> tuple[int, StreamEnd, float]:
    """(reads that returned bytes, the end, seconds from the last bytes to the end); a read that never ends
    fails the test."""
    return await asyncio.wait_for(_read_all(r), 10)


async def _read_all(r: StreamReads) -> tuple[int, StreamEnd, float]:
    got = 0
    last = time.monotonic()
    while True:
        data = await r.read(started=got > 0)
        if isinstance(data, StreamEnd):
            r.close()
            return got, data, time.monotonic() - last
        got += 1
        last = time.monotonic()


@pytest.mark.parametrize("loop", LOOPS)
def test_a_stream_longer_than_its_inter_chunk_timeout_is_read_whole_then_times_out_on_silence(loop: str) -> None:
    # 12 reads 40 ms apart: 0.5 s in all, over three times the 0.15 s inter-chunk timeout
    got, end, silent = LOOPS[loop](read_all(reads(12, 0.04)))
    assert got == 12
    assert end.kind == "timeout" and end.code == "upstream_timeout"
    assert 0.13 < silent < 0.6  # the inter-chunk timeout after the last bytes, not the 5 s first-byte one


@pytest.mark.parametrize("loop", LOOPS)
def test_a_first_byte_timeout_longer_than_the_inter_chunk_one_does_not_delay_the_later_timeout(loop: str) -> None:
    got, end, silent = LOOPS[loop](read_all(reads(1, 0.0, first_byte_timeout_s=30.0)))
    assert got == 1 and end.kind == "timeout" and 0.13 < silent < 0.6


@pytest.mark.parametrize("loop", LOOPS)
def test_the_first_byte_timeout_ends_a_silent_engine(loop: str) -> None:
    got, end, silent = LOOPS[loop](read_all(reads(0, 0.0, first_byte_timeout_s=0.1, inter_chunk_timeout_s=30.0)))
    assert got == 0 and end.kind == "timeout" and "0.1s" in end.message and 0.08 < silent < 0.6


@pytest.mark.parametrize("loop", LOOPS)
def test_the_deadline_ends_a_stream_still_sending(loop: str) -> None:
    async def run() -> tuple[int, StreamEnd, float]:
        deadline = asyncio.get_running_loop().time() + 0.3
        return await read_all(reads(1000, 0.02, inter_chunk_timeout_s=30.0, deadline=deadline))

    started = time.monotonic()
    got, end, _ = LOOPS[loop](run())
    assert end.kind == "deadline" and end.code == "stream_deadline"
    assert 5 <= got < 20 and time.monotonic() - started < 2


@pytest.mark.parametrize("loop", LOOPS)
def test_a_cancellation_from_elsewhere_is_not_taken_for_a_timeout(loop: str) -> None:
    """The client leaving (the web layer cancels the request's task) or an outer timeout (`collect.read_to_end`)
    while a read waits: the cancellation goes on up; the stream's timer does not swallow it, then or later."""

    async def run() -> None:
        r = reads(1, 0.0, inter_chunk_timeout_s=0.05)
        assert await r.read(started=False) == b"data: x\n\n"
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.02):
                await r.read(started=True)
        task = asyncio.ensure_future(r.read(started=True))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.1)  # past the inter-chunk timeout: the timer fires with nothing waiting
        end = await r.read(started=True)  # and a later read still gets its own timeout
        assert isinstance(end, StreamEnd) and end.kind == "timeout"
        current = asyncio.current_task()
        assert current is not None and current.cancelling() == 0
        r.close()

    LOOPS[loop](run())


@pytest.mark.parametrize("loop", LOOPS)
def test_interrupt_ends_the_waiting_read_at_once(loop: str) -> None:
    async def run() -> StreamEnd | bytes:
        r = reads(0, 0.0, first_byte_timeout_s=30.0)
        pending = asyncio.ensure_future(r.read(started=False))
        await asyncio.sleep(0.02)
        r.interrupt("the gateway is shutting down")
        return await asyncio.wait_for(pending, 1)

    end = LOOPS[loop](run())
    assert isinstance(end, StreamEnd) and end.kind == "shutdown" and end.message == "the gateway is shutting down"
