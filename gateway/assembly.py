"""Assembling streamed chunks into the complete non-streaming response (so a stream can be cached).

Inputs: the engine's chunks in order (`chat.completion.chunk` or streamed `text_completion`).
Per choice index the deltas' `content` (chat) or `text` (completions) are concatenated, the role and
the last `finish_reason` kept. Responses with tool calls or logprobs are not assembled (`result()`
returns None): rebuilding those exactly is not worth the risk of caching a wrong answer.
"""

from __future__ import annotations

from typing import Any


class StreamAssembler:
    def __init__(self, kind: str) -> None:  # "chat" or "completions"
        self._kind = kind
        self._id = ""
        self._created = 0
        self._model = ""
        self._text: dict[int, list[str]] = {}
        self._role: dict[int, str] = {}
        self._finish: dict[int, Any] = {}
        self._unsupported = False

    def add(self, chunk: dict[str, Any]) -> None:
        if self._unsupported:
            return
        if not self._id:
            self._id = str(chunk.get("id", ""))
            self._created = int(chunk.get("created", 0) or 0)
            self._model = str(chunk.get("model", ""))
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            index = int(choice.get("index", 0) or 0)
            if choice.get("logprobs"):
                self._unsupported = True
                return
            parts = self._text.setdefault(index, [])
            if self._kind == "chat":
                delta = choice.get("delta") or {}
                if delta.get("tool_calls") or delta.get("function_call"):
                    self._unsupported = True
                    return
                if delta.get("role"):
                    self._role[index] = str(delta["role"])
                if delta.get("content"):
                    parts.append(str(delta["content"]))
            elif choice.get("text"):
                parts.append(str(choice["text"]))
            if choice.get("finish_reason") is not None:
                self._finish[index] = choice["finish_reason"]

    def result(self, *, usage: dict[str, Any] | None) -> dict[str, Any] | None:
        if self._unsupported or not self._text:
            return None
        choices: list[dict[str, Any]] = []
        for index in sorted(self._text):
            text = "".join(self._text[index])
            if self._kind == "chat":
                message = {"role": self._role.get(index, "assistant"), "content": text}
                choices.append(
                    {"index": index, "message": message, "logprobs": None, "finish_reason": self._finish.get(index)}
                )
            else:
                choices.append(
                    {"index": index, "text": text, "logprobs": None, "finish_reason": self._finish.get(index)}
                )
        return {
            "id": self._id,
            "object": "chat.completion" if self._kind == "chat" else "text_completion",
            "created": self._created,
            "model": self._model,
            "choices": choices,
            "usage": usage,
        }
