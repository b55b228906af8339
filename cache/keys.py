"""Cache keys: what a cached answer may be reused for.

Inputs: a `CacheRequest` (tenant, concrete model, kind, the client's body).

- `params`: every body field except the conversation itself and the fields that cannot change the
  output (`TRANSPORT_FIELDS`: stream, stream_options, user, metadata, ...). A deny-list, not an
  allow-list, so an unknown field (a new sampling knob) separates entries instead of being ignored.
- `partition` = sha256(canonical JSON of [tenant, model, kind, params, prefix]) where `prefix` is every
  turn before the last one (system prompt and earlier turns, verbatim): chat and Anthropic `messages`, or a
  Responses `input` (which holds the whole stored conversation of a follow-up; its `previous_response_id`
  and `instructions` are params). For completions the prefix is empty. A semantic hit never crosses a
  partition, so two requests can only share an answer when tenant, model, parameters, system prompt and the
  whole history are identical.
- `exact` = sha256(partition, canonical JSON of the last message) (or of the prompt).
- `semantic_text`: the last message's text when it is a plain user message (string content or text parts
  only); `None` otherwise (tool results, images, assistant prefill, a Responses follow-up), which makes the
  request exact-only.

Canonical JSON: keys sorted, no whitespace (orjson), so key order in the client's body does not matter.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from fleetgate.cache.types import CacheRequest

TRANSPORT_FIELDS = frozenset(
    {"messages", "prompt", "model", "stream", "stream_options", "user", "metadata", "store", "service_tier"}
)


@dataclass(frozen=True, slots=True)
class CacheKeys:
    partition: str
    exact: str
    semantic_text: str | None


def _canonical(value: Any) -> bytes:
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


def output_params(body: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k not in TRANSPORT_FIELDS}


def message_text(message: Mapping[str, Any]) -> str | None:
    """Plain text of a user message; None when it holds anything but text."""
    if message.get("role") != "user" or set(message) - {"role", "content", "name"}:
        return None
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list) and content:
        texts: list[str] = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                return None
            texts.append(part["text"])
        return "\n".join(texts)
    return None


def follows_user_turns(messages: Any) -> bool:
    """Whether the last message follows earlier user turns: a follow-up in a conversation (the verifier's
    pair model weighs such short, context-bound messages apart)."""
    return isinstance(messages, list) and any(
        isinstance(m, Mapping) and m.get("role") == "user" for m in messages[:-1])


def _conversation(req: CacheRequest) -> list[Any] | None:
    """The turns of a conversation-shaped request (chat and messages: `messages`; responses: `input` items,
    a string being one user turn); None for a prompt-shaped one (completions)."""
    body = req.body
    if req.kind == "responses":
        value = body.get("input")
        return [{"role": "user", "content": value}] if isinstance(value, str) else list(value or [])
    if req.kind in ("chat", "messages"):
        messages = body.get("messages")
        return messages if isinstance(messages, list) else []
    return None


def _last_text(req: CacheRequest, last: Any) -> str | None:
    """The last turn's text for the semantic layer; None makes the request exact-only: a stateful Responses
    follow-up (its whole input must match) and any turn that is not a plain user text."""
    if not isinstance(last, Mapping) or (req.kind == "responses" and req.body.get("previous_response_id")):
        return None
    if req.kind == "responses" and last.get("type", "message") == "message":
        parts = last.get("content")
        if isinstance(parts, list) and all(isinstance(p, Mapping) and p.get("type") == "input_text" for p in parts):
            last = {"role": last.get("role"), "content": [{"type": "text", "text": p.get("text")} for p in parts]}
        else:
            last = {k: v for k, v in last.items() if k != "type"}
    return message_text(last)


def cache_keys(req: CacheRequest) -> CacheKeys:
    body = req.body
    params = output_params(body)
    if req.kind == "responses":
        params.pop("input", None)
    head = _canonical([req.tenant, req.model, req.kind, params])
    turns = _conversation(req)
    if turns is not None:
        prefix, last = turns[:-1], (turns[-1] if turns else None)
        partition = _digest(head, _canonical(prefix))
        return CacheKeys(partition=partition, exact=_digest(partition.encode(), _canonical(last)),
                         semantic_text=_last_text(req, last))
    partition = _digest(head, b"completions")
    return CacheKeys(partition=partition, exact=_digest(partition.encode(), _canonical(body.get("prompt"))),
                     semantic_text=None)


def owns(record: Mapping[str, Any], req: CacheRequest, keys: CacheKeys) -> bool:
    """Whether a stored record belongs to the request's tenant and partition (it may be served to it)."""
    return record.get("tenant") == req.tenant and record.get("partition") == keys.partition
