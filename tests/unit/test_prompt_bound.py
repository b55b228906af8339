"""The prompt bound against the worst an engine can read, for every content kind (issue 26, defects 1-2).

The truth here is a hostile chat template of our own (`tests/data/templates/render_everything.jinja`): it
renders every field of every message and every field vLLM hands a template, structured values with
`tojson(indent=4)` as Llama 3.1 renders its tools, after vLLM's own preprocessing (media parts become
placeholders, tool-call arguments are parsed). Its output is counted by the worst tokenizer there can be:
one token per UTF-8 byte of the text after the most expanding normalisation (NFKC or NFC), template
markers as single special tokens, each media placeholder as the profile's tokens for its modality. The real
Gemma 3 template and tokenizer are checked in `tests/e2e/test_real_engine_budgets.py`.
"""

from __future__ import annotations

import contextlib
import json
import unicodedata
from pathlib import Path
from typing import Any

import jinja2
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleetgate.gateway.estimate import estimate_body
from fleetgate.gateway.prompt_bound import (
    DEFAULT_PROFILE,
    MEDIA,
    NOT_RENDERED,
    PromptProfile,
    PromptTally,
    add_json,
    bound_request,
    text_bytes,
)

TEMPLATE = (Path(__file__).parents[1] / "data" / "templates" / "render_everything.jinja").read_text()
MARKERS = ("<|turn|>", "<|end|>", "<|preamble|>", "<bos>")
PROFILE = PromptProfile(tokens_per_message=16, tokens_per_request=256,
                        tokens_per_media={"image": 300, "audio": 200, "video": 1000})


def _env() -> jinja2.Environment:
    env = jinja2.Environment(autoescape=False)  # a chat template renders plain text
    # As transformers' chat-template environment defines it (ensure_ascii off, indent as asked).
    env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
    return env


RENDER = _env().from_string(TEMPLATE)


def _vllm_view(message: dict[str, Any], media: list[str]) -> dict[str, Any]:
    """A message as vLLM hands it to the template: media parts as placeholders, tool-call arguments parsed."""
    out = dict(message)
    content = message.get("content")
    if isinstance(content, list):
        parts = []
        for part in content:
            kind = part.get("type") if isinstance(part, dict) else None
            if isinstance(kind, str) and kind in MEDIA:
                modality, payload = MEDIA[kind]
                media.append(modality)
                parts.append({"type": modality, **{k: v for k, v in part.items() if k not in ("type", payload)}})
            else:
                parts.append(part)
        out["content"] = parts
    if isinstance(message.get("tool_calls"), list):
        calls = []
        for call in message["tool_calls"]:
            fn = dict(call.get("function", {}))
            if isinstance(fn.get("arguments"), str):
                with contextlib.suppress(ValueError):
                    fn["arguments"] = json.loads(fn["arguments"])
            calls.append({**call, "function": fn})
        out["tool_calls"] = calls
    return out


def worst_tokens(body: dict[str, Any], profile: PromptProfile = PROFILE) -> int:
    """The most tokens any tokenizer could make of what the hostile template renders from `body`."""
    media: list[str] = []
    messages = [_vllm_view(m, media) for m in body["messages"]]
    extra = {k: v for k, v in body.items() if k not in NOT_RENDERED and k not in ("messages", "tools", "documents")}
    text = RENDER.render(messages=messages, tools=body.get("tools"), documents=body.get("documents"), extra=extra,
                         bos_token="<bos>", add_generation_prompt=True)
    for marker in MARKERS:
        text = text.replace(marker, "\x00")  # a special token: one token
    worst = max(len(text.encode()), len(unicodedata.normalize("NFKC", text).encode()),
                len(unicodedata.normalize("NFC", text).encode()))
    return worst + sum(profile.tokens_per_media[m] for m in media)


def bound(body: dict[str, Any], profile: PromptProfile = PROFILE, context: int | None = None) -> int:
    return bound_request(body, prompts_field=None, profile=profile, context=context).tokens


WORDS = " ".join(f"word{i}" for i in range(3000))
ODD = "\U0001f9ea\u0bf8\ufdfa\u2e3b" * 250  # 4-byte emoji, 3-byte Tamil, U+FDFA (NFKC: 33 bytes), a long dash
TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the weather " * 40,
    "parameters": {"type": "object", "properties": {f"p{i}": {"type": "string", "enum": ["a", "b", "c"],
                                                               "description": "x" * 20} for i in range(30)},
                   "required": [f"p{i}" for i in range(30)]}}}
CALL = {"id": "call_1", "type": "function", "function": {"name": "get_weather",
                                                         "arguments": orjson.dumps({"p": [1] * 200}).decode()}}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 5000}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "B" * 5000, "format": "wav"}}
