"""What the cache tests send and store: a greedy one-message chat request and a complete answer to it."""

from __future__ import annotations

from typing import Any

from fleetgate.cache.types import CacheRequest


def chat_request(text: str) -> CacheRequest:
    return CacheRequest(tenant="t", model="m", kind="chat",
                        body={"messages": [{"role": "user", "content": text}], "temperature": 0})


def chat_answer(content: str) -> dict[str, Any]:
    return {"object": "chat.completion", "model": "m", "usage": {"total_tokens": 3},
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}
