"""The SSE relay over arbitrary network reads: events split across reads, several per read, CRLF."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from fleetgate.gateway.assembly import StreamAssembler
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