VIDEO = {"type": "video_url", "video_url": {"url": "https://example.com/v.mp4"}}


def user(content: Any, **extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": content, **extra}


KINDS: dict[str, dict[str, Any]] = {
    "text": {"messages": [user(WORDS)]},
    "text part": {"messages": [user([{"type": "text", "text": WORDS}])]},
    "thinking part": {"messages": [{"role": "assistant", "content": [{"type": "thinking", "thinking": WORDS}]},
                                   user("go on")]},
    "refusal part": {"messages": [{"role": "assistant", "content": [{"type": "refusal", "refusal": WORDS}]},
                                  user("why")]},
    "unknown part type": {"messages": [user([{"type": "tomorrows_kind", "payload": {"deep": [WORDS]}}])]},
    "image_url": {"messages": [user([{"type": "text", "text": "what is this"}, *[IMAGE] * 40])]},
    "input_audio": {"messages": [user([AUDIO] * 5)]},
    "video_url": {"messages": [user([VIDEO] * 3)]},
    "tools": {"tools": [TOOL] * 20, "tool_choice": "auto", "messages": [user("weather?")]},
    "assistant tool_calls": {"messages": [user("hi"),
                                          {"role": "assistant", "content": None, "tool_calls": [CALL] * 8}]},
    "tool message": {"messages": [user("hi"), {"role": "tool", "tool_call_id": "call_1", "content": WORDS}]},
    "tool message parts": {"messages": [user("hi"), {"role": "tool", "tool_call_id": "c",
                                                     "content": [{"type": "text", "text": WORDS}] * 3}]},
    "name fields": {"messages": [user("x", name="n" * 2000), {"role": "system", "content": "s", "name": ODD}]},
    "reasoning field": {"messages": [{"role": "assistant", "content": "ok", "reasoning": WORDS}, user("more")]},
    "documents and template kwargs": {"messages": [user("sum up")], "documents": [{"title": "t", "text": WORDS}],
                                      "chat_template_kwargs": {"enable_thinking": True, "extra": ODD}},
    "odd unicode": {"messages": [user(ODD), user([{"type": "text", "text": ODD}])]},
    "control characters in tools": {"tools": [{"type": "function", "function": {"name": "f",
                                                                                 "description": "\x01" * 3000}}],
                                    "messages": [user("x")]},
    "many tiny messages": {"messages": [user("x")] * 200},
    "response_format": {"messages": [user("json")], "response_format": {"type": "json_schema",
                                                                        "json_schema": TOOL["function"]}},
}


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_bound_covers_the_worst_rendering_of_every_content_kind(kind: str) -> None:
    body = {"model": "m", "max_tokens": 5, **KINDS[kind]}
    assert bound(body) >= worst_tokens(body), kind


def test_the_issue_repro_a_thinking_part_is_counted_like_text() -> None:
    """3,000 words as a `thinking` part got 200 and 3,006 prompt tokens where the same as text got 429."""
    as_text = bound({"messages": [user(WORDS)]})
    as_thinking = bound(KINDS["thinking part"])
    assert as_thinking >= as_text > 3000 * 4


def test_unicode_that_tokenizes_at_four_tokens_a_character_is_bounded_by_its_bytes() -> None:
    """990 characters were estimated at 263 tokens (4 characters a token); vLLM read 3,964."""
    text = "\U0001f9ea" * 990
    assert text_bytes(text) == 3960 and bound({"messages": [user(text)]}) >= 3964


def test_nfkc_expansion_is_counted() -> None:
    assert text_bytes("\ufdfa") == len(unicodedata.normalize("NFKC", "\ufdfa").encode()) == 33


def test_each_prompt_is_capped_at_the_context_the_engine_refuses_beyond() -> None:
    body = {"model": "m", "prompt": [WORDS, "short", [1, 2, 3]]}
    capped = bound_request(body, prompts_field="prompt", context=1000)
    assert capped.prompts == 3 and capped.tokens == 1000 + (len("short") + 1 + 2) + (3 + 2)
    assert bound({"messages": [user(WORDS)]}, context=512) == 512


def test_token_id_prompts_are_exact_and_prompt_lists_count_each_prompt() -> None:
    assert bound_request({"prompt": [5] * 70}, prompts_field="prompt").tokens == 70 + 2
    five = bound_request({"prompt": ["abcd efgh"] * 5}, prompts_field="prompt")
    one = bound_request({"prompt": "abcd efgh"}, prompts_field="prompt")
    assert (five.prompts, five.tokens) == (5, 5 * one.tokens)
    ids = bound_request({"prompt": [[1, 2], [3, 4, 5]]}, prompts_field="prompt")
    assert (ids.prompts, ids.tokens) == (2, (2 + 2) + (3 + 2))


def test_typical_is_a_rough_count_never_above_the_bound() -> None:
    for body in KINDS.values():
        b = bound_request(body, prompts_field=None)
        assert 1 <= b.typical <= b.tokens
    plain = bound_request({"messages": [user("one two three four five six seven eight")]}, prompts_field=None)
    assert plain.typical < 30  # about what a real tokenizer says (9 words, the turn markers)


def test_sequences_and_prompts_for_other_request_shapes() -> None:
    chat = estimate_body({"messages": [user("hi")], "n": 50}, prompts_field=None)
    assert (chat.sequences, chat.prompts) == (50, 1)
    completions = estimate_body({"prompt": ["a", "b", "c"], "n": 2, "best_of": 5}, prompts_field="prompt")
    assert (completions.sequences, completions.prompts) == (15, 3)
    embeddings = estimate_body({"input": ["a b", [1, 2, 3]]}, prompts_field="input")
    assert embeddings.prompts == 2 and embeddings.prompt_tokens == (4 + 2) + (3 + 2)
    # Anthropic's /v1/messages: system text, content blocks, an image block, tool_use input: all counted
    anthropic = {"model": "m", "max_tokens": 9, "system": WORDS, "tools": [TOOL], "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "base64", "data": "A" * 9000}}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f", "input": {"q": WORDS}}]}]}
    b = bound_request(anthropic, prompts_field=None, profile=PROFILE)
    assert b.tokens >= 2 * len(WORDS) + PROFILE.tokens_per_media["image"]
    anthropic["messages"][0]["content"][0]["source"]["data"] = "A"  # an image's bytes are not its tokens
    assert bound_request(anthropic, prompts_field=None, profile=PROFILE).tokens == b.tokens


