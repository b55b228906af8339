"""The Responses API's stream events: the engine's rewritten for the client, and a cached answer replayed.

vLLM streams `/v1/responses` as `response.created`, `response.in_progress`, the output events
(`response.output_item.added`, `response.content_part.added`, `response.output_text.delta`, ... `*.done`) and
`response.completed`, whose `response` is the whole answer with its `usage` (vLLM reports usage nowhere else).
`ResponsesEvents`: every event with a `response` object names the model the gateway served and the client's
`previous_response_id` (the engine was sent the whole conversation instead, `api_responses`); each `*.delta`
event is an output chunk; `response.completed` (or `.incomplete`) ends the stream with the answer and its
usage (`responses_usage`), `error` and `response.failed` are the engine's errors. The gateway's own error event
is OpenAI's `{"type": "error", "code", "message", "param", "sequence_number"}`.
"""

from __future__ import annotations

from typing import Any

from fleetgate.gateway.api_events import ApiEvents, sse
from fleetgate.gateway.api_route import served_model
from fleetgate.gateway.engine_usage import parse_usage

TERMINAL = ("response.completed", "response.incomplete")


def responses_usage(raw: Any) -> dict[str, Any] | None:
    """A Responses `usage` as the chat shape the gateway charges (`engine_usage.parse_usage`); None when it is
    not one (both token counts are required: a usage without them must not read as zero)."""
    if not isinstance(raw, dict) or "input_tokens" not in raw or "output_tokens" not in raw:
        return None
    details = raw.get("input_tokens_details")
    cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
    usage = {"prompt_tokens": raw["input_tokens"], "completion_tokens": raw["output_tokens"],
             "prompt_tokens_details": {"cached_tokens": cached or 0}}
    return usage if parse_usage(usage) is not None else None


def reasoning_tokens(raw: Any) -> int:
    details = raw.get("output_tokens_details") if isinstance(raw, dict) else None
    value = details.get("reasoning_tokens") if isinstance(details, dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


class ResponsesEvents(ApiEvents):
    def __init__(self, *, endpoint_id: str, cap: int | None, collect: bool, model_name: str | None,
                 previous_response_id: str | None) -> None:
        super().__init__(endpoint_id=endpoint_id, cap=cap, collect=collect)
        self._model_name = model_name
        self._previous = previous_response_id
        self._sequence = -1

    def is_delta(self, kind: str, obj: dict[str, Any]) -> bool:
        return kind.endswith(".delta")

    def observe(self, kind: str, obj: dict[str, Any]) -> None:
        sequence = obj.get("sequence_number")
        if isinstance(sequence, int) and not isinstance(sequence, bool):
            self._sequence = max(self._sequence, sequence)
        response = obj.get("response")
        if not isinstance(response, dict):
            return
        served_model(response, self._model_name)
        response["previous_response_id"] = self._previous
        if kind not in TERMINAL:
            return
        raw = response.get("usage")
        usage = responses_usage(raw)
        if usage is None:
            self.outcome.bad_usage = True  # charged by estimate instead
        else:
            self.outcome.usage = usage
            if reasoning_tokens(raw):
                self.outcome.extra["reasoning_tokens"] = str(reasoning_tokens(raw))
        self.outcome.assembled = response

    def terminal(self, kind: str, obj: dict[str, Any]) -> bool:
        return kind in TERMINAL

    def error_event(self, message: str, *, code: str) -> bytes:
        self._sequence += 1
        return sse("error", {"type": "error", "code": code, "message": message, "param": None,
                             "sequence_number": self._sequence})


def replay_events(response: dict[str, Any]) -> list[bytes]:
    """A complete response as the stream vLLM would have sent for it (created, the output items, completed)."""
    events: list[bytes] = []

    def emit(kind: str, **fields: Any) -> None:
        events.append(sse(kind, {"type": kind, "sequence_number": len(events), **fields}))

    started = {**response, "status": "in_progress", "output": [], "usage": None}
    emit("response.created", response=started)
    emit("response.in_progress", response=started)
    for index, item in enumerate(response.get("output") or []):
        if not isinstance(item, dict):
            continue
        parts = item.get("content") if item.get("type") == "message" else None
        emit("response.output_item.added", output_index=index,
             item={**item, "status": "in_progress", "content": []} if parts is not None else item)
        for part_index, part in enumerate(parts or []):
            if not isinstance(part, dict):
                continue
            at = {"item_id": item.get("id"), "output_index": index, "content_index": part_index}
            text = part.get("text") or ""
            emit("response.content_part.added", **at, part={**part, "text": ""})
            emit("response.output_text.delta", **at, delta=text, logprobs=[])
            emit("response.output_text.done", **at, text=text, logprobs=[])
            emit("response.content_part.done", **at, part=part)
        emit("response.output_item.done", output_index=index, item=item)
    emit("response.completed", response=response)
    return events
