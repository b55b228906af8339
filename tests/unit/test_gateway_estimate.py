"""Reservations that bound real usage: n, best_of, prompt lists, chat-template overhead, missing max_tokens,
the exact count where the bound would be refused; and engine usage that is malformed read as unknown, never
as an exception. (The prompt bound itself, per content kind: `test_prompt_bound`.)"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pytest

from fleetgate.core.errors import RateLimitError
from fleetgate.core.types import Usage
from fleetgate.gateway.collect import capped
from fleetgate.gateway.discovery import StaticEndpointSource
from fleetgate.gateway.engine_usage import fallback_usage, is_malformed, parse_usage, usage_counts
from fleetgate.gateway.estimate import (
    RequestEstimate,
    completion_cap,
    default_max_tokens,
    estimate_request,
    reserve_request,
)
from fleetgate.gateway.forwarding import assembled_upstream, upstream_body
from fleetgate.gateway.parsing import Kind, parse_request
from fleetgate.gateway.prompt_bound import DEFAULT_PROFILE
from fleetgate.gateway.reserving import Reserver
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.stages import Reservation, Tenant
from fleetgate.gateway.token_count import tokenize_bodies


def est(kind: str, body: dict[str, Any]) -> tuple[int, int]:
    e = estimate_request(parse_request(kind, orjson.dumps({"model": "m", **body})))  # type: ignore[arg-type]
    return e.prompt_tokens, e.sequences


def test_n_and_best_of_multiply_the_sequences() -> None:
    assert est("chat", {"messages": [{"role": "user", "content": "hi"}], "n": 50})[1] == 50
    assert est("completions", {"prompt": "hi", "n": 2, "best_of": 5})[1] == 5


def test_every_prompt_of_a_list_is_counted() -> None:
    one_prompt, one = est("completions", {"prompt": "abcd efgh"})
    five_prompts, five = est("completions", {"prompt": ["abcd efgh"] * 5, "n": 3})
    assert (one, five) == (1, 15)
    assert five_prompts == 5 * one_prompt
    assert est("completions", {"prompt": [1, 2, 3, 4, 5, 6, 7]}) == (7 + 2, 1)  # token ids: exact, + BOS/EOS


def test_chat_template_overhead_is_counted_per_message() -> None:
    tokens, _ = est("chat", {"messages": [{"role": "user", "content": "x"}] * 200})
    # 200 one-character messages: the template, not the text, is most of the prompt (177% of a budget before).
    assert tokens >= 200 * DEFAULT_PROFILE.tokens_per_message + DEFAULT_PROFILE.tokens_per_request


def test_missing_max_tokens_reserves_the_whole_context_or_the_default() -> None:
    assert default_max_tokens(context=4096, default=256) == 4095  # a prompt is at least one token
    assert default_max_tokens(context=1, default=256) == 1
    assert default_max_tokens(context=None, default=256) == 256


class RefusingLimiter:
    """Refuses any reservation whose prompt is above `room` (a tpm or budget window), or everything (rpm)."""

    def __init__(self, room: int, *, limit: str = "tpm") -> None:
        self.room, self.limit = room, limit
        self.asked: list[int] = []

    async def reserve(self, tenant: Tenant, model: str, *, prompt_tokens: int, max_tokens: int | None,
                      sequences: int = 1, fit_max_tokens: bool = False) -> Reservation:
        self.asked.append(prompt_tokens)
        if self.limit == "rpm" or prompt_tokens > self.room:
            raise RateLimitError("over", retry_after_s=1, limit=self.limit)
        return Reservation(tenant=tenant, model=model, estimated_tokens=prompt_tokens, estimated_micros=0,
                           max_tokens=max_tokens if fit_max_tokens else None)

    async def settle(self, reservation: Reservation, usage: Usage) -> None:
        return None


class Counter:
    def __init__(self, counts: list[int] | None) -> None:
        self.counts = counts
        self.calls = 0

    async def count(self, *, kind: Kind, model: str, body: Mapping[str, Any]) -> list[int] | None:
        self.calls += 1
        return self.counts


async def reserve(limiter: RefusingLimiter, counter: Counter | None, *, context: int | None = None,
                  **body: Any) -> tuple[Reservation, RequestEstimate]:
    parsed = parse_request("chat", orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                                 **body}))
    estimate = estimate_request(parsed, context=context)
    return await reserve_request(limiter=limiter, tenant=Tenant(id="t"), model="m", body=parsed.body,
                                 max_tokens=parsed.max_tokens, estimate=estimate, context=context, default=16,
                                 counter=counter, kind="chat")


async def test_the_exact_count_is_asked_only_where_the_bound_is_refused() -> None:
    roomy, counter = RefusingLimiter(10**6), Counter([9])
    reservation, estimate = await reserve(roomy, counter, max_tokens=5)
    assert counter.calls == 0 and not estimate.exact and reservation.estimated_tokens == estimate.prompt_tokens
    tight = RefusingLimiter(50)
    reservation, estimate = await reserve(tight, counter, max_tokens=5)
    assert counter.calls == 1 and estimate.exact and tight.asked[-1] == 9 and reservation.estimated_tokens == 9
    assert estimate.typical <= 9


@pytest.mark.parametrize("case", ["rpm", "no counter", "count unknown", "count not lower", "still too big"])
async def test_the_bound_refusal_stands_when_the_exact_count_cannot_help(case: str) -> None:
    limiter = RefusingLimiter(5, limit="rpm" if case == "rpm" else "tpm")
    counter = {"no counter": None, "count unknown": Counter(None), "count not lower": Counter([10**6]),
               "still too big": Counter([6])}.get(case, Counter([1]))
    with pytest.raises(RateLimitError):
        await reserve(limiter, counter, max_tokens=5)
    if case == "rpm":
        assert isinstance(counter, Counter) and counter.calls == 0  # a request count is not a token count


async def test_a_context_sized_completion_is_capped_by_the_reservation() -> None:
    reservation, estimate = await reserve(RefusingLimiter(10**6), None, context=4096)
    assert reservation.max_tokens is None and reservation.completion_per_seq == 4095  # not set upstream
    assert completion_cap(reservation, max_tokens=None, sequences=estimate.sequences) == 4095
    fitted = Reservation(tenant=Tenant(id="t"), model="m", estimated_tokens=1, estimated_micros=1, max_tokens=7,
                         completion_per_seq=4095)
    assert completion_cap(fitted, max_tokens=None, sequences=3) == 21  # what the gateway set upstream
    assert completion_cap(fitted, max_tokens=9, sequences=3) == 21
    assert capped(Usage(prompt_tokens=5, completion_tokens=99), 21) == Usage(prompt_tokens=5, completion_tokens=21)
    assert capped(Usage(prompt_tokens=5, completion_tokens=9), 21) == Usage(prompt_tokens=5, completion_tokens=9)


async def test_the_reserver_serves_other_request_shapes() -> None:
    """How a new route reserves: an embeddings request generates nothing (completion 0, cap 0); an
    Anthropic-style body is one templated prompt; the model's profile and context apply."""
    settings = GatewaySettings.model_validate({"models": [
        {"name": "m", "endpoints": ["http://127.0.0.1:9"], "max_model_len": 300,
         "prompt_bound": {"tokens_per_request": 10, "tokens_per_message": 2}}]})
    limiter = RefusingLimiter(10**6)
    reserver = Reserver(settings=settings, source=StaticEndpointSource(settings.models), limiter=limiter,
                        session=lambda: None)  # type: ignore[arg-type,return-value]
    embed = await reserver.reserve(Tenant(id="t"), model="m", body={"model": "m", "input": ["a b", [1, 2, 3]]},
                                   prompts_field="input", max_tokens=0)
    assert embed.completion_cap == 0 and embed.reservation.completion_per_seq == 0
    assert limiter.asked[-1] == embed.estimate.prompt_tokens == (4 + 2) + (3 + 2)
    messages = await reserver.reserve(Tenant(id="t"), model="m", prompts_field=None, max_tokens=7, body={
        "model": "m", "max_tokens": 7, "system": "s" * 1000, "messages": [{"role": "user", "content": "x"}]})
    assert messages.estimate.prompt_tokens == 300  # capped at the model's context
    assert messages.completion_cap == 7


