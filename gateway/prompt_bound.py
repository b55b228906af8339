"""An upper bound on the prompt tokens an engine will read for a request, safe by construction and cheap.

The engine tokenizes what its chat template renders from the request. The bound counts *everything* in the
body the template could render, not only the content kinds the gateway knows: a denylist (`NOT_RENDERED`)
names the fields that never reach the prompt (sampling parameters), every other field is counted, so a
content kind added tomorrow (`thinking` and `refusal` parts, tool definitions, assistant `tool_calls`,
`name` fields, `documents`, template kwargs ...) is counted before anyone knows it exists.

Per field, in bytes, which bound tokens (below):
- a string rendered as text (message content, names, reasoning): its UTF-8 bytes, + 1 per string (a
  SentencePiece tokenizer may start each separately tokenized piece with a word-boundary token);
- anything else is bounded as the template's `tojson` could render it: compact JSON bytes of every string
  (quotes and escapes included: a control character is 6 bytes as `\\u0001`), key and number, plus per
  element a separator space, a newline and the indentation of `tojson(indent=JSON_INDENT)` at its depth
  (Llama 3.1 renders tool definitions that way). Message content given as a list of parts is bounded this
  way too (some templates render tool results with `tojson`);
- a tool call's `arguments` string is parsed (vLLM hands templates the parsed object) and bounded as JSON;
- media parts (`image_url`, `input_audio`, `video_url`, ... `MEDIA`): the profile's tokens per item of the
  modality, not the bytes of their payload (the engine turns an image into placeholder tokens, it does not
  read its base64); their other fields count as JSON;
- token-id prompts (`/v1/completions`): exactly their length.

Bytes bound tokens because every token of a byte-level BPE (Llama 3, Qwen, GPT) covers at least one byte of
the text it tokenizes, and every SentencePiece piece (Gemma, Mistral) at least one character, or one byte
under byte fallback. A tokenizer may normalise first: the bytes of a non-ASCII string are taken as the
largest of its raw, NFC and NFKC forms (NFKC turns U+FDFA, 3 bytes, into 33). Then the template's own text:
`tokens_per_message` per message (turn markers) and `tokens_per_request` (BOS, generation prompt, default
system text, tool-use instructions: about 100 tokens in Llama 3.1 and Qwen 2.5 templates with tools).

Assumptions (`docs/guides/budgets.md` has the overrun bound when one fails): the tokenizer's normaliser is
none, NFC, NFKC or a whitespace replacement; the template renders each request field at most once and adds at
most the profile's fixed text; a media item costs at most the profile's tokens for its modality; the engine
does not accept a request's own `chat_template` (vLLM's default). A prompt longer than the model's context
is refused by the engine (no charge), so each prompt's bound is capped at the context length when it is known.

`typical` is a rough count (about 4 bytes a token), never above the bound: what a request whose engine
reported no usage is charged.

Cost: one pass over the messages and their content parts (strings are measured by C calls, not per
character); tool definitions and other JSON documents are measured from two orjson serialisations
(`_json_at_c_speed`). A few microseconds for a short chat, about 15 for 10 turns with 5 tools
(`fleetgate bench estimate`, `docs/reports/prompt-bound.md`).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

JSON_INDENT = 4  # the widest `tojson(indent=...)` in common templates (Llama 3.1's tool definitions)
PROMPT_SPECIAL_TOKENS = 2  # a completion prompt: BOS (and EOS, for tokenizers that add one)

# Request fields that never reach the prompt: sampling, output and transport parameters.
NOT_RENDERED = frozenset({
    "model", "stream", "stream_options", "max_tokens", "max_completion_tokens", "n", "best_of", "temperature",
    "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "presence_penalty", "frequency_penalty",
    "repetition_penalty", "length_penalty", "logit_bias", "logprobs", "top_logprobs", "prompt_logprobs", "echo",
    "user", "ignore_eos", "min_tokens", "skip_special_tokens", "spaces_between_special_tokens",
    "include_stop_str_in_output", "truncate_prompt_tokens", "priority", "request_id", "cache_salt",
    "return_tokens_as_token_ids", "return_token_ids", "allowed_token_ids", "bad_words", "use_beam_search",
    "parallel_tool_calls", "structured_outputs", "guided_json", "guided_regex", "guided_choice",
    "guided_grammar", "guided_decoding_backend", "guided_whitespace_pattern", "metadata", "store",
    "service_tier", "kv_transfer_params", "vllm_xargs", "add_generation_prompt", "continue_final_message",
    "add_special_tokens", "stream_interval",
})
# Content part types whose payload the engine turns into placeholder tokens: type -> (modality, payload field).
MEDIA = {
    "image_url": ("image", "image_url"), "input_image": ("image", "image_url"), "image_pil": ("image", "image_pil"),
    "image_embeds": ("image", "image_embeds"), "image": ("image", "source"),  # the last: Anthropic's shape
    "audio_url": ("audio", "audio_url"), "input_audio": ("audio", "input_audio"),
    "audio_embeds": ("audio", "audio_embeds"), "video_url": ("video", "video_url"),
    "video_embeds": ("video", "video_embeds"),
}
TEXT_FIELDS = frozenset({"role", "content", "name", "reasoning", "reasoning_content", "thinking", "tool_call_id"})


@dataclass(frozen=True, slots=True)
class PromptProfile:
    """What a model's chat template and processor add beyond the request's own text (tokens)."""

    tokens_per_message: int = 16
    tokens_per_request: int = 256
    tokens_per_media: Mapping[str, int] = field(
        default_factory=lambda: {"image": 16384, "audio": 16384, "video": 65536})


DEFAULT_PROFILE = PromptProfile()


@dataclass(slots=True)
class PromptTally:
    """What one prompt gives the engine to read, reduced to what bounds its tokens."""

    bytes: int = 0  # text and JSON bytes (worst normalisation), with per-string and per-element allowances
    messages: int = 0
    media: dict[str, int] = field(default_factory=dict)
    token_ids: int = 0  # an exact count (token-id prompts)
    templated: bool = True  # chat: the template's per-request text applies; a raw completion prompt: no

    def bound(self, profile: PromptProfile) -> int:
        fixed = profile.tokens_per_request if self.templated else PROMPT_SPECIAL_TOKENS
        total = self.bytes + self.token_ids + self.messages * profile.tokens_per_message + fixed
        if self.media:
            most = max(profile.tokens_per_media.values(), default=0)  # a modality the profile does not name
            total += sum(n * profile.tokens_per_media.get(kind, most) for kind, n in self.media.items())
        return total

    def typical(self) -> int:
        """A rough count (about 4 bytes a token, template markers at 5 a message), never above `bound`."""
        media = sum(self.media.values()) * 256 if self.media else 0
        return max(1, self.bytes // 4 + self.token_ids + media + self.messages * 5 + PROMPT_SPECIAL_TOKENS)


@dataclass(frozen=True, slots=True)
class PromptBound:
    """The bound of a whole request: `tokens` over all its prompts (each capped at the context)."""

    tokens: int
    typical: int
    prompts: int  # how many prompts the engine runs (a `/v1/completions` prompt list), each with n sequences


def text_bytes(s: str) -> int:
    """UTF-8 bytes of `s` after the most expanding normalisation a tokenizer may apply."""
    if s.isascii():
        return len(s)
    return max(len(s.encode()), len(unicodedata.normalize("NFKC", s).encode()),
               len(unicodedata.normalize("NFC", s).encode()))


def json_bytes(s: str) -> int:
    """Bytes of `s` as a JSON string (quotes, escapes) after the most expanding normalisation."""
    quoted = len(orjson.dumps(s))
    return quoted if s.isascii() else quoted + text_bytes(s) - len(s.encode())


# A media part or a message inside a JSON value: the value needs the walk (placeholders, turn markers).
_WALK_MARK = re.compile(rb'"type":"(?:' + b"|".join(k.encode() for k in MEDIA) + rb')"|"role":')


def _json_at_c_speed(tally: PromptTally, value: Any, depth: int) -> bool:
    """Count a container with no media part and no message inside from two orjson serialisations (C code).

    With L the compact length, P2 the length with `indent=2` and N its newlines: every line of the pretty
    form carries 2 spaces per level, so the sum S of line depths is at most (P2 - L - N) / 2, and the form
    with `indent=4` (what `tojson(indent=4)` writes) is P2 + 2S <= 2 P2 - L - N, plus 4 spaces per line for
    each level `depth` this value sits below the rendered root. One byte per element more (every `,`, `[`,
    `{` of the compact form, an upper bound on the elements) covers Python writing `1e+308` for `1e308`."""
    try:
        compact = orjson.dumps(value)
    except (TypeError, orjson.JSONEncodeError):
        return False  # an integer past 64 bits: the walk measures it
    if _WALK_MARK.search(compact):
        return False
    pretty = orjson.dumps(value, option=orjson.OPT_INDENT_2)
    lines = pretty.count(b"\n")
    elements = compact.count(b",") + compact.count(b"[") + compact.count(b"{") + 1
    size = 2 * len(pretty) - len(compact) - lines + JSON_INDENT * depth * (lines + 1) + elements
    if not compact.isascii():
        text = compact.decode()
        size += max(len(unicodedata.normalize("NFKC", text).encode()),
                    len(unicodedata.normalize("NFC", text).encode())) - len(compact)
    tally.bytes += size
    return True


def add_json(tally: PromptTally, value: Any, depth: int = 0, *, structured: bool = False) -> None:
    """Count `value` as a template's `tojson(indent=JSON_INDENT)` could render it. `structured`: a field that
    is usually a JSON document (tool definitions, tool-call arguments, template kwargs), measured at C speed
    unless it holds media or messages; content parts are walked (their text is measured string by string,
    never serialised whole)."""
    if structured and isinstance(value, Mapping | list) and value and _json_at_c_speed(tally, value, depth):
        return
    if isinstance(value, str):
        tally.bytes += json_bytes(value)
    elif isinstance(value, Mapping):
        kind = value.get("type")
        media = MEDIA.get(kind) if isinstance(kind, str) else None
        payload = None
        if media is not None:
            modality, payload = media
            tally.media[modality] = tally.media.get(modality, 0) + 1
        if "role" in value:  # a message nested anywhere (a messages-style API): its turn markers
            tally.messages += 1
        tally.bytes += 3 + JSON_INDENT * depth  # the braces, and the closing one's own indented line
        for key, item in value.items():
            if key == payload:
                continue  # the media payload: placeholder tokens, counted per item
            tally.bytes += 3 + JSON_INDENT * (depth + 1) + (json_bytes(key) if isinstance(key, str) else 8)
            add_json(tally, item, depth + 1)
    elif isinstance(value, list | tuple):
        tally.bytes += 3 + JSON_INDENT * depth
        for item in value:
            tally.bytes += 3 + JSON_INDENT * (depth + 1)
            add_json(tally, item, depth + 1)
    elif value is None or isinstance(value, bool):
        tally.bytes += 5
    elif isinstance(value, int | float):
        tally.bytes += len(repr(value))  # as json.dumps writes it
    else:
        tally.bytes += 8


def add_text(tally: PromptTally, value: Any, depth: int = 0) -> None:
    """Count a field a template renders as text; anything but a string is counted as JSON."""
    if isinstance(value, str):
        tally.bytes += text_bytes(value) + 1
    else:
        add_json(tally, value, depth)


def _arguments(value: Any) -> Any:
    """A tool call's `arguments` as the template gets it (vLLM parses the JSON string into an object)."""
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value
    return value


