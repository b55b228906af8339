"""Replaying a complete (cached) response as server-sent events in the engine's chunk shape.

Input: a complete OpenAI response (`chat.completion` or `text_completion`). Output, per choice: for
chat a role chunk, one content chunk and a finish chunk (vLLM's order); for completions one text
chunk carrying the finish reason; then, when the client asked `include_usage`, the usage-only
chunk (`choices: []`), then `[DONE]`. Chunks carry `usage: null` when the client asked for usage.
"""

from __future__ import annotations

from typing import Any

import orjson

from fleetgate.gateway.streaming import DONE


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def replay_chunks(response: dict[str, Any], *, include_usage: bool) -> list[bytes]:
    chat = response.get("object") != "text_completion"
    base = {
        "id": response.get("id", ""),
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": response.get("created", 0),
        "model": response.get("model", ""),
    }

    def chunk(choice: dict[str, Any]) -> bytes:
        obj = {**base, "choices": [choice]}
        if include_usage:
            obj["usage"] = None
        return _event(obj)

    out: list[bytes] = []
    for choice in response.get("choices") or ():
        index = choice.get("index", 0)
        finish = choice.get("finish_reason")
        if chat:
            message = choice.get("message") or {}
            role = message.get("role", "assistant")
            out.append(chunk({"index": index, "delta": {"role": role, "content": ""}, "logprobs": None,
                              "finish_reason": None}))
            delta: dict[str, Any] = {"content": message.get("content") or ""}
            if message.get("tool_calls"):
                delta["tool_calls"] = [{"index": i, **tc} for i, tc in enumerate(message["tool_calls"])]
            out.append(chunk({"index": index, "delta": delta, "logprobs": None, "finish_reason": None}))
            out.append(chunk({"index": index, "delta": {}, "logprobs": None, "finish_reason": finish}))
        else:
            out.append(chunk({"index": index, "text": choice.get("text", ""), "logprobs": None,
                              "finish_reason": finish}))
    if include_usage:
        out.append(_event({**base, "choices": [], "usage": response.get("usage")}))
    out.append(DONE)
    return out
