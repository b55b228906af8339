"""`POST /v1/messages` (Anthropic's Messages API), proxied to the engine's own `/v1/messages`.

The key comes from `x-api-key` (Anthropic's header) or `Authorization: Bearer` (what Anthropic's SDKs send
for tokens); every error is Anthropic's JSON, `{"type": "error", "error": {"type", "message"}}`, with the
status the gateway would give any route (401, 403, 404, 429 with `Retry-After`, 502-504). Validation follows
Anthropic's reference for the fields it names (`max_tokens` is required, as there); content blocks are limited
to the kinds vLLM converts (text, image, tool_use, tool_result, thinking, ...); other fields pass through.

The reservation: the prompt bound of the request as vLLM renders it (it turns the request into a chat one:
`system` as a system turn, blocks as content parts, tool results as tool turns, tools in the chat tool shape,
which is what is measured) and `max_tokens`. Non-streaming requests are streamed from the engine and
assembled (`api_messages_events`), so a client that leaves is charged the prompt the engine reported and the
output it was seen to generate.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from fleetgate.core.errors import FleetGateError, InvalidRequestError
from fleetgate.core.types import Usage
from fleetgate.gateway.api_events import ApiEvents
from fleetgate.gateway.api_messages_events import MessagesEvents, error_type, messages_usage, replay_events
from fleetgate.gateway.api_route import TemplatedRoute, load_object, parsed_request
from fleetgate.gateway.engine_usage import parse_usage
from fleetgate.gateway.parsing import Kind, ParsedRequest, chat_prompt_text
from fleetgate.gateway.validation import (
    Check,
    boolean,
    check_fields,
    fail,
    int_in,
    number_in,
    obj,
    string,
)

ROLES = frozenset({"user", "assistant", "system"})  # "system": vLLM's extension (Claude Code's reminders)
BLOCKS = frozenset({"text", "image", "tool_use", "tool_result", "tool_reference", "thinking", "redacted_thinking",
                    "tool_addition", "tool_removal"})


def _blocks(param: str, value: Any, *, allowed: frozenset[str] = BLOCKS) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list):
        raise fail(param, "must be a string or a list of content blocks")
    for j, block in enumerate(value):
        if not isinstance(block, Mapping) or block.get("type") not in allowed:
            raise fail(f"{param}[{j}].type", f"must be one of {', '.join(sorted(allowed))}")
        if block["type"] == "text":
            string(f"{param}[{j}].text", block.get("text"))
        elif block["type"] == "tool_use":
            string(f"{param}[{j}].name", block.get("name"))
            obj(f"{param}[{j}].input", block.get("input"))


def _messages(param: str, value: Any) -> None:
    if not isinstance(value, list) or not value:
        raise fail(param, "must be a non-empty list")
    for i, message in enumerate(value):
        if not isinstance(message, Mapping):
            raise fail(f"{param}[{i}]", "must be an object")
        if message.get("role") not in ROLES:
            raise fail(f"{param}[{i}].role", f"must be one of {', '.join(sorted(ROLES))}")
        _blocks(f"{param}[{i}].content", message.get("content"))


def _system(param: str, value: Any) -> None:
    _blocks(param, value, allowed=frozenset({"text"}))


def _stop_sequences(param: str, value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise fail(param, "must be a list of strings")


def _tools(param: str, value: Any) -> None:
    if not isinstance(value, list):
        raise fail(param, "must be a list")
    for i, tool in enumerate(value):
        if not isinstance(tool, Mapping):
            raise fail(f"{param}[{i}]", "must be an object")
        string(f"{param}[{i}].name", tool.get("name"))
        obj(f"{param}[{i}].input_schema", tool.get("input_schema"))


def _typed(param: str, value: Any) -> None:
    obj(param, value)
    string(f"{param}.type", value.get("type"))


CHECKS: dict[str, Check] = {
    "messages": _messages,
    "system": _system,
    "max_tokens": int_in(1),
    "stop_sequences": _stop_sequences,
    "stream": boolean,
    "temperature": number_in(0, 1),
    "top_p": number_in(0, 1),
    "top_k": int_in(0),
    "tools": _tools,
    "tool_choice": _typed,
    "thinking": _typed,
    "metadata": obj,
}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(b.get("text") or b.get("thinking") or "") for b in content if isinstance(b, Mapping))
    return ""


def prompt_text(body: Mapping[str, Any]) -> str:
    system = f"<|system|>{_text(body['system'])}\n" if body.get("system") else ""
    return system + chat_prompt_text([{"role": m.get("role"), "content": _text(m.get("content"))}
                                      for m in body["messages"]])


def anthropic_error(exc: FleetGateError) -> bytes:
    return orjson.dumps({"type": "error", "error": {"type": error_type(exc.status), "message": exc.message}})


class MessagesRoute(TemplatedRoute):
    kind: Kind = "messages"
    path = "/v1/messages"

    def authorization(self, headers: Mapping[str, str]) -> str | None:
        key = headers.get("x-api-key")
        return f"Bearer {key}" if key else headers.get("authorization")

    def render_error(self, exc: FleetGateError) -> bytes:
        return anthropic_error(exc)

    def parse(self, raw: bytes, headers: Mapping[str, str]) -> ParsedRequest:
        body = load_object(raw)
        for required in ("messages", "max_tokens"):
            if body.get(required) is None:
                raise InvalidRequestError(f"'{required}' is required", param=required)
        check_fields(body, CHECKS)
        user = (body.get("metadata") or {}).get("user_id")
        return parsed_request(self.kind, body, raw, max_tokens=body["max_tokens"], prompt_text=prompt_text(body),
                              session_key=headers.get("x-session-id") or (user if isinstance(user, str) else None))

    def chat_tools(self, tools: list[Any]) -> list[Any]:
        """Tools as vLLM hands them to the chat template (it converts Anthropic's to this shape)."""
        return [{"type": "function", "function": {"name": t.get("name"), "description": t.get("description"),
                                                  "parameters": t.get("input_schema"), "strict": t.get("strict"),
                                                  "defer_loading": t.get("defer_loading")}}
                if isinstance(t, Mapping) else t for t in tools]

    def upstream_body(self, parsed: ParsedRequest, *, served: str, max_tokens: int | None) -> bytes:
        out = {**parsed.body, "model": served, "stream": True}
        if max_tokens is not None:
            out["max_tokens"] = max_tokens
        return orjson.dumps(out)

    def rewriter(self, parsed: ParsedRequest, *, endpoint_id: str, model_name: str | None, cap: int | None,
                 collect: bool) -> ApiEvents:
        return MessagesEvents(endpoint_id=endpoint_id, cap=cap, collect=collect, model_name=model_name)

    def is_answer(self, obj: dict[str, Any]) -> bool:
        return obj.get("type") == "message"

    def usage_of(self, obj: dict[str, Any]) -> Usage | None:
        return parse_usage(messages_usage(obj.get("usage")))

    def replay(self, parsed: ParsedRequest, response: dict[str, Any]) -> list[bytes]:
        return replay_events(response)