def add_message(tally: PromptTally, message: Any) -> None:
    """One chat message: its text fields as text, its tool calls and anything else as JSON."""
    tally.messages += 1
    if not isinstance(message, Mapping):
        add_json(tally, message)
        return
    for key, value in message.items():
        if not isinstance(value, str):
            tally.bytes += json_bytes(key)  # a structured value may be rendered with its name
        if key == "tool_calls" and isinstance(value, list):
            for call in value:
                function = call.get("function") if isinstance(call, Mapping) else None
                if isinstance(function, Mapping) and "arguments" in function:
                    call = {**call, "function": {**function, "arguments": _arguments(function["arguments"])}}
                add_json(tally, call, 1, structured=True)
        elif key in TEXT_FIELDS:
            add_text(tally, value, 1)
        else:
            add_json(tally, value, 1, structured=True)


def _prompt_tallies(prompt: Any) -> list[PromptTally]:
    """One tally per prompt of a `/v1/completions` (or embeddings) prompt: a string, token ids, or lists."""
    if isinstance(prompt, str):
        return [PromptTally(bytes=text_bytes(prompt) + 1, templated=False)]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        return [PromptTally(token_ids=len(prompt), templated=False)]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str | list) for p in prompt):
        return [t for p in prompt for t in _prompt_tallies(p)]
    tally = PromptTally(templated=False)
    add_json(tally, prompt)
    return [tally]


