"""The API routes' own parts: validation (a 400 naming the field), the reservation's prompt bound against what an
engine reads, the engine's body, the errors' shapes, and the cache's keys and policy for each API."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from fleetgate.cache.config import CacheConfig
from fleetgate.cache.keys import cache_keys
from fleetgate.cache.policy import decide, storable
from fleetgate.cache.types import CacheRequest
from fleetgate.core.errors import FleetGateError, InvalidRequestError, RateLimitError
from fleetgate.core.kvstore import MemoryKVStore
from fleetgate.gateway.api_embeddings import MAX_INPUTS, EmbeddingsRoute
from fleetgate.gateway.api_messages import MessagesRoute, anthropic_error
from fleetgate.gateway.api_responses import MAX_ITEMS, ResponsesRoute
from fleetgate.gateway.conversations import ConversationStore
from fleetgate.gateway.estimate import RequestEstimate, estimate_body
from fleetgate.gateway.parsing import ParsedRequest
from fleetgate.gateway.prompt_bound import DEFAULT_PROFILE
from fleetgate.sim.fake_api_routes import messages_prompt, responses_prompt
from fleetgate.sim.fake_engine import prompt_tokens_of

RESPONSES = ResponsesRoute(store=ConversationStore(MemoryKVStore(), ttl_s=60, max_bytes=1 << 20))
MESSAGES = MessagesRoute()
EMBEDDINGS = EmbeddingsRoute()


def parse(route: Any, body: dict[str, Any], **headers: str) -> ParsedRequest:
    parsed: ParsedRequest = route.parse(orjson.dumps(body), headers)
    return parsed


def bound(route: Any, body: dict[str, Any], *, context: int | None = None) -> RequestEstimate:
    """What the gateway reserves for `body` (`Reserver.reserve` with the route's shape)."""
    shape = route.reserve_shape(parse(route, body))
    estimate = estimate_body(shape.body, prompts_field=shape.prompts_field, profile=DEFAULT_PROFILE, context=context)
    return shape.adjust(estimate, context) if shape.adjust is not None else estimate


def refused(route: Any, body: dict[str, Any]) -> str | None:
    with pytest.raises(InvalidRequestError) as err:
        parse(route, body)
    return err.value.param


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m"}, "input"),
    ({"model": "m", "input": []}, "input"),
    ({"model": "m", "input": [1]}, "input[0]"),
    ({"model": "m", "input": [{"type": "computer_call", "id": "x"}]}, "input[0].type"),
    ({"model": "m", "input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"model": "m", "input": [{"role": "user", "content": [{"type": "input_text", "text": 7}]}]},
     "input[0].content[0].text"),
    ({"model": "m", "input": [{"role": "user", "content": [{"text": "no type"}]}]}, "input[0].content[0]"),
    ({"model": "m", "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": {"a": 1}}]},
     "input[0].arguments"),
    ({"model": "m", "input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"model": "m", "input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"model": "m", "input": "hi", "temperature": 3}, "temperature"),
    ({"model": "m", "input": "hi", "tools": [{"name": "no type"}]}, "tools[0].type"),
    ({"model": "m", "input": "hi", "background": True}, "background"),
    ({"model": "m", "input": "hi", "conversation": "conv_1"}, "conversation"),
    ({"model": "m", "input": "hi", "previous_response_id": "resp_1 *"}, "previous_response_id"),
    ({"model": "m", "input": "hi", "previous_response_id": "r" * 201}, "previous_response_id"),
    ({"model": "m", "input": "hi", "truncation": "sometimes"}, "truncation"),
    ({"model": "m", "input": [{"role": "user", "content": "x"}] * (MAX_ITEMS + 1)}, "input"),
])
def test_responses_refuses_what_it_cannot_forward_naming_the_field(body: dict[str, Any], param: str) -> None:
    assert refused(RESPONSES, body) == param


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m", "max_tokens": 5}, "messages"),
    ({"model": "m", "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    ({"model": "m", "max_tokens": 0, "messages": [{"role": "user", "content": "hi"}]}, "max_tokens"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "tool", "content": "hi"}]}, "messages[0].role"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "document"}]}]},
     "messages[0].content[0].type"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "text"}]}]},
     "messages[0].content[0].text"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "assistant", "content": [
        {"type": "tool_use", "name": "f", "input": "not an object"}]}]}, "messages[0].content[0].input"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "temperature": 1.5},
     "temperature"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "system": [{"type": "image"}]},
     "system[0].type"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "tools": [{"name": "f"}]},
     "tools[0].input_schema"),
    ({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}], "stop_sequences": "END"},
     "stop_sequences"),
])
def test_messages_refuses_what_it_cannot_forward_naming_the_field(body: dict[str, Any], param: str) -> None:
    assert refused(MESSAGES, body) == param


