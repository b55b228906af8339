"""The Responses and Messages requests as what vLLM hands the chat template, for exact token counts.

vLLM answers `/v1/responses` and `/v1/messages` by turning each request into a chat request and rendering it
with the chat template. Where the prompt bound would refuse such a request (`estimate.reserve_request`), the
exact count is asked of the engine (`token_count`):

- Messages: vLLM's own `POST /v1/messages/count_tokens` renders the request exactly as `/v1/messages` does;
  it gets the fields that endpoint takes (`MESSAGES_COUNT_FIELDS`).
- Responses: vLLM has no counting endpoint, so the request is written as the chat request vLLM renders
  (`vllm/entrypoints/openai/responses/utils.py`, `construct_input_messages`): `instructions` as a system turn,
  message items as turns (an output message as its first part's text), function and custom tool calls as
  assistant `tool_calls`, their outputs as `tool` turns, reasoning items as assistant `reasoning`, function
  tools in the chat shape, `reasoning.effort` as the chat request's `reasoning_effort`, content parts as chat
  parts; then `/tokenize` counts it as a chat request, with `add_special_tokens` (vLLM's Responses path
  tokenizes the rendered prompt with them: Gemma reads a second BOS there that chat requests do not). Where
  vLLM merges consecutive assistant items into one turn this view keeps them apart, which can only add turn
  markers: the count stays at least what the engine reads.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

MESSAGES_COUNT_FIELDS = ("messages", "system", "tools", "tool_choice", "thinking", "output_config",
                         "chat_template_kwargs")


def chat_tool(tool: Any) -> Any:
    """A Responses function tool (flat) in the chat shape; any other tool as it is."""
    if isinstance(tool, Mapping) and tool.get("type") == "function" and "function" not in tool:
        return {"type": "function", "function": {k: v for k, v in tool.items() if k != "type"}}
    return tool


def _part(part: Any) -> Any:
    """A Responses content part as the chat part vLLM turns it into (`input_text`/`output_text` as text,
    `input_image` as an image URL); any other part as it is (then `/tokenize` refuses it and the bound decides)."""
    if not isinstance(part, Mapping):
        return part
    kind = part.get("type")
    if kind in ("input_text", "output_text"):
        return {"type": "text", "text": part.get("text")}
    if kind == "input_image" and part.get("image_url") is not None:
        return {"type": "image_url", "image_url": {"url": part.get("image_url")}}
    return part


def _content(content: Any) -> Any:
    return [_part(p) for p in content] if isinstance(content, list) else content


def _first_text(content: Any) -> Any:
    if isinstance(content, list) and content and isinstance(content[0], Mapping):
        return content[0].get("text")
    return content


def _turn(item: Mapping[str, Any]) -> dict[str, Any] | None:
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        content = item.get("content")
        return {"role": item.get("role"), "content": _first_text(content) if item.get("role") == "assistant"
                else _content(content)}
    if kind in ("function_call", "custom_tool_call"):
        arguments = item.get("arguments") if kind == "function_call" else item.get("input")
        return {"role": "assistant", "content": None, "tool_calls": [{
            "id": item.get("call_id"), "type": "function",
            "function": {"name": item.get("name"), "arguments": arguments}}]}
    if kind in ("function_call_output", "custom_tool_call_output"):
        return {"role": "tool", "tool_call_id": item.get("call_id"), "content": _content(item.get("output"))}
    if kind == "reasoning":
        text = _first_text(item.get("content")) or _first_text(item.get("summary")) or ""
        return {"role": "assistant", "content": None, "reasoning": text}
    return None


def as_items(value: Any) -> list[Any]:
    """A Responses `input` as a list of items (a string is one user message)."""
    return [{"role": "user", "content": value}] if isinstance(value, str) else list(value or [])


def responses_as_chat(body: Mapping[str, Any]) -> dict[str, Any]:
    """The chat request vLLM renders for a Responses request (see the module doc)."""
    items = as_items(body.get("input"))
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    messages.extend(t for item in items if isinstance(item, Mapping) for t in (_turn(item),) if t is not None)
    out: dict[str, Any] = {"messages": messages}
    tools = body.get("tools")
    if isinstance(tools, list) and tools:
        out["tools"] = [chat_tool(t) for t in tools]
        out["tool_choice"] = body.get("tool_choice", "auto")  # vLLM hands it to the template with tools
    reasoning = body.get("reasoning")
    if isinstance(reasoning, Mapping) and reasoning.get("effort") is not None:
        out["reasoning_effort"] = reasoning["effort"]
    if body.get("chat_template_kwargs") is not None:
        out["chat_template_kwargs"] = body["chat_template_kwargs"]
    return out
