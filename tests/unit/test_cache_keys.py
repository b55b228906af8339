"""Cache keys: what separates two requests' cache entries."""

from __future__ import annotations

from typing import Any

from fleetgate.cache.keys import cache_keys
from fleetgate.cache.types import CacheRequest


def req(messages: list[dict[str, Any]], *, tenant: str = "t", model: str = "m", **body: Any) -> CacheRequest:
    return CacheRequest(tenant=tenant, model=model, kind="chat", body={"messages": messages, **body})


SYS = {"role": "system", "content": "Be brief."}
Q = {"role": "user", "content": "Why is the sky blue?"}


def test_same_request_same_keys_and_body_order_does_not_matter() -> None:
    a = cache_keys(req([SYS, Q], temperature=0, max_tokens=50))
    b = cache_keys(CacheRequest(tenant="t", model="m", kind="chat",
                                body={"max_tokens": 50, "temperature": 0, "messages": [SYS, Q]}))
    assert a == b
    assert a.semantic_text == "Why is the sky blue?"


def test_every_output_affecting_field_changes_the_partition() -> None:
    base = cache_keys(req([SYS, Q], temperature=0))
    variants = [
        req([SYS, Q], tenant="other", temperature=0),
        req([SYS, Q], model="other", temperature=0),
        req([{"role": "system", "content": "Be verbose."}, Q], temperature=0),
        req([Q], temperature=0),
        req([SYS, {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}, Q], temperature=0),
        req([SYS, Q], temperature=0, top_p=0.9),
        req([SYS, Q], temperature=0, max_tokens=10),
        req([SYS, Q], temperature=0, stop=["\n"]),
        req([SYS, Q], temperature=0, seed=1),
        req([SYS, Q], temperature=0, response_format={"type": "json_object"}),
        req([SYS, Q], temperature=0, presence_penalty=0.5),
        req([SYS, Q], temperature=0, some_future_knob=True),
    ]
    partitions = {cache_keys(v).partition for v in variants}
    assert base.partition not in partitions
    assert len(partitions) == len(variants)


def test_transport_fields_do_not_change_keys() -> None:
    base = cache_keys(req([SYS, Q], temperature=0))
    assert cache_keys(req([SYS, Q], temperature=0, stream=True, stream_options={"include_usage": True},
                          user="u1", metadata={"a": "b"})) == base


def test_last_message_is_in_the_exact_key_not_the_partition() -> None:
    a = cache_keys(req([SYS, Q], temperature=0))
    b = cache_keys(req([SYS, {"role": "user", "content": "Why is the sea blue?"}], temperature=0))
    assert a.partition == b.partition and a.exact != b.exact


def test_semantic_text_only_for_plain_user_text() -> None:
    parts = {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x"}}]}
    tool = {"role": "tool", "tool_call_id": "c1", "content": "42"}
    assert cache_keys(req([parts])).semantic_text == "a\nb"
    assert cache_keys(req([image])).semantic_text is None
    assert cache_keys(req([Q, tool])).semantic_text is None
    assert cache_keys(req([])).semantic_text is None


def test_completions_are_exact_only_and_keyed_on_the_prompt() -> None:
    a = cache_keys(CacheRequest(tenant="t", model="m", kind="completions", body={"prompt": "x", "temperature": 0}))
    b = cache_keys(CacheRequest(tenant="t", model="m", kind="completions", body={"prompt": "y", "temperature": 0}))
    assert a.semantic_text is None and a.partition == b.partition and a.exact != b.exact


def test_follows_user_turns_tells_a_follow_up_from_a_first_question() -> None:
    from fleetgate.cache.keys import follows_user_turns

    system = {"role": "system", "content": "You are terse."}
    first = {"role": "user", "content": "I use Windows."}
    reply = {"role": "assistant", "content": "Noted."}
    last = {"role": "user", "content": "How do I take a screenshot?"}
    assert not follows_user_turns([system, last])
    assert not follows_user_turns([last])
    assert follows_user_turns([system, first, reply, last])
    assert not follows_user_turns(None)