@pytest.mark.parametrize(("body", "param"), [
    ({"model": "m"}, "input"),
    ({"model": "m", "input": []}, "input"),
    ({"model": "m", "input": [["a"]]}, "input"),
    ({"model": "m", "input": ["a", 1]}, "input"),
    ({"model": "m", "input": [[1, 2], []]}, "input"),
    ({"model": "m", "input": ["a"] * (MAX_INPUTS + 1)}, "input"),
    ({"model": "m", "input": "a", "encoding_format": "int8"}, "encoding_format"),
    ({"model": "m", "input": "a", "dimensions": 0}, "dimensions"),
    ({"model": "m", "input": "a", "stream": True}, "stream"),
    ({"model": "m", "input": "a", "messages": [{"role": "user", "content": "b"}]}, "messages"),
])
def test_embeddings_refuses_what_it_cannot_forward_naming_the_field(body: dict[str, Any], param: str) -> None:
    assert refused(EMBEDDINGS, body) == param


def test_every_route_refuses_a_body_nested_deeper_than_the_gateway_reserialises() -> None:
    deep = b"[" * 300 + b'"x"' + b"]" * 300  # orjson reads up to 1024 levels, writes up to 254
    for route, head in ((RESPONSES, b'{"model": "m", "input": "hi", "metadata": '),
                        (MESSAGES, b'{"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "hi"}], '
                                   b'"metadata": '),
                        (EMBEDDINGS, b'{"model": "m", "input": "hi", "extra": ')):
        with pytest.raises(InvalidRequestError, match="nests deeper"):
            route.parse(head + deep + b"}", {})


# ---- the bound covers what the engine reads -----------------------------------------------------------------

LONG = "one two three four five " * 40
HOSTILE = "\U0001f9ea\u0bf8\ufdfa \t\x01" * 80  # expanding normalisations, control characters, no words
TOOL = {"type": "function", "name": "lookup", "description": LONG,
        "parameters": {"type": "object", "properties": {f"p{i}": {"type": "string", "description": HOSTILE[:40]}
                                                        for i in range(10)}}}
