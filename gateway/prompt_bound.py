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

Cost: one pass over the body's containers (strings are measured by C calls, not per character): about
10-30 us for ordinary chat requests (`fleetgate bench estimate` measures it).
"""

from __future__ import annotations

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
        media = sum(n * profile.tokens_per_media.get(kind, max(profile.tokens_per_media.values(), default=0))
                    for kind, n in self.media.items())
        fixed = profile.tokens_per_request if self.templated else PROMPT_SPECIAL_TOKENS
        return self.bytes + self.token_ids + media + self.messages * profile.tokens_per_message + fixed

    def typical(self, profile: PromptProfile) -> int:
        """A rough count (about 4 bytes a token, template markers at 5 a message), never above `bound`."""
        media = sum(self.media.values()) * 256
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


def add_json(tally: PromptTally, value: Any, depth: int = 0) -> None:
    """Count `value` as a template's `tojson(indent=JSON_INDENT)` could render it."""
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
                add_json(tally, call, 1)
        elif key in TEXT_FIELDS:
            add_text(tally, value, 1)
        else:
            add_json(tally, value, 1)


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
            add_json(shared, value)
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
    typical = sum(min(t.typical(profile), b) for t, b in zip(tallies, bounds, strict=True))
    return PromptBound(tokens=sum(bounds), typical=typical, prompts=len(tallies))
