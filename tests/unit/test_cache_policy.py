"""The cache policy table: when a request may be served from and stored into the cache."""

from __future__ import annotations

from typing import Any

import pytest

from fleetgate.cache.config import CacheConfig
from fleetgate.cache.keys import cache_keys
from fleetgate.cache.policy import decide, storable
from fleetgate.cache.types import CacheRequest

MSG = [{"role": "user", "content": "What is the capital of Peru?"}]


def req(body: dict[str, Any], **flags: bool) -> CacheRequest:
    return CacheRequest(tenant="t", model="m", kind="chat", body={"messages": MSG, **body}, **flags)


@pytest.mark.parametrize(
    ("body", "flags", "serve", "store", "reason"),
    [
        ({"temperature": 0}, {}, True, True, ""),
        ({"temperature": 0.0, "top_p": 0.5, "seed": 3}, {}, True, True, ""),
        ({}, {}, False, False, "sampled (temperature not set)"),
        ({"temperature": 0.2}, {}, False, False, "sampled (temperature > 0)"),
        ({"temperature": 0.2}, {"allow_sampled": True}, True, True, ""),
        ({}, {"allow_sampled": True}, True, True, ""),
        ({"temperature": 0, "tools": [{"type": "function", "function": {"name": "f"}}]}, {}, False, False, "tools"),
        ({"temperature": 0, "tool_choice": "auto"}, {}, False, False, "tools"),
        ({"temperature": 0, "n": 2}, {}, False, False, "n>1"),
        ({"temperature": 0, "n": 1}, {}, True, True, ""),
        ({"temperature": 0, "logprobs": True}, {}, False, False, "logprobs"),
        ({"temperature": 0, "top_logprobs": 3}, {}, False, False, "logprobs"),
        ({"temperature": 0}, {"no_cache": True}, False, True, "no-cache"),
        ({"temperature": 0}, {"no_store": True}, False, False, "no-store"),
        ({"temperature": 0}, {"no_store": True, "no_cache": True}, False, False, "no-store"),
        ({"temperature": 0, "tools": []}, {}, True, True, ""),
    ],
)
def test_policy_table(body: dict[str, Any], flags: dict[str, bool], serve: bool, store: bool, reason: str) -> None:
    r = req(body, **flags)
    d = decide(r, CacheConfig(), semantic_text=cache_keys(r).semantic_text)
    assert (d.serve, d.store, d.reason) == (serve, store, reason)


def test_absent_temperature_can_be_declared_greedy() -> None:
    r = req({})
    d = decide(r, CacheConfig(absent_temperature_is_sampled=False), semantic_text="x")
    assert d.serve and d.store


def test_disabled_cache_bypasses_everything() -> None:
    d = decide(req({"temperature": 0}), CacheConfig(enabled=False), semantic_text="x")
    assert not d.serve and not d.store and d.reason == "cache disabled"


@pytest.mark.parametrize(
    ("text", "semantic"),
    [("What is the capital of Peru?", True), (None, False), ("   ", False), ("x" * 5000, False)],
)
def test_semantic_layer_needs_short_plain_text(text: str | None, semantic: bool) -> None:
    assert decide(req({"temperature": 0}), CacheConfig(), semantic_text=text).semantic is semantic


def _resp(finish: str, **message: Any) -> dict[str, Any]:
    return {"choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", **message}}]}


@pytest.mark.parametrize(
    ("response", "truncated_ok", "why"),
    [
        (_resp("stop", content="hi"), False, ""),
        (_resp("length", content="hi"), False, "finish_reason 'length'"),
        (_resp("length", content="hi"), True, ""),
        (_resp("stop", content=None, tool_calls=[{"id": "c"}]), False, "tool calls"),
        (_resp("tool_calls", content=None), False, "finish_reason 'tool_calls'"),
        ({"error": {"message": "x"}}, False, "error response"),
        ({"choices": []}, False, "no choices"),
        ({"choices": [{"finish_reason": "stop"}, {"finish_reason": None}]}, False, "finish_reason None"),
    ],
)
def test_storable(response: dict[str, Any], truncated_ok: bool, why: str) -> None:
    assert storable(response, CacheConfig(store_truncated=truncated_ok)) == why
