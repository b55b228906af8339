"""Reservations that bound real usage: n, best_of, prompt lists, chat-template overhead, missing max_tokens;
and engine usage that is malformed read as unknown, never as an exception."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from fleetgate.core.types import Usage
from fleetgate.gateway.engine_usage import fallback_usage, is_malformed, parse_usage
from fleetgate.gateway.estimate import (
    TEMPLATE_TOKENS_PER_MESSAGE,
    TEMPLATE_TOKENS_PER_REQUEST,
    default_max_tokens,
    estimate_request,
)
from fleetgate.gateway.forwarding import assembled_upstream, upstream_body
from fleetgate.gateway.parsing import parse_request


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
    assert est("completions", {"prompt": [1, 2, 3, 4, 5, 6, 7]}) == (7 + TEMPLATE_TOKENS_PER_REQUEST, 1)


def test_chat_template_overhead_is_counted_per_message() -> None:
    tokens, _ = est("chat", {"messages": [{"role": "user", "content": "x"}] * 200})
    # 200 one-character messages: the template, not the text, is most of the prompt (177% of a budget before).
    assert tokens >= 200 * TEMPLATE_TOKENS_PER_MESSAGE + TEMPLATE_TOKENS_PER_REQUEST
    assert tokens >= 200 * 5  # more than the ~5 template tokens per turn of common chat templates


def test_missing_max_tokens_uses_the_context_left_or_the_default() -> None:
    assert default_max_tokens(prompt_tokens=100, context=4096, default=256) == 3996
    assert default_max_tokens(prompt_tokens=5000, context=4096, default=256) == 1
    assert default_max_tokens(prompt_tokens=100, context=None, default=256) == 256


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


def test_well_formed_usage_and_the_fallback() -> None:
    raw = {"prompt_tokens": 10, "completion_tokens": 4.0, "prompt_tokens_details": {"cached_tokens": 30}}
    assert parse_usage(raw) == Usage(prompt_tokens=10, completion_tokens=4, cached_tokens=10)
    assert parse_usage(None) is None and not is_malformed(None)
    assert fallback_usage(prompt_estimate=25, output_chunks=3) == Usage(prompt_tokens=25, completion_tokens=3)