def test_the_default_profile_is_used_unless_a_model_says_otherwise() -> None:
    body = {"messages": [user([IMAGE])]}
    assert bound(body, profile=DEFAULT_PROFILE) >= DEFAULT_PROFILE.tokens_per_media["image"]
    assert bound(body, profile=PROFILE) < DEFAULT_PROFILE.tokens_per_media["image"]


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)
_json = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                     | _text, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_text, inner, max_size=4),
                     max_leaves=12)
_part = st.one_of(
    st.builds(lambda t: {"type": "text", "text": t}, _text),
    st.builds(lambda t: {"type": "thinking", "thinking": t}, _text),
    st.builds(lambda t: {"type": "refusal", "refusal": t}, _text),
    st.just(IMAGE), st.just(AUDIO), st.just(VIDEO),
    st.builds(lambda k, v: {"type": k, "value": v}, _text, _json),
)
_message = st.builds(
    lambda role, content, name, extra: {"role": role, "content": content,
                                        **({"name": name} if name is not None else {}), **extra},
    st.sampled_from(["system", "user", "assistant", "tool"]),
    st.one_of(_text, st.lists(_part, max_size=4)),
    st.none() | _text,
    st.dictionaries(st.sampled_from(["reasoning", "tool_call_id", "x_custom"]), _json, max_size=2),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=st.lists(_message, min_size=1, max_size=6), tools=st.none() | st.lists(_json, max_size=3),
       kwargs=st.none() | st.dictionaries(_text, _json, max_size=3))
def test_fuzzed_requests_never_exceed_the_bound(messages: list[dict[str, Any]], tools: Any, kwargs: Any) -> None:
    body: dict[str, Any] = {"model": "m", "messages": messages}
    if tools is not None:
        body["tools"] = tools
    if kwargs is not None:
        body["chat_template_kwargs"] = kwargs
    assert bound(body) >= worst_tokens(body)


@settings(max_examples=400, deadline=None)
@given(value=st.lists(_json, min_size=1, max_size=4) | st.dictionaries(_text, _json, min_size=1, max_size=4),
       depth=st.integers(0, 3))
def test_json_documents_measured_at_c_speed_cover_their_indented_rendering(value: Any, depth: int) -> None:
    """Tool definitions and other JSON documents are measured from two orjson serialisations, not walked:
    still at least `tojson(indent=4)` of the value, nested `depth` levels below the rendered root."""
    tally = PromptTally(templated=False)
    try:
        orjson.dumps(value)
    except TypeError:
        return  # integers past 64 bits never come out of a parsed request body
    add_json(tally, value, depth, structured=True)
    first, *rest = json.dumps(value, ensure_ascii=False, indent=4).split("\n")  # the first line follows its key
    text = "\n".join([first, *(" " * (4 * depth) + line for line in rest)])
    worst = max(len(text.encode()), len(unicodedata.normalize("NFKC", text).encode()),
                len(unicodedata.normalize("NFC", text).encode()))
    assert tally.bytes >= worst
