"""Request parsing: what the gateway extracts, and what it rejects with 400."""

from __future__ import annotations

import orjson
import pytest

from fleetgate.core.errors import InvalidRequestError
from fleetgate.gateway.context import request_id_from
from fleetgate.gateway.parsing import estimate_prompt_tokens, parse_request


def raw(**body: object) -> bytes:
    return orjson.dumps(body)


def test_chat_fields_and_stable_prompt_text() -> None:
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "image_url", "image_url": {}},
                                     {"type": "text", "text": "there"}]},
    ]
    p = parse_request("chat", raw(model="m", messages=messages, stream=True,
                                  stream_options={"include_usage": True}, max_completion_tokens=7, user="u1"))
    assert (p.model, p.stream, p.include_usage, p.continuous_usage, p.max_tokens) == ("m", True, True, False, 7)
    assert p.prompt_text == "<|system|>be brief\n<|user|>hi there\n"
    assert p.session_key == "u1"
    again = parse_request("chat", raw(model="m", messages=messages))
    assert again.prompt_text == p.prompt_text and again.stream is False


def test_session_header_wins_over_user_field() -> None:
    p = parse_request("chat", raw(model="m", messages=[{"role": "user", "content": "x"}], user="u"),
                      session_header="s")
    assert p.session_key == "s"


@pytest.mark.parametrize(
    ("prompt", "text"),
    [("abc", "abc"), (["a", "b"], "a\nb"), ([1, 2, 3], "1 2 3")],
)
def test_completion_prompts(prompt: object, text: str) -> None:
    p = parse_request("completions", raw(model="m", prompt=prompt, max_tokens=3))
    assert p.prompt_text == text and p.max_tokens == 3


def deep(levels: int) -> object:
    value: object = 0
    for _ in range(levels):
        value = [value]
    return value


@pytest.mark.parametrize(
    ("kind", "body", "param"),
    [
        ("chat", b"nope", None),
        ("chat", b'"string"', None),
        ("chat", raw(model="", messages=[{"role": "user"}]), "model"),
        ("chat", raw(model=3, messages=[{"role": "user"}]), "model"),
        ("chat", raw(model="m", messages={"role": "user"}), "messages"),
        ("chat", raw(model="m", messages=[{"content": "no role"}]), "messages[0].role"),
        ("chat", raw(model="m", messages=[{"role": "wizard", "content": "x"}]), "messages[0].role"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": 3}]), "messages[0].content"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": [{"type": "text"}]}]),
         "messages[0].content[0].text"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": ["x"]}]), "messages[0].content[0]"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": "x"}, 5]), "messages[1]"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": "x"}], temperature="abc"), "temperature"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": "x"}], temperature=2.5), "temperature"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": "x"}], top_p=-0.1), "top_p"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": "x"}], n=129), "n"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": "x"}], stop=[1]), "stop"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": "x"}], max_completion_tokens="9"),
         "max_completion_tokens"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": "x"}], presence_penalty=3), "presence_penalty"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": "x"}], logit_bias={"5": 101}), "logit_bias.5"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": "x"}], user=["u"]), "user"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": "x"}], stream=True,
                     stream_options={"include_usage": "yes"}), "stream_options.include_usage"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": "x"}], tools=[{"function": {}}]),
         "tools[0].type"),
        ("completions", raw(model="m", prompt="x", logprobs=True), "logprobs"),
        ("completions", raw(model="m", prompt="x", echo="no"), "echo"),
        ("chat", raw(model="m", messages=[{"role": "user", "content": "x"}])[:-1] + b',"x":' + b"[" * 300 + b"]" * 300
         + b"}", None),  # parses (orjson reads 1024 levels) but could not be re-serialised downstream
        ("chat", raw(model="m", messages=[{"role": "wizard", "content": "x"}])[:-1] + b',"x":' + b"[" * 300
         + b"]" * 300 + b"}", None),  # the depth is checked first
        ("chat", raw(model="m", messages=[{"role": "user"}], max_tokens=0), "max_tokens"),
        ("chat", raw(model="m", messages=[{"role": "user"}], max_tokens=True), "max_tokens"),
        ("chat", raw(model="m", messages=[{"role": "user"}], n=0), "n"),
        ("chat", raw(model="m", messages=[{"role": "user"}], stream=1), "stream"),
        ("chat", raw(model="m", messages=[{"role": "user"}], stream=True, stream_options=[1]), "stream_options"),
        ("completions", raw(model="m"), "prompt"),
        ("completions", raw(model="m", prompt=[]), "prompt"),
        ("completions", raw(model="m", prompt=["a", 1]), "prompt"),
    ],
)
def test_rejections_name_the_parameter(kind: str, body: bytes, param: str | None) -> None:
    with pytest.raises(InvalidRequestError) as info:
        parse_request(kind, body)  # type: ignore[arg-type]
    assert info.value.param == param
    assert info.value.status == 400


def test_engine_specific_fields_and_lenient_shapes_pass_through() -> None:
    body = raw(model="m", messages=[{"role": "system", "content": "s"},
                                    {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                 {"type": "image_url", "image_url": {"url": "x"}}]},
                                    {"role": "assistant", "content": None, "tool_calls": []},
                                    {"role": "tool", "content": "r", "tool_call_id": "1"}],
               top_k=5, min_p=0.1, guided_json={"type": "object"}, temperature=0, top_p=1, n=2, stop="x",
               logprobs=True, top_logprobs=3, seed=-1, extra=deep(60))
    p = parse_request("chat", body)
    assert p.body["top_k"] == 5 and p.body["guided_json"] == {"type": "object"}
    assert "<|assistant|>" in p.prompt_text
    assert parse_request("completions", raw(model="m", prompt=[[1, 2], [3]])).prompt_text == "1 2\n3"


def test_deep_nesting_is_a_400_without_recursion() -> None:
    body = b'{"model":"m","messages":[{"role":"user","content":"x"}],"x":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(InvalidRequestError) as info:
        parse_request("chat", body)
    assert info.value.status == 400


def test_estimate_is_rough_but_positive() -> None:
    assert estimate_prompt_tokens("") == 1
    assert estimate_prompt_tokens("x" * 400) == 100


@pytest.mark.parametrize(
    ("given", "kept"),
    [("abc-123", True), ("x" * 128, True), ("x" * 129, False), ("bad\nid", False), ("é", False), ("", False)],
)
def test_request_id_accepts_only_sane_client_ids(given: str, kept: bool) -> None:
    rid = request_id_from({"x-request-id": given})
    assert (rid == given) is kept
    assert rid and rid.isascii()
    assert request_id_from({}) != request_id_from({})


def test_upstream_body_is_forwarded_unchanged_unless_it_must_be_rewritten() -> None:
    from fleetgate.gateway.forwarding import upstream_body

    raw_body = b'{"model": "m", "prompt": "x",   "extra_engine_field": 1}'
    p = parse_request("completions", raw_body)
    assert upstream_body(p.body, served_name="m", stream=False, raw=p.raw) is raw_body
    renamed = orjson.loads(upstream_body(p.body, served_name="org/m", stream=False, raw=p.raw))
    assert renamed == {"model": "org/m", "prompt": "x", "extra_engine_field": 1}
    streamed = orjson.loads(upstream_body(p.body, served_name="m", stream=True, raw=p.raw))
    assert streamed["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert p.body == {"model": "m", "prompt": "x", "extra_engine_field": 1}  # the parsed body is not mutated
