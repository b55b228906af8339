"""When the cache may serve and when it may store.

`decide(req, config)` -> `Decision(serve, store, semantic, reason)`:

| request                                              | serve | store | why                                  |
|------------------------------------------------------|-------|-------|--------------------------------------|
| `no_store`                                           | no    | no    | caller forbids both                  |
| tools / functions / tool_choice present              | no    | no    | answers depend on external state     |
| `n` > 1, `best_of` > 1                               | no    | no    | several samples wanted               |
| `logprobs` / `top_logprobs` / `echo`                 | no    | no    | per-token data is not replayable     |
| temperature > 0 (or absent, by default) and not `allow_sampled` | no | no | a fresh sample is expected |
| `no_cache`                                           | no    | yes   | caller wants a fresh answer          |
| otherwise                                            | yes   | yes   |                                      |

`semantic` is additionally false for completions, non-text last messages and last messages longer than
`semantic.max_text_chars` (long embedded spans are exactly where paraphrase matching is unsafe).

`storable(response, config)` accepts only a complete success: an OpenAI object with at least one choice,
every `finish_reason` == "stop" (or "length" when `store_truncated`), no tool calls, no error, and a body
below `max_response_bytes`; a Responses answer `completed` with message items only; an Anthropic message
ended by `end_turn` or a stop sequence, without tool_use. Embeddings are never served nor stored. "length"
is refused by default: a truncated answer is an incomplete one and clients usually retry it with a larger
`max_tokens`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fleetgate.cache.config import CacheConfig
from fleetgate.cache.types import CacheRequest


@dataclass(frozen=True, slots=True)
class Decision:
    serve: bool
    store: bool
    semantic: bool
    reason: str = ""


def _number(value: Any, default: float) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return default


def _bypass_reason(req: CacheRequest, config: CacheConfig) -> str:
    body = req.body
    if req.kind == "embeddings":
        return "embeddings"
    if any(body.get(k) not in (None, [], "none") for k in ("tools", "functions", "tool_choice", "function_call")):
        return "tools"
    if _number(body.get("n"), 1) > 1 or _number(body.get("best_of"), 1) > 1:
        return "n>1"
    if body.get("logprobs") or body.get("top_logprobs") or body.get("echo"):
        return "logprobs"
    if not req.allow_sampled:
        temperature = body.get("temperature")
        if temperature is None:
            if config.absent_temperature_is_sampled:
                return "sampled (temperature not set)"
        elif _number(temperature, 1.0) > 0:
            return "sampled (temperature > 0)"
    return ""


def decide(req: CacheRequest, config: CacheConfig, *, semantic_text: str | None) -> Decision:
    if not config.enabled:
        return Decision(serve=False, store=False, semantic=False, reason="cache disabled")
    if req.no_store:
        return Decision(serve=False, store=False, semantic=False, reason="no-store")
    reason = _bypass_reason(req, config)
    if reason:
        return Decision(serve=False, store=False, semantic=False, reason=reason)
    semantic = (
        config.semantic.enabled
        and semantic_text is not None
        and 0 < len(semantic_text.strip()) <= config.semantic.max_text_chars
    )
    if req.no_cache:
        return Decision(serve=False, store=True, semantic=semantic, reason="no-cache")
    return Decision(serve=True, store=True, semantic=semantic)


def _storable_response(response: Mapping[str, Any], config: CacheConfig) -> str:
    """A Responses API answer: completed (or incomplete at its output limit, when truncated answers are
    stored), with messages only (no tool calls, no reasoning items)."""
    status = response.get("status")
    if status != "completed" and not (config.store_truncated and status == "incomplete"):
        return f"status {status!r}"
    output = response.get("output")
    if not isinstance(output, list) or not output:
        return "no output"
    if any(not isinstance(item, Mapping) or item.get("type") != "message" for item in output):
        return "tool calls"
    return ""


def _storable_message(response: Mapping[str, Any], config: CacheConfig) -> str:
    """An Anthropic message: ended by the model or a stop sequence (or at `max_tokens`, when truncated
    answers are stored), with no tool_use block."""
    allowed = {"end_turn", "stop_sequence", "max_tokens"} if config.store_truncated else {"end_turn", "stop_sequence"}
    if response.get("stop_reason") not in allowed:
        return f"stop_reason {response.get('stop_reason')!r}"
    content = response.get("content")
    if not isinstance(content, list) or not content:
        return "no content"
    if any(not isinstance(b, Mapping) or b.get("type") == "tool_use" for b in content):
        return "tool calls"
    return ""


def storable(response: Mapping[str, Any], config: CacheConfig) -> str:
    """"" when `response` may be stored, else why not."""
    if "error" in response and response.get("error") is not None:
        return "error response"
    if response.get("object") == "response":
        return _storable_response(response, config)
    if response.get("type") == "message":
        return _storable_message(response, config)
    choices = response.get("choices")
    if not isinstance(choices, list) or not choices:
        return "no choices"
    allowed = {"stop", "length"} if config.store_truncated else {"stop"}
    for choice in choices:
        if not isinstance(choice, Mapping):
            return "malformed choice"
        if choice.get("finish_reason") not in allowed:
            return f"finish_reason {choice.get('finish_reason')!r}"
        message = choice.get("message")
        if isinstance(message, Mapping) and (message.get("tool_calls") or message.get("function_call")):
            return "tool calls"
    return ""