RESPONSES_KINDS: dict[str, dict[str, Any]] = {
    "text": {"input": LONG},
    "instructions": {"input": "hi", "instructions": LONG},
    "hostile text": {"input": [{"role": "user", "content": [{"type": "input_text", "text": HOSTILE}]}]},
    "items of every kind": {"input": [
        {"role": "user", "content": "look it up"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": LONG}]},
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": orjson.dumps({"q": LONG}).decode()},
        {"type": "function_call_output", "call_id": "c1", "output": HOSTILE},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": LONG, "annotations": []}]},
        {"role": "user", "content": "and then?"}]},
    "tools": {"input": "weather?", "tools": [TOOL, TOOL]},
}
MESSAGES_KINDS: dict[str, dict[str, Any]] = {
    "text": {"messages": [{"role": "user", "content": LONG}]},
    "system blocks": {"system": [{"type": "text", "text": LONG}], "messages": [{"role": "user", "content": "hi"}]},
    "hostile text": {"messages": [{"role": "user", "content": [{"type": "text", "text": HOSTILE}]}]},
    "blocks of every kind": {"messages": [
        {"role": "user", "content": "look it up"},
        {"role": "assistant", "content": [{"type": "thinking", "thinking": LONG, "signature": "s"},
                                          {"type": "tool_use", "id": "c1", "name": "lookup", "input": {"q": LONG}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": HOSTILE}]}]},
    "tools": {"messages": [{"role": "user", "content": "weather?"}],
              "tools": [{"name": "lookup", "description": LONG, "input_schema": TOOL["parameters"]}] * 2},
}


@pytest.mark.parametrize("kind", list(RESPONSES_KINDS))
def test_the_responses_bound_covers_every_byte_an_engine_reads(kind: str) -> None:
    body = {"model": "m", "max_output_tokens": 5, **RESPONSES_KINDS[kind]}
    reserved = bound(RESPONSES, body)
    # The fake engine with `prompt_count="bytes"` is the worst tokenizer: one token per byte of every string.
    assert reserved.prompt_tokens >= prompt_tokens_of(responses_prompt(body), count="bytes")
    assert reserved.typical <= reserved.prompt_tokens


@pytest.mark.parametrize("kind", list(MESSAGES_KINDS))
def test_the_messages_bound_covers_every_byte_an_engine_reads(kind: str) -> None:
    body = {"model": "m", "max_tokens": 5, **MESSAGES_KINDS[kind]}
    assert bound(MESSAGES, body).prompt_tokens >= prompt_tokens_of(messages_prompt(body), count="bytes")


def test_tools_are_measured_in_the_shape_the_engine_renders_them() -> None:
    """vLLM wraps each tool in `{"type": "function", "function": {...}}` (and adds Anthropic's null fields): the
    bound measures that shape, a little larger than the client's."""
    body = {"model": "m", "max_output_tokens": 5, "input": "hi", "tools": [TOOL] * 3}
    plain = {**body, "tools": None}
    with_tools, without = bound(RESPONSES, body).prompt_tokens, bound(RESPONSES, plain).prompt_tokens
    wrapped = len(orjson.dumps(RESPONSES.chat_tools([TOOL] * 3)))
    assert with_tools - without > wrapped


def test_embeddings_reserve_every_input_and_no_completion() -> None:
    one = bound(EMBEDDINGS, {"model": "m", "input": "a b c"})
    many = bound(EMBEDDINGS, {"model": "m", "input": ["a b c"] * 10})
    ids = bound(EMBEDDINGS, {"model": "m", "input": [[1, 2, 3], [4] * 50]})
    assert many.prompt_tokens == 10 * one.prompt_tokens and many.prompts == 10
    assert ids.prompt_tokens == 3 + 50 + 2 * 2  # token ids exactly, plus the special tokens each prompt may get
    assert EMBEDDINGS.reserve_shape(parse(EMBEDDINGS, {"model": "m", "input": "a"})).max_tokens == 0
    padded = {"model": "m", "input": ["a", "b"], "padding": "max_length"}
    assert bound(EMBEDDINGS, padded, context=256).prompt_tokens == 512
    with pytest.raises(InvalidRequestError) as err:  # no length known: no bound
        bound(EMBEDDINGS, padded)
    assert err.value.param == "padding"


# ---- what the engine gets, and what errors look like ---------------------------------------------------------

def test_the_engine_gets_the_served_name_a_stream_no_state_and_the_output_limit_set() -> None:
    body = {"model": "public", "input": "hi", "previous_response_id": "resp_1", "stream_options": {"x": 1}}
    sent = orjson.loads(RESPONSES.upstream_body(parse(RESPONSES, body), served="engine-name", max_tokens=40))
    assert sent == {"model": "engine-name", "input": "hi", "stream": True, "store": False, "max_output_tokens": 40}
    msg = {"model": "public", "max_tokens": 9, "messages": [{"role": "user", "content": "hi"}]}
    sent = orjson.loads(MESSAGES.upstream_body(parse(MESSAGES, msg), served="engine-name", max_tokens=None))
    assert sent == {**msg, "model": "engine-name", "stream": True}
    emb = orjson.dumps({"model": "engine-name", "input": "hi"})
    assert EMBEDDINGS.upstream_body(EMBEDDINGS.parse(emb, {}), served="engine-name", max_tokens=None) == emb


@pytest.mark.parametrize(("error", "kind"), [
    (InvalidRequestError("bad"), "invalid_request_error"),
    (RateLimitError("over", retry_after_s=3), "rate_limit_error"),
    (FleetGateError("down"), "api_error"),
])
def test_messages_errors_are_anthropics_shape(error: FleetGateError, kind: str) -> None:
    assert orjson.loads(anthropic_error(error)) == {"type": "error", "error": {"type": kind, "message": error.message}}


def test_messages_take_the_key_from_x_api_key_or_a_bearer_header() -> None:
    assert MESSAGES.authorization({"x-api-key": "k1"}) == "Bearer k1"
    assert MESSAGES.authorization({"authorization": "Bearer k2"}) == "Bearer k2"
    assert MESSAGES.authorization({"x-api-key": "k1", "authorization": "Bearer k2"}) == "Bearer k1"
    assert RESPONSES.authorization({"x-api-key": "k1"}) is None  # OpenAI's routes: the bearer header only


# ---- the cache --------------------------------------------------------------------------------------------

def request(kind: Any, body: dict[str, Any], tenant: str = "acme") -> CacheRequest:
    return CacheRequest(tenant=tenant, model="m", kind=kind, body=body)


def test_cache_keys_cover_the_whole_conversation_and_never_cross_tenants() -> None:
    first = {"model": "m", "input": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                     {"role": "user", "content": "c"}], "temperature": 0}
    keys = cache_keys(request("responses", first))
    assert keys.semantic_text == "c"
    other_history = {**first, "input": [{"role": "user", "content": "z"}, *first["input"][1:]]}
    assert cache_keys(request("responses", other_history)).partition != keys.partition
    assert cache_keys(request("responses", first, tenant="other")).partition != keys.partition
    assert cache_keys(request("responses", {**first, "instructions": "be brief"})).partition != keys.partition
    assert cache_keys(request("messages", {"model": "m", "messages": first["input"]})).partition != keys.partition
    # A string input is one user turn: the same entry as that turn written out.
    assert cache_keys(request("responses", {"model": "m", "input": "c", "temperature": 0})).exact == \
        cache_keys(request("responses", {"model": "m", "input": [{"role": "user", "content": "c"}],
                                         "temperature": 0})).exact


def test_a_stateful_follow_up_is_served_from_the_cache_only_when_its_whole_input_matches() -> None:
    body = {"model": "m", "previous_response_id": "resp_1", "temperature": 0,
            "input": [{"role": "user", "content": "a"}, {"role": "user", "content": "what about b"}]}
    keys = cache_keys(request("responses", body))
    assert keys.semantic_text is None  # exact only
    assert not decide(request("responses", body), CacheConfig(enabled=True), semantic_text=keys.semantic_text).semantic


def test_the_cache_stores_complete_answers_without_tool_calls_and_never_embeddings() -> None:
    config = CacheConfig(enabled=True)
    message = {"type": "message", "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn"}
    assert storable(message, config) == ""
    assert storable({**message, "stop_reason": "max_tokens"}, config) == "stop_reason 'max_tokens'"
    assert storable({**message, "content": [{"type": "tool_use", "id": "c", "name": "f", "input": {}}]},
                    config) == "tool calls"
    response = {"object": "response", "status": "completed", "error": None,
                "output": [{"type": "message", "content": [{"type": "output_text", "text": "hi"}]}]}
    assert storable(response, config) == ""
    assert storable({**response, "status": "incomplete"}, config) == "status 'incomplete'"
    assert storable({**response, "status": "incomplete"}, CacheConfig(enabled=True, store_truncated=True)) == ""
    assert storable({**response, "output": [{"type": "function_call"}]}, config) == "tool calls"
    assert decide(request("embeddings", {"model": "m", "input": "a"}), config, semantic_text=None).reason == \
        "embeddings"
