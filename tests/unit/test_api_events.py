"""The Responses and Messages event streams: relayed over any split of network reads, assembled, charged, cut off,
and a cached answer replayed so that the rewriter reads it back as the same answer.

The engine streams below are written in vLLM 0.32's shapes (`vllm/entrypoints/openai/responses/serving.py`,
`vllm/entrypoints/anthropic/serving.py`), field orders included.
"""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from fleetgate.gateway.api_events import DELTA_SLACK, ApiEvents, charged_events
from fleetgate.gateway.api_messages_events import MessagesEvents, messages_usage
from fleetgate.gateway.api_messages_events import replay_events as replay_message
from fleetgate.gateway.api_responses_events import ResponsesEvents, responses_usage
from fleetgate.gateway.api_responses_events import replay_events as replay_response
from fleetgate.gateway.event_relay import EventRelay, SseParser
from fleetgate.gateway.streaming import StreamOutcome

from .test_gateway_relay import FakeResponse


def sse(kind: str, obj: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(obj) + b"\n\n"


def responses_stream(words: list[str], *, usage: Any = None, model: str = "engine-name") -> list[bytes]:
    usage = usage if usage is not None else {
        "input_tokens": 14, "input_tokens_details": {"cache_write_tokens": 0, "cached_tokens": 4},
        "output_tokens": len(words), "output_tokens_details": {"reasoning_tokens": 2}, "total_tokens": 14 + len(words)}
    base = {"id": "resp_1", "object": "response", "model": model, "previous_response_id": None, "usage": None}
    text = "".join(words)
    item = {"id": "msg_1", "content": [{"annotations": [], "text": text, "type": "output_text", "logprobs": None}],
            "role": "assistant", "status": "completed", "type": "message"}
    out = [sse("response.created", {"response": {**base, "status": "in_progress", "output": []},
                                    "sequence_number": 0, "type": "response.created"}),
           sse("response.in_progress", {"response": {**base, "status": "in_progress", "output": []},
                                        "sequence_number": 1, "type": "response.in_progress"})]
    out += [sse("response.output_text.delta", {"content_index": 0, "delta": w, "item_id": "msg_1", "logprobs": [],
                                               "output_index": 0, "sequence_number": 2 + i,
                                               "type": "response.output_text.delta"}) for i, w in enumerate(words)]
    out.append(sse("response.completed", {"response": {**base, "status": "completed", "output": [item], "usage": usage},
                                          "sequence_number": 2 + len(words), "type": "response.completed"}))
    return out


def messages_stream(words: list[str], *, tool: bool = False, final: Any = None) -> list[bytes]:
    start = {"id": "chatcmpl-1", "type": "message", "role": "assistant", "content": [], "model": "engine-name",
             "stop_reason": None, "stop_sequence": None,
             "usage": {"input_tokens": 9, "output_tokens": 0, "cache_read_input_tokens": 3}}
    out = [sse("message_start", {"type": "message_start", "message": start}),
           sse("content_block_start", {"type": "content_block_start", "content_block": {"type": "text", "text": ""},
                                       "index": 0})]
    out += [sse("content_block_delta", {"type": "content_block_delta", "delta": {"type": "text_delta", "text": w},
                                        "index": 0}) for w in words]
    out.append(sse("content_block_stop", {"type": "content_block_stop", "index": 0}))
    if tool:
        out.append(sse("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {
            "type": "tool_use", "id": "call_1", "name": "lookup", "input": {}}}))
        for piece in ('{"city": ', '"Paris"}'):
            out.append(sse("content_block_delta", {"type": "content_block_delta", "index": 1,
                                                   "delta": {"type": "input_json_delta", "partial_json": piece}}))
        out.append(sse("content_block_stop", {"type": "content_block_stop", "index": 1}))
    usage = final if final is not None else {"input_tokens": 9, "output_tokens": len(words) + 2 * tool,
                                             "cache_read_input_tokens": 3}
    out.append(sse("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use" if tool else
                                                                         "end_turn", "stop_sequence": None},
                                     "usage": usage}))
    out.append(sse("message_stop", {"type": "message_stop"}))
    return out