def bound_request(
    body: Mapping[str, Any], *, prompts_field: str | None, profile: PromptProfile = DEFAULT_PROFILE,
    context: int | None = None,
) -> PromptBound:
    """The bound for any request shape. `prompts_field`: the field that holds a list of independent prompts
    or token ids (`prompt` for `/v1/completions`, `input` for `/v1/embeddings`); None when the whole body is
    one templated prompt (chat, and any messages-style API: every field but `NOT_RENDERED` is counted, and a
    `messages` list message by message). A prompt above `context` is refused by the engine: capped there."""
    shared = PromptTally(templated=prompts_field is None)
    for key, value in body.items():
        if key in NOT_RENDERED or key == prompts_field:
            continue
        if key == "messages" and isinstance(value, list):
            for message in value:
                add_message(shared, message)
        elif key in ("system", "instructions") and isinstance(value, str):
            add_text(shared, value)
        else:
            shared.bytes += json_bytes(key)  # a template may render it with its name
            add_json(shared, value, structured=True)
    if prompts_field is None:
        tallies = [shared]
    else:  # every prompt carries what the rest of the body adds (e.g. `prompt_embeds`)
        tallies = _prompt_tallies(body.get(prompts_field))
        for t in tallies:
            t.bytes += shared.bytes
            for kind, n in shared.media.items():
                t.media[kind] = t.media.get(kind, 0) + n
    bounds = [t.bound(profile) for t in tallies]
    if context is not None:
        bounds = [min(b, context) for b in bounds]
    typical = sum(min(t.typical(), b) for t, b in zip(tallies, bounds, strict=True))
    return PromptBound(tokens=sum(bounds), typical=typical, prompts=len(tallies))
