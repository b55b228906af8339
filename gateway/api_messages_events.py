"""The Anthropic Messages API's stream events: the engine's rewritten for the client, assembled into one message
for a non-streaming request, and a cached message replayed.

vLLM streams `/v1/messages` as Anthropic does: `message_start` (the message, empty, with `usage.input_tokens`:
the prompt the engine read, known from the first event on), `content_block_start` / `_delta` / `_stop` per
block (text, thinking, tool_use with `input_json_delta`), `message_delta` (stop reason and the final usage),
`message_stop`. `MessagesEvents`: each `content_block_delta` is an output chunk; `message_start` names the
model the gateway served; the blocks are assembled into the message a non-streaming request returns; the
final usage (`messages_usage`: Anthropic counts cache reads apart from `input_tokens`) is what is charged.
A stream that ends early is charged the prompt `message_start` reported and one token per delta seen.
The gateway's own error event is Anthropic's `{"type": "error", "error": {"type", "message"}}`.
"""

from __future__ import annotations

from typing import Any

import orjson

from fleetgate.gateway.api_events import ApiEvents, sse
from fleetgate.gateway.api_route import served_model
from fleetgate.gateway.engine_usage import parse_usage

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 408: "timeout_error", 413: "request_too_large", 429: "rate_limit_error",
               503: "overloaded_error", 504: "timeout_error"}
STREAM_ERROR_TYPES = {"upstream_timeout": "timeout_error", "stream_deadline": "timeout_error",
                      "server_shutting_down": "overloaded_error"}
TOKENS = ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens")


def error_type(status: int) -> str:
    return ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")


def messages_usage(raw: Any) -> dict[str, Any] | None:
    """An Anthropic `usage` as the chat shape the gateway charges: the prompt is `input_tokens` plus the cache
    reads and writes (Anthropic reports them apart). None when it is not one."""
    if not isinstance(raw, dict) or "input_tokens" not in raw or "output_tokens" not in raw:
        return None
    parts = [raw.get(k) or 0 for k in TOKENS]
    if not all(isinstance(p, int) and not isinstance(p, bool) and p >= 0 for p in parts):
        return None
    usage = {"prompt_tokens": sum(parts), "completion_tokens": raw["output_tokens"],
             "prompt_tokens_details": {"cached_tokens": parts[1]}}
    return usage if parse_usage(usage) is not None else None


class MessagesEvents(ApiEvents):
    def __init__(self, *, endpoint_id: str, cap: int | None, collect: bool, model_name: str | None) -> None:
        super().__init__(endpoint_id=endpoint_id, cap=cap, collect=collect)
        self._model_name = model_name
        self._message: dict[str, Any] = {}
        self._usage: dict[str, Any] = {}
        self._blocks: dict[int, dict[str, Any]] = {}
        self._json: dict[int, str] = {}  # a tool_use block's input, as streamed

    def is_delta(self, kind: str, obj: dict[str, Any]) -> bool:
        return kind == "content_block_delta"

    def observe(self, kind: str, obj: dict[str, Any]) -> None:
        if kind == "message_start" and isinstance(obj.get("message"), dict):
            served_model(obj["message"], self._model_name)
            self._message = {**obj["message"], "content": []}
            raw = obj["message"].get("usage")
            start = messages_usage({**raw, "output_tokens": 0}) if isinstance(raw, dict) else None
            if start is not None:  # the prompt the engine read, known before anything is generated
                self._usage = {k: v for k, v in raw.items() if v is not None}
                self.known_prompt = start["prompt_tokens"]
        elif kind == "content_block_start" and isinstance(obj.get("content_block"), dict):
            self._blocks[self._index(obj)] = dict(obj["content_block"])
        elif kind == "content_block_delta" and isinstance(obj.get("delta"), dict):
            self._delta(self._index(obj), obj["delta"])
        elif kind == "content_block_stop":
            index = self._index(obj)
            block, partial = self._blocks.get(index), self._json.pop(index, None)
            if block is not None and partial is not None:
                try:
                    block["input"] = orjson.loads(partial)
                except orjson.JSONDecodeError:
                    block["input"] = {}
        elif kind == "message_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict):
                self._message.update({k: delta[k] for k in ("stop_reason", "stop_sequence") if k in delta})
            raw = obj.get("usage")
            if raw is not None:
                # The final usage; Anthropic's own sends only output_tokens here, vLLM's the input too.
                merged = {**self._usage, **raw} if isinstance(raw, dict) else None
                usage = messages_usage(merged)
                if merged is None or usage is None:
                    self.outcome.bad_usage = True  # charged by estimate instead
                else:
                    self._usage, self.outcome.usage = merged, usage
        elif kind == "message_stop":
            content = [self._blocks[i] for i in sorted(self._blocks)] or [{"type": "text", "text": ""}]
            self.outcome.assembled = {**self._message, "content": content, "usage": self._usage}

    @staticmethod
    def _index(obj: dict[str, Any]) -> int:
        index = obj.get("index")
        return index if isinstance(index, int) else 0


    def _delta(self, index: int, delta: dict[str, Any]) -> None:
        block = self._blocks.setdefault(index, {"type": "text", "text": ""})
        kind = delta.get("type")
        if kind == "text_delta":
            block["text"] = str(block.get("text") or "") + str(delta.get("text") or "")
        elif kind == "thinking_delta":
            block["thinking"] = str(block.get("thinking") or "") + str(delta.get("thinking") or "")
        elif kind == "signature_delta":
            block["signature"] = delta.get("signature")
        elif kind == "input_json_delta":
            self._json[index] = self._json.get(index, "") + str(delta.get("partial_json") or "")

    def terminal(self, kind: str, obj: dict[str, Any]) -> bool:
        return kind == "message_stop"

    def error_event(self, message: str, *, code: str) -> bytes:
        kind = STREAM_ERROR_TYPES.get(code, "api_error")
        return sse("error", {"type": "error", "error": {"type": kind, "message": message}})


def replay_events(message: dict[str, Any]) -> list[bytes]:
    """A complete message as the stream vLLM would have sent for it."""
    raw = message.get("usage")
    usage: dict[str, Any] = raw if isinstance(raw, dict) else {}
    start = {**message, "content": [], "stop_reason": None, "stop_sequence": None,
             "usage": {**usage, "output_tokens": 0}}
    events = [sse("message_start", {"type": "message_start", "message": start})]
    for index, block in enumerate(message.get("content") or []):
        if not isinstance(block, dict):
            continue
        kind = block.get("type")
        if kind == "text":
            empty, delta = {**block, "text": ""}, {"type": "text_delta", "text": block.get("text") or ""}
        elif kind == "thinking":
            empty, delta = {**block, "thinking": ""}, {"type": "thinking_delta", "thinking": block.get("thinking")}
        else:
            empty, delta = {**block, "input": {}}, {"type": "input_json_delta",
                                                    "partial_json": orjson.dumps(block.get("input") or {}).decode()}
        events.append(sse("content_block_start", {"type": "content_block_start", "index": index,
                                                  "content_block": empty}))
        events.append(sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta}))
        events.append(sse("content_block_stop", {"type": "content_block_stop", "index": index}))
    events.append(sse("message_delta", {"type": "message_delta", "usage": usage,
                                        "delta": {"stop_reason": message.get("stop_reason"),
                                                  "stop_sequence": message.get("stop_sequence")}}))
    events.append(sse("message_stop", {"type": "message_stop"}))
    return events