def splits(stream: list[bytes]) -> list[list[bytes]]:
    """The same bytes as events, as one read, and cut every 7 bytes (events split anywhere)."""
    whole = b"".join(stream)
    return [stream, [whole], [whole[i:i + 7] for i in range(0, len(whole), 7)]]


async def run(reads: list[bytes], rw: ApiEvents, *, completed: list[StreamOutcome] | None = None
              ) -> tuple[bytes, StreamOutcome, FakeResponse]:
    response = FakeResponse(reads)
    outcomes: list[StreamOutcome] = []

    async def on_complete(out: StreamOutcome) -> None:
        if completed is not None:
            completed.append(out)

    relay = EventRelay(response=response, rewriter=rw, endpoint_id="e:1", first_byte_timeout_s=5,  # type: ignore[arg-type]
                       inter_chunk_timeout_s=5, on_done=outcomes.append, on_complete=on_complete)
    out = b"".join([part async for part in relay])
    relay.close()
    relay.close()  # idempotent
    assert len(outcomes) == 1
    return out, outcomes[0], response


def events(raw: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    return [(name, orjson.loads(data)) for name, data in SseParser().feed(raw)]


@pytest.mark.parametrize("split", range(3))
async def test_a_responses_stream_is_relayed_with_the_served_name_and_charged_its_usage(split: int) -> None:
    reads = splits(responses_stream(["The", " capital", " is", " Paris."]))[split]
    completed: list[StreamOutcome] = []
    rw = ResponsesEvents(endpoint_id="e:1", cap=16, collect=False, model_name="public", previous_response_id="resp_0")
    out, outcome, response = await run(reads, rw, completed=completed)
    got = events(out)
    assert [name for name, _ in got] == ["response.created", "response.in_progress",
                                         *["response.output_text.delta"] * 4, "response.completed"]
    assert all(e["response"]["model"] == "public" and e["response"]["previous_response_id"] == "resp_0"
               for _, e in got if "response" in e)
    assert outcome.ok and outcome.output_chunks == 4 and response.released and not response.closed
    assert outcome.assembled is not None
    assert outcome.assembled["output"][0]["content"][0]["text"] == "The capital is Paris."
    assert completed == [outcome]  # the store hook ran before the last event went out
    charged = charged_events(outcome, known_prompt=None, prompt_estimate=99, completion_cap=16)
    assert (charged.prompt_tokens, charged.completion_tokens, charged.cached_tokens) == (14, 4, 4)
    assert outcome.extra["reasoning_tokens"] == "2"


@pytest.mark.parametrize("split", range(3))
async def test_a_messages_stream_is_assembled_tool_calls_included_and_charged_its_usage(split: int) -> None:
    reads = splits(messages_stream(["Hello", " there"], tool=True))[split]
    rw = MessagesEvents(endpoint_id="e:1", cap=50, collect=True, model_name="public")
    out, outcome, _ = await run(reads, rw)
    assert out == b""  # collecting: nothing for a client
    message = outcome.assembled
    assert message is not None and message["model"] == "public" and message["stop_reason"] == "tool_use"
    assert message["content"] == [{"type": "text", "text": "Hello there"},
                                  {"type": "tool_use", "id": "call_1", "name": "lookup", "input": {"city": "Paris"}}]
    charged = charged_events(outcome, known_prompt=rw.known_prompt, prompt_estimate=99, completion_cap=50)
    # Anthropic reports cache reads apart from input_tokens: the prompt is their sum.
    assert (charged.prompt_tokens, charged.completion_tokens, charged.cached_tokens) == (12, 4, 3)


async def test_a_stream_that_breaks_off_is_charged_the_prompt_the_engine_reported_and_the_deltas_seen() -> None:
    messages = messages_stream(["a", "b", "c", "d"])[:5]  # start, block start, three deltas; then the engine died
    rw = MessagesEvents(endpoint_id="e:1", cap=50, collect=False, model_name=None)
    out, outcome, response = await run(messages, rw)
    name, error = events(out)[-1]
    assert name == "error" and error == {"type": "error", "error": {
        "type": "api_error", "message": "the engine closed the stream before it finished"}}
    assert not outcome.ok and outcome.error_kind == "midstream" and response.closed
    charged = charged_events(outcome, known_prompt=rw.known_prompt, prompt_estimate=99, completion_cap=50)
    assert (charged.prompt_tokens, charged.completion_tokens) == (12, 3)
    # Responses: no usage before the end, so the prompt is the request's estimate.
    rwr = ResponsesEvents(endpoint_id="e:1", cap=50, collect=False, model_name=None, previous_response_id=None)
    out, outcome, _ = await run(responses_stream(["a", "b", "c"])[:4], rwr)
    name, error = events(out)[-1]
    assert name == "error" and error["type"] == "error" and error["code"] == "upstream_error"
    assert error["sequence_number"] == 4  # after the engine's last
    charged = charged_events(outcome, known_prompt=rwr.known_prompt, prompt_estimate=99, completion_cap=50)
    assert (charged.prompt_tokens, charged.completion_tokens) == (99, 2)


async def test_an_engine_error_event_is_relayed_in_the_apis_shape_without_its_details() -> None:
    leaked = {"type": "error", "code": "internal", "message": "Traceback (most recent call last): File \"/x\""}
    rw = ResponsesEvents(endpoint_id="e:1", cap=50, collect=False, model_name=None, previous_response_id=None)
    out, outcome, _ = await run([*responses_stream(["a"])[:3], sse("error", leaked)], rw)
    name, error = events(out)[-1]
    assert name == "error" and "Traceback" not in error["message"] and error["code"] == "engine_error"
    assert outcome.error_kind == "engine_error" and not outcome.ok
    anthropic = {"type": "error", "error": {"type": "overloaded_error", "message": "engine at 10.0.0.7:8000 busy"}}
    rw2 = MessagesEvents(endpoint_id="e:1", cap=50, collect=False, model_name=None)
    out, _, _ = await run([messages_stream(["a"])[0], sse("error", anthropic)], rw2)
    assert events(out)[-1][1]["error"]["message"] == "engine at <address> busy"


async def test_an_engine_streaming_far_past_the_cap_is_cut_off_and_charged_the_cap() -> None:
    cap = 3
    words = [f"w{i}" for i in range(2 * cap + DELTA_SLACK + 5)]
    rw = MessagesEvents(endpoint_id="e:1", cap=cap, collect=False, model_name=None)
    out, outcome, response = await run(messages_stream(words), rw)
    assert events(out)[-1][0] == "error" and outcome.error_kind == "overrun" and response.closed
    assert outcome.output_chunks == 2 * cap + DELTA_SLACK + 1
    charged = charged_events(outcome, known_prompt=rw.known_prompt, prompt_estimate=99, completion_cap=cap)
    assert charged.completion_tokens == cap


@pytest.mark.parametrize("usage", ["12", [1], {"input_tokens": -1, "output_tokens": 2}, {"output_tokens": 3},
                                   {"input_tokens": 1.5, "output_tokens": 2}])
async def test_a_malformed_final_usage_is_flagged_and_charged_by_estimate(usage: Any) -> None:
    rw = ResponsesEvents(endpoint_id="e:1", cap=50, collect=False, model_name=None, previous_response_id=None)
    _, outcome, _ = await run(responses_stream(["a", "b"], usage=usage), rw)
    assert outcome.ok and outcome.bad_usage and outcome.usage is None
    charged = charged_events(outcome, known_prompt=None, prompt_estimate=7, completion_cap=50)
    assert (charged.prompt_tokens, charged.completion_tokens) == (7, 2)
    if usage == {"output_tokens": 3}:
        return  # Anthropic's own final usage: the input came with message_start (below)
    rw2 = MessagesEvents(endpoint_id="e:1", cap=50, collect=False, model_name=None)
    _, outcome, _ = await run(messages_stream(["a", "b"], final=usage), rw2)
    assert outcome.bad_usage and outcome.usage is None


async def test_anthropics_final_usage_without_the_input_counts_the_input_message_start_reported() -> None:
    rw = MessagesEvents(endpoint_id="e:1", cap=50, collect=False, model_name=None)
    _, outcome, _ = await run(messages_stream(["a", "b"], final={"output_tokens": 2}), rw)
    charged = charged_events(outcome, known_prompt=rw.known_prompt, prompt_estimate=99, completion_cap=50)
    assert not outcome.bad_usage and (charged.prompt_tokens, charged.completion_tokens) == (12, 2)


def test_usage_conversions_never_read_a_missing_count_as_zero() -> None:
    assert responses_usage({"input_tokens": 5, "output_tokens": 2}) == {
        "prompt_tokens": 5, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 0}}
    assert responses_usage({"output_tokens": 2}) is None
    written = messages_usage({"input_tokens": 5, "output_tokens": 2, "cache_creation_input_tokens": 4})
    assert written is not None and written["prompt_tokens"] == 9
    assert messages_usage({"input_tokens": 5}) is None
    assert messages_usage({"input_tokens": 5, "output_tokens": 1, "cache_read_input_tokens": "3"}) is None


