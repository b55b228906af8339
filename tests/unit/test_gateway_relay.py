"""The SSE relay over arbitrary network reads: events split across reads, several per read, CRLF."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import orjson
import pytest

from fleetgate.core.types import Usage
from fleetgate.gateway.assembly import StreamAssembler
from fleetgate.gateway.collect import charged_usage
from fleetgate.gateway.streaming import RelayStream, StreamOutcome


class FakeContent:
    def __init__(self, reads: list[bytes]) -> None:
        self.reads = list(reads)

    async def readany(self) -> bytes:
        return self.reads.pop(0) if self.reads else b""


class FakeResponse:
    def __init__(self, reads: list[bytes]) -> None:
        self.content = FakeContent(reads)
        self.released = self.closed = False

    def release(self) -> None:
        self.released = True

    def close(self) -> None:
        self.closed = True


def event(i: int, *, usage: bool = True, sep: bytes = b"\n\n") -> bytes:
    chunk: dict[str, Any] = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": "engine-name",
                             "choices": [{"index": 0, "delta": {"content": f"w{i} "}, "finish_reason": None}]}
    if usage:
        chunk["usage"] = {"prompt_tokens": 5, "completion_tokens": i + 1, "total_tokens": 6 + i}
    return b"data: " + orjson.dumps(chunk) + sep


async def relay(reads: list[bytes], **kw: Any) -> tuple[list[bytes], StreamOutcome, FakeResponse]:
    response = FakeResponse(reads)
    outcomes: list[StreamOutcome] = []
    options = {"include_usage": False, "continuous_usage": False, "model_name": "public", "assembler": None, **kw}
    stream = RelayStream(response=response, endpoint_id="e:1", first_byte_timeout_s=5, inter_chunk_timeout_s=5,
                         on_done=outcomes.append, **options)  # type: ignore[arg-type]
    out = [part async for part in stream]
    stream.close()
    stream.close()  # idempotent
    assert len(outcomes) == 1
    return out, outcomes[0], response


def events_of(out: list[bytes]) -> list[Any]:
    text = b"".join(out).decode()
    return [e[6:] if e[6:] == "[DONE]" else orjson.loads(e[6:]) for e in text.split("\n\n") if e]


async def test_events_split_across_reads_and_batched_in_one_read() -> None:
    whole = event(0) + event(1) + event(2) + b"data: [DONE]\n\n"
    reads = [whole[:10], whole[10:150], whole[150:]]  # cuts inside events; the last read holds two events
    out, outcome, response = await relay(reads, assembler=StreamAssembler("chat"))
    events = events_of(out)
    assert [e["choices"][0]["delta"]["content"] for e in events[:-1]] == ["w0 ", "w1 ", "w2 "]
    assert events[-1] == "[DONE]"
    assert all(e["model"] == "public" and "usage" not in e for e in events[:-1])
    assert len(out) < 4  # whatever arrived together went out together
    assert outcome.ok and not outcome.cancelled and outcome.usage == {"prompt_tokens": 5, "completion_tokens": 3,
                                                                      "total_tokens": 8}
    assert outcome.assembled is not None and outcome.assembled["choices"][0]["message"]["content"] == "w0 w1 w2 "
    assert response.released and not response.closed


async def test_crlf_comments_and_event_lines_are_handled() -> None:
    reads = [b": keep-alive\r\n\r\n", b"event: message\r\n" + event(0, sep=b"\r\n\r\n"), b"data: [DONE]\r\n\r\n"]
    out, outcome, _ = await relay(reads)
    assert [e if e == "[DONE]" else e["choices"][0]["delta"]["content"] for e in events_of(out)] == ["w0 ", "[DONE]"]
    assert outcome.ok


@pytest.mark.parametrize("continuous", [False, True])
async def test_usage_for_clients_that_ask(continuous: bool) -> None:
    final = b'data: {"id":"c","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
    out, _, _ = await relay([event(0) + event(1) + final + b"data: [DONE]\n\n"], include_usage=True,
                            continuous_usage=continuous)
    events = events_of(out)
    if continuous:
        assert [e["usage"]["completion_tokens"] for e in events[:-1]] == [1, 2, 2]
    else:
        assert [e["usage"] for e in events[:2]] == [None, None]
        assert events[2]["usage"]["completion_tokens"] == 2 and events[2]["choices"] == []


async def test_end_without_done_is_an_error_event_and_closes_the_connection() -> None:
    out, outcome, response = await relay([event(0)])
    events = events_of(out)
    assert events[-2]["error"]["code"] == "upstream_error" and events[-1] == "[DONE]"
    assert not outcome.ok and outcome.error_kind == "midstream" and outcome.usage is not None
    assert response.closed


async def test_engine_error_event_is_relayed_and_marks_failure() -> None:
    error = b'data: {"error": {"message": "boom", "type": "InternalServerError", "code": 500}}\n\n'
    out, outcome, _ = await relay([event(0) + error + b"data: [DONE]\n\n"], assembler=StreamAssembler("chat"))
    assert events_of(out)[1]["error"]["message"] == "boom"
    assert not outcome.ok and outcome.error_kind == "engine_error" and outcome.assembled is None


async def test_an_engine_streaming_past_the_completion_cap_is_cut_off_there() -> None:
    """Issue 26, defect 4: an engine that keeps streaming past `max_tokens` was relayed as long as it liked."""
    out, outcome, response = await relay([b"".join(event(i) for i in range(40)) + b"data: [DONE]\n\n"],
                                         completion_cap=5)
    events = events_of(out)
    assert len([e for e in events if isinstance(e, dict) and e.get("choices")]) == 5
    assert events[-2]["error"]["code"] == "max_tokens_exceeded" and events[-1] == "[DONE]"
    assert outcome.error_kind == "overrun" and not outcome.ok and response.closed  # the engine is aborted
    assert outcome.usage is not None and outcome.usage["completion_tokens"] >= 5


async def test_without_usage_each_output_chunk_counts_toward_the_cap() -> None:
    out, outcome, _ = await relay([b"".join(event(i, usage=False) for i in range(9)) + b"data: [DONE]\n\n"],
                                  completion_cap=3)
    assert outcome.error_kind == "overrun"
    assert len([e for e in events_of(out) if isinstance(e, dict) and e.get("choices")]) == 3
    assert events_of(out)[-2]["error"]["code"] == "max_tokens_exceeded"
    # what the engine sent and the gateway received is counted, but never charged beyond the cap
    assert outcome.output_chunks == 9 and charged_usage(outcome, prompt_estimate=4, completion_cap=3) == Usage(
        prompt_tokens=4, completion_tokens=3)


class StallingContent:
    """Sends `first`, then nothing, ever (an engine that holds the stream open)."""

    def __init__(self, first: bytes) -> None:
        self.first: bytes | None = first

    async def readany(self) -> bytes:
        if self.first is not None:
            data, self.first = self.first, None
            return data
        await asyncio.Event().wait()
        return b""


def stalling(**kw: Any) -> tuple[RelayStream, list[StreamOutcome]]:
    response = FakeResponse([])
    response.content = StallingContent(event(0) + event(1))  # type: ignore[assignment]
    outcomes: list[StreamOutcome] = []
    stream = RelayStream(response=response, endpoint_id="e:1", first_byte_timeout_s=60, inter_chunk_timeout_s=60,
                         include_usage=False, continuous_usage=False, model_name=None, assembler=None,
                         on_done=outcomes.append, **kw)  # type: ignore[arg-type]
    return stream, outcomes


async def test_a_stream_ends_at_its_total_deadline() -> None:
    stream, outcomes = stalling(deadline=asyncio.get_running_loop().time() + 0.2)
    started = time.monotonic()
    out = [part async for part in stream]
    stream.close()
    assert 0.15 < time.monotonic() - started < 2  # not the 60 s inter-chunk timeout
    assert events_of(out)[-2]["error"]["code"] == "stream_deadline"
    assert outcomes[0].error_kind == "deadline" and outcomes[0].usage["completion_tokens"] == 2  # type: ignore[index]


async def test_interrupt_ends_a_stream_waiting_on_a_silent_engine_at_once() -> None:
    stream, outcomes = stalling()
    first = await stream.__anext__()
    assert b"w1" in first
    pending = asyncio.ensure_future(stream.__anext__())
    await asyncio.sleep(0.05)
    assert not pending.done()  # waiting on the engine
    stream.interrupt("the gateway is shutting down")
    end = await asyncio.wait_for(pending, 1)
    assert b"server_shutting_down" in end and end.endswith(b"data: [DONE]\n\n")
    with pytest.raises(StopAsyncIteration):
        await stream.__anext__()
    stream.close()
    assert outcomes[0].error_kind == "shutdown" and outcomes[0].usage["completion_tokens"] == 2  # type: ignore[index]
