"""Parsing and validating an OpenAI request body into a `ParsedRequest`.

The OpenAI fields are validated (`validation`: types, ranges, roles, content parts, nesting depth);
every other field is passed to the engine untouched, so engine-specific fields keep working.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import orjson

from fleetgate.core.errors import InvalidRequestError
from fleetgate.gateway.validation import validate_body

# The request kinds: chat and completions are parsed here; the other API routes parse their own (`api_route`).
Kind = Literal["chat", "completions", "responses", "messages", "embeddings"]


@dataclass(slots=True)
class ParsedRequest:
    kind: Kind
    body: dict[str, Any]
    model: str
    stream: bool
    include_usage: bool  # the client asked for the final usage chunk
    continuous_usage: bool  # the client asked for usage on every chunk (vLLM extension)
    max_tokens: int | None
    prompt_text: str  # stable serialisation of the prompt (prefix hashing, cache, tier scoring)
    session_key: str | None
    raw: bytes = b""  # the body as received (forwarded unchanged when nothing needs rewriting)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(
            str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text"
        )
    return "" if content is None else str(content)


def chat_prompt_text(messages: list[Any]) -> str:
    return "".join(f"<|{m.get('role', '')}|>{_text_of(m.get('content'))}\n" for m in messages)


def _prompt_text(kind: Kind, body: Mapping[str, Any]) -> str:
    """The prompt as one string; the body has passed `validate_body`, so the shapes are known."""
    if kind == "chat":
        return chat_prompt_text(body["messages"])
    prompt = body["prompt"]
    if isinstance(prompt, str):
        return prompt
    if all(isinstance(p, str) for p in prompt):
        return "\n".join(prompt)
    if all(isinstance(p, int) for p in prompt):
        return " ".join(str(p) for p in prompt)
    return "\n".join(" ".join(str(t) for t in p) for p in prompt)


def load_body(raw: bytes) -> dict[str, Any]:
    """A request body: a JSON object with a non-empty string `model`; 400 otherwise."""
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidRequestError(f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidRequestError("request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise InvalidRequestError("'model' is required and must be a non-empty string", param="model")
    return body


def parse_request(kind: Kind, raw: bytes, *, session_header: str | None = None) -> ParsedRequest:
    """Raise `InvalidRequestError` (400, naming the parameter) for anything the gateway cannot forward."""
    body = load_body(raw)
    validate_body(kind, body)
    stream = bool(body.get("stream"))
    options = body.get("stream_options") or {}
    max_tokens = body.get("max_completion_tokens") if kind == "chat" else None
    if max_tokens is None:
        max_tokens = body.get("max_tokens")
    user = body.get("user")
    return ParsedRequest(
        kind=kind,
        body=body,
        model=body["model"],
        stream=stream,
        include_usage=bool(options.get("include_usage")),
        continuous_usage=bool(options.get("continuous_usage_stats")),
        max_tokens=max_tokens,
        prompt_text=_prompt_text(kind, body),
        session_key=session_header or (user if isinstance(user, str) and user else None),
        raw=raw,
    )


def estimate_prompt_tokens(prompt_text: str) -> int:
    """A rough count for rate-limit reservations (about 4 characters per token); settled exactly later."""
    return max(1, len(prompt_text) // 4)
