"""`POST /v1/responses` (OpenAI's Responses API), proxied to the engine's own `/v1/responses`.

Validation follows OpenAI's reference for the fields it names (errors are OpenAI's JSON); other fields pass
through to vLLM. Input items are limited to the kinds vLLM renders (messages, function and custom tool calls
and their outputs, reasoning); `background` (vLLM needs its own store for it), `conversation` and `prompt`
(templates) are refused with a 400 that says so.

State: `previous_response_id` is resolved by the gateway, never by an engine (`conversations`: why). The
request's input becomes the stored conversation followed by its own items, before anything is estimated,
so the reservation and the cache key cover everything the engine reads; the engine gets `store: false`
and no `previous_response_id`. A completed response with `store` not false is stored before its last event
(or its body) reaches the client, so a follow-up sent the moment the answer arrives finds it, on any
replica. A follow-up's session key is its conversation's (the first response id, unless the client sent one):
the router's session scorer then prefers the replica whose prefix cache holds the conversation, without
depending on it. `GET` and `DELETE /v1/responses/{id}` read and remove stored responses, per tenant.

The reservation: the prompt bound of the body as the engine renders it (`instructions` as a system turn,
input items as messages, function tools in the chat tool shape vLLM converts them to), and
`max_output_tokens` (or what the context leaves; set upstream when the budget lowered it). Non-streaming
requests are streamed from the engine and collected (`api_pipeline`), so a client that leaves is charged
the output it was seen to get.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson

from fleetgate.core.errors import InvalidRequestError, NotFoundError
from fleetgate.core.types import Usage
from fleetgate.gateway.api_events import ApiEvents
from fleetgate.gateway.api_responses_events import ResponsesEvents, replay_events, responses_usage
from fleetgate.gateway.api_route import TemplatedRoute, load_object, parsed_request
from fleetgate.gateway.chat_views import as_items, chat_tool
from fleetgate.gateway.conversations import ConversationStore, StoredResponse, checked_id
from fleetgate.gateway.engine_usage import parse_usage
from fleetgate.gateway.parsing import Kind, ParsedRequest
from fleetgate.gateway.stages import Tenant
from fleetgate.gateway.validation import (
    Check,
    boolean,
    check_fields,
    fail,
    int_in,
    number_in,
    obj,
    string,
    tool_choice,
    tools_list,
)

ROLES = frozenset({"user", "assistant", "system", "developer"})
ITEM_TYPES = frozenset({"message", "function_call", "function_call_output", "reasoning", "custom_tool_call",
                        "custom_tool_call_output"})
TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
MAX_ITEMS = 10_000
UPSTREAM_DROPPED = ("previous_response_id", "stream_options")


def _refused(reason: str) -> Check:
    def check(param: str, value: Any) -> None:
        if value is not None and value is not False:
            raise fail(param, reason)

    return check


def _one_of(*values: str) -> Check:
    def check(param: str, value: Any) -> None:
        if value not in values:
            raise fail(param, f"must be one of {', '.join(values)}")

    return check


def _strings(param: str, value: Any) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise fail(param, "must be a list of strings")


def _content(param: str, content: Any) -> None:
    if isinstance(content, str):
        return
    if not isinstance(content, list):
        raise fail(param, "must be a string or a list of content parts")
    for j, part in enumerate(content):
        if not isinstance(part, Mapping) or not isinstance(part.get("type"), str):
            raise fail(f"{param}[{j}]", "must be an object with a string 'type'")
        if part["type"] in TEXT_PARTS and not isinstance(part.get("text"), str):
            raise fail(f"{param}[{j}].text", "must be a string")


def _item(param: str, item: Any) -> None:
    if not isinstance(item, Mapping):
        raise fail(param, "must be an object")
    kind = item.get("type", "message" if "role" in item else None)
    if kind not in ITEM_TYPES:
        raise fail(f"{param}.type", f"must be one of {', '.join(sorted(ITEM_TYPES))}")
    if kind == "message":
        if item.get("role") not in ROLES:
            raise fail(f"{param}.role", f"must be one of {', '.join(sorted(ROLES))}")
        _content(f"{param}.content", item.get("content"))
    elif kind in ("function_call", "custom_tool_call"):
        for name in ("call_id", "name"):
            string(f"{param}.{name}", item.get(name))
        string(f"{param}.{'arguments' if kind == 'function_call' else 'input'}",
               item.get("arguments" if kind == "function_call" else "input"))
    elif kind in ("function_call_output", "custom_tool_call_output"):
        string(f"{param}.call_id", item.get("call_id"))
        _content(f"{param}.output", item.get("output"))


def _input(param: str, value: Any) -> None:
    if isinstance(value, str):
        return
    if not isinstance(value, list) or not value:
        raise fail(param, "must be a string or a non-empty list of input items")
    if len(value) > MAX_ITEMS:
        raise fail(param, f"holds more than {MAX_ITEMS} items")
    for i, item in enumerate(value):
        _item(f"{param}[{i}]", item)


CHECKS: dict[str, Check] = {
    "input": _input,
    "instructions": string,
    "max_output_tokens": int_in(1),
    "temperature": number_in(0, 2),
    "top_p": number_in(0, 1),
    "stream": boolean,
    "store": boolean,
    "tools": tools_list,
    "tool_choice": tool_choice,
    "parallel_tool_calls": boolean,
    "previous_response_id": string,
    "metadata": obj,
    "user": string,
    "truncation": _one_of("auto", "disabled"),
    "text": obj,
    "reasoning": obj,
    "include": _strings,
    "top_logprobs": int_in(0, 20),
    "max_tool_calls": int_in(1),
    "stream_options": obj,
    "prompt_cache_key": string,
    "background": _refused("is not supported through the gateway (responses are answered while the client waits)"),
    "conversation": _refused("is not supported through the gateway; continue a conversation with "
                             "'previous_response_id'"),
    "prompt": _refused("(a stored prompt template) is not supported by the engines; send 'instructions' and "
                       "'input'"),
}


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(str(p.get("text", "")) for p in value if isinstance(p, Mapping))
    return ""


def prompt_text(body: Mapping[str, Any]) -> str:
    """A stable serialisation of what the engine reads (prefix hashing, tier scoring)."""
    out = [f"<|system|>{body['instructions']}\n"] if isinstance(body.get("instructions"), str) else []
    for item in as_items(body.get("input")):
        if not isinstance(item, Mapping):
            continue
        if "role" in item:
            out.append(f"<|{item.get('role')}|>{_text(item.get('content'))}\n")
        else:
            out.append(f"<|{item.get('type')}|>{item.get('name', '')}{item.get('arguments', '')}"
                       f"{_text(item.get('output'))}\n")
    return "".join(out)


class ResponsesRoute(TemplatedRoute):
    kind: Kind = "responses"
    path = "/v1/responses"

    def __init__(self, *, store: ConversationStore) -> None:
        self.store = store

    def parse(self, raw: bytes, headers: Mapping[str, str]) -> ParsedRequest:
        body = load_object(raw)
        if "input" not in body:
            raise InvalidRequestError("'input' is required", param="input")
        check_fields(body, CHECKS)
        if body.get("previous_response_id") is not None:
            checked_id(body["previous_response_id"], param="previous_response_id")
        session = headers.get("x-session-id") or body.get("prompt_cache_key") or body.get("user")
        return parsed_request(self.kind, body, raw, max_tokens=body.get("max_output_tokens"),
                              prompt_text=prompt_text(body), session_key=session)

    async def prepare(self, parsed: ParsedRequest, tenant: Tenant) -> None:
        """A follow-up: the stored conversation, then the new input (404 for an id this tenant has not stored)."""
        previous = parsed.body.get("previous_response_id")
        if previous is None:
            return
        stored = await self.store.load(tenant=tenant.id, response_id=previous)
        if stored is None:
            raise NotFoundError(f"Previous response with id {previous!r} not found.", param="previous_response_id",
                                code="previous_response_not_found")
        parsed.body["input"] = [*stored.items, *as_items(parsed.body["input"])]
        parsed.prompt_text = prompt_text(parsed.body)
        parsed.session_key = parsed.session_key or stored.session or None
        parsed.raw = b""

    def chat_tools(self, tools: list[Any]) -> list[Any]:
        return [chat_tool(t) for t in tools]

    def upstream_body(self, parsed: ParsedRequest, *, served: str, max_tokens: int | None) -> bytes:
        out = {k: v for k, v in parsed.body.items() if k not in UPSTREAM_DROPPED}
        out.update(model=served, stream=True, store=False)  # the gateway keeps the state (`conversations`)
        if max_tokens is not None:
            out["max_output_tokens"] = max_tokens
        return orjson.dumps(out)

    def rewriter(self, parsed: ParsedRequest, *, endpoint_id: str, model_name: str | None, cap: int | None,
                 collect: bool) -> ApiEvents:
        return ResponsesEvents(endpoint_id=endpoint_id, cap=cap, collect=collect, model_name=model_name,
                               previous_response_id=parsed.body.get("previous_response_id"))

    def is_answer(self, obj: dict[str, Any]) -> bool:
        return obj.get("object") == "response"

    def usage_of(self, obj: dict[str, Any]) -> Usage | None:
        return parse_usage(responses_usage(obj.get("usage")))

    def replay(self, parsed: ParsedRequest, response: dict[str, Any]) -> list[bytes]:
        return replay_events(response)

    def from_cache(self, parsed: ParsedRequest, response: dict[str, Any]) -> dict[str, Any]:
        return {**response, "previous_response_id": parsed.body.get("previous_response_id")}

    async def completed(self, parsed: ParsedRequest, tenant: Tenant, answer: dict[str, Any]) -> None:
        if parsed.body.get("store") is False or not isinstance(answer.get("id"), str):
            return
        items = [*as_items(parsed.body["input"]), *(answer.get("output") or [])]
        await self.store.save(tenant=tenant.id, response_id=answer["id"],
                              stored=StoredResponse(items=items, response=answer,
                                                    session=parsed.session_key or answer["id"]))