@pytest.mark.parametrize("api", ["responses", "messages"])
async def test_a_replayed_cached_answer_reads_back_as_the_same_answer(api: str) -> None:
    """The replay of a cached answer is a stream the rewriter (and so a client's SDK) reads as that answer."""
    if api == "responses":
        first = ResponsesEvents(endpoint_id="e", cap=50, collect=True, model_name=None, previous_response_id=None)
        _, original, _ = await run(responses_stream(["a", " b"]), first)
        assert original.assembled is not None
        replay = replay_response(original.assembled)
        again: ApiEvents = ResponsesEvents(endpoint_id="e", cap=50, collect=True, model_name=None,
                                           previous_response_id=None)
    else:
        first = MessagesEvents(endpoint_id="e", cap=50, collect=True, model_name=None)  # type: ignore[assignment]
        _, original, _ = await run(messages_stream(["a", " b"], tool=True), first)
        assert original.assembled is not None
        replay = replay_message(original.assembled)
        again = MessagesEvents(endpoint_id="e", cap=50, collect=True, model_name=None)
    _, replayed, _ = await run(replay, again)
    assert replayed.ok and replayed.assembled == original.assembled and replayed.usage == original.usage


def test_events_nobody_reads_are_counted_to_the_engines_final_usage_and_what_is_to_come_is_estimated() -> None:
    """After the client left (or the stream ended first), events are counted, never relayed: the deltas estimate
    the reserved tokens still to come (vLLM's usage comes only at the end), and the terminal event is where
    reading stops, its usage the charge, even for a stream that had already ended with an error."""
    for rw, stream in ((ResponsesEvents(endpoint_id="e:1", cap=6, collect=False, model_name=None,
                                        previous_response_id=None), responses_stream(["a", "b", "c", "d"])),
                       (MessagesEvents(endpoint_id="e:1", cap=6, collect=False, model_name=None),
                        messages_stream(["a", "b", "c", "d"]))):
        parsed = SseParser().feed(b"".join(stream))
        for name, data in parsed[:4]:
            assert rw.event(name, data) is not None
        assert rw.outcome.output_chunks == 2 and rw.to_come() == 4  # 6 reserved, 2 deltas relayed
        rw.fail("deadline", "the stream reached the gateway's deadline", "stream_deadline")
        stops = [rw.absorb(name, data) for name, data in parsed[4:]]
        assert stops[-1] and not any(stops[:-1])  # the terminal event, and nothing before it, ends the reading
        assert rw.outcome.error_kind == "deadline" and not rw.outcome.ok  # the ending stays the gateway's
        assert rw.outcome.output_chunks == 4 and rw.outcome.usage is not None
        assert rw.outcome.usage["completion_tokens"] == 4 and rw.to_come() == 2
    uncapped = MessagesEvents(endpoint_id="e:1", cap=None, collect=False, model_name=None)
    assert uncapped.to_come() is None


def test_what_is_to_come_is_never_negative_when_deltas_outnumber_the_tokens() -> None:
    """One engine step can yield two deltas (reasoning turning into text): more deltas than the cap is not an
    overrun (the cut-off decides that), so the estimate stops at 0."""
    rw = MessagesEvents(endpoint_id="e:1", cap=2, collect=False, model_name=None)
    for name, data in SseParser().feed(b"".join(messages_stream(["a", "b", "c", "d"])[:6])):
        rw.event(name, data)
    assert rw.outcome.output_chunks == 4 and rw.to_come() == 0
    assert not rw.ended
