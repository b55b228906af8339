"""Streams assembled into complete responses, and complete responses replayed as streams."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from fleetgate.gateway.assembly import StreamAssembler
from fleetgate.gateway.replay import replay_chunks

USAGE = {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}


def chat_response(content: str = "Hello world", finish: str = "stop") -> dict[str, Any]:
    return {"id": "chatcmpl-1", "object": "chat.completion", "created": 5, "model": "m",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "logprobs": None, "finish_reason": finish}], "usage": USAGE}


def parse(events: list[bytes]) -> list[Any]:
    assert events[-1] == b"data: [DONE]\n\n"
    out = []
    for e in events[:-1]:
        assert e.startswith(b"data: ") and e.endswith(b"\n\n")
        out.append(orjson.loads(e[6:]))
    return out


@pytest.mark.parametrize("include_usage", [False, True])
def test_chat_replay_has_the_engine_chunk_shape(include_usage: bool) -> None:
    chunks = parse(replay_chunks(chat_response(), include_usage=include_usage))
    content = [c for c in chunks if c["choices"]]
    assert [c["object"] for c in content] == ["chat.completion.chunk"] * 3
    assert content[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert content[1]["choices"][0]["delta"]["content"] == "Hello world"
    assert content[2]["choices"][0]["finish_reason"] == "stop"
    assert all(c["id"] == "chatcmpl-1" and c["model"] == "m" for c in chunks)
    if include_usage:
        assert all(c["usage"] is None for c in content)
        assert chunks[-1] == {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 5, "model": "m",
                              "choices": [], "usage": USAGE}
    else:
        assert all("usage" not in c for c in chunks)


def test_replay_then_assemble_round_trips_chat_and_completions() -> None:
    for response in (chat_response(),
                     {"id": "cmpl-1", "object": "text_completion", "created": 5, "model": "m",
                      "choices": [{"index": 0, "text": "abc", "logprobs": None, "finish_reason": "length"}],
                      "usage": USAGE}):
        kind = "chat" if response["object"] == "chat.completion" else "completions"
        assembler = StreamAssembler(kind)  # type: ignore[arg-type]
        for chunk in parse(replay_chunks(response, include_usage=True)):
            assembler.add(chunk)
        assert assembler.result(usage=USAGE) == response


def test_assembles_deltas_per_choice_index() -> None:
    a = StreamAssembler("chat")
    base = {"id": "x", "created": 1, "model": "m", "object": "chat.completion.chunk"}
    a.add({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}},
                               {"index": 1, "delta": {"role": "assistant", "content": ""}}]})
    a.add({**base, "choices": [{"index": 1, "delta": {"content": "B1"}}]})
    a.add({**base, "choices": [{"index": 0, "delta": {"content": "A1"}}]})
    a.add({**base, "choices": [{"index": 0, "delta": {"content": "A2"}, "finish_reason": "stop"},
                               {"index": 1, "delta": {}, "finish_reason": "length"}]})
    result = a.result(usage=None)
    assert result is not None
    assert [(c["message"]["content"], c["finish_reason"]) for c in result["choices"]] == [("A1A2", "stop"),
                                                                                         ("B1", "length")]


@pytest.mark.parametrize(
    "choice",
    [
        {"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"name": "f"}}]}},
        {"index": 0, "delta": {"content": "x"}, "logprobs": {"content": []}},
    ],
)
def test_tool_calls_and_logprobs_are_not_assembled(choice: dict[str, Any]) -> None:
    a = StreamAssembler("chat")
    a.add({"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hi"}}]})
    a.add({"id": "x", "choices": [choice]})
    assert a.result(usage=None) is None


def test_nothing_streamed_gives_nothing_to_cache() -> None:
    assert StreamAssembler("completions").result(usage=USAGE) is None