def test_tokenize_requests_carry_everything_the_chat_route_renders() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}],
            "documents": [{"text": "d"}], "reasoning_effort": "low", "chat_template_kwargs": {"x": 1},
            "tool_choice": "required", "temperature": 0.5}
    [request], margin = tokenize_bodies("chat", body, served="served-name")
    assert request == {"model": "served-name", "messages": body["messages"], "tools": body["tools"],
                       "chat_template_kwargs": {"documents": [{"text": "d"}], "reasoning_effort": "low",
                                                "enable_thinking": True, "x": 1}}
    assert margin >= len('"required"')  # tool_choice: /tokenize cannot take it, so its bytes are added
    requests, margin = tokenize_bodies("completions", {"prompt": ["a", "b c"]}, served="s")
    assert [r["prompt"] for r in requests] == ["a", "b c"] and margin == 0
    assert tokenize_bodies("completions", {"prompt": [1, 2, 3]}, served="s") == ([], 0)


def test_responses_and_messages_are_counted_as_vllm_renders_them() -> None:
    """A Responses request becomes the chat request vLLM renders (`chat_views`): instructions as a system turn,
    text parts as chat parts, an output message as its text, tool calls and their outputs as chat tool turns,
    flat function tools in the chat shape, `reasoning.effort`; a Messages request goes to vLLM's own count
    endpoint with its fields."""
    tool = {"type": "function", "name": "f", "parameters": {"type": "object"}}
    body = {"model": "m", "instructions": "be brief", "tools": [tool], "reasoning": {"effort": "low"},
            "max_output_tokens": 9, "store": False, "input": [
                {"role": "user", "content": [{"type": "input_text", "text": "hi"}]},
                {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
                 "content": [{"type": "output_text", "text": "hello", "annotations": []}]},
                {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": "fc_1"},
                {"type": "function_call_output", "call_id": "c1", "output": "42"},
                {"type": "computer_call", "action": {}}]}
    [request], margin = tokenize_bodies("responses", body, served="s")
    assert request["messages"] == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": [{"type": "text", "text": "hi"}]},
        {"role": "assistant", "content": "hello"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "42"}]  # the kind vLLM cannot render: left out
    assert request["tools"] == [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    assert request["chat_template_kwargs"]["reasoning_effort"] == "low" and request["model"] == "s"
    assert request["add_special_tokens"] is True  # as vLLM's Responses path tokenizes (a second BOS on Gemma)
    assert margin >= len('"auto"')  # vLLM hands tool_choice "auto" to the template with tools
    messages = {"model": "m", "max_tokens": 5, "system": "s", "stream": True, "metadata": {"user_id": "u"},
                "messages": [{"role": "user", "content": "x"}], "tools": [{"name": "t", "input_schema": {}}]}
    assert tokenize_bodies("messages", messages, served="s") == ([
        {"model": "s", "system": "s", "messages": messages["messages"], "tools": messages["tools"]}], 0)


def test_upstream_body_sets_the_bounded_max_tokens_and_streams_when_assembling() -> None:
    p = parse_request("chat", orjson.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
    sent = orjson.loads(upstream_body(p.body, served_name="m", stream=True, raw=p.raw, max_tokens=77))
    assert sent["max_tokens"] == 77 and sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert assembled_upstream(p.body)
    assert not assembled_upstream({**p.body, "tools": [{"type": "function"}]})
    assert not assembled_upstream({**p.body, "logprobs": True})


@pytest.mark.parametrize("raw", ["12", [1, 2], {"prompt_tokens": -1}, {"completion_tokens": 2**40},
                                 {"prompt_tokens": "3"}, {"prompt_tokens": True}, {"prompt_tokens": 1.5}, 7])
def test_malformed_usage_is_unknown(raw: Any) -> None:
    assert parse_usage(raw) is None and is_malformed(raw)


USAGES: list[Any] = [
    "12", [1, 2], {}, 7, None, {"prompt_tokens": -1}, {"completion_tokens": 2**40}, {"prompt_tokens": "3"},
    {"prompt_tokens": True}, {"prompt_tokens": 1.5}, {"prompt_tokens": 2**31, "completion_tokens": 1},
    {"prompt_tokens": 3, "completion_tokens": -2}, {"prompt_tokens": 4, "completion_tokens": True},
    {"prompt_tokens": 4.0, "completion_tokens": 2}, {"prompt_tokens": 2**31 - 1, "completion_tokens": 0},
    {"prompt_tokens": 9, "completion_tokens": 5},
    {"prompt_tokens": 9, "completion_tokens": 5, "prompt_tokens_details": {"cached_tokens": "x"}},
]


@pytest.mark.parametrize("raw", USAGES)
def test_the_per_token_usage_check_decides_as_parse_usage_does(raw: Any) -> None:
    """The stream's cheap check (`usage_counts`, one per token) and `parse_usage` agree on every usage."""
    parsed = parse_usage(raw)
    assert usage_counts(raw) == (None if parsed is None else (parsed.prompt_tokens, parsed.completion_tokens))


def test_well_formed_usage_and_the_fallback() -> None:
    raw = {"prompt_tokens": 10, "completion_tokens": 4.0, "prompt_tokens_details": {"cached_tokens": 30}}
    assert parse_usage(raw) == Usage(prompt_tokens=10, completion_tokens=4, cached_tokens=10)
    assert parse_usage(None) is None and not is_malformed(None)
    assert fallback_usage(prompt_estimate=25, output_chunks=3) == Usage(prompt_tokens=25, completion_tokens=3)
