"""Cascade escalation: does a cheap tier's complete answer show that it failed?

Input: one complete OpenAI response (chat completion or text completion, non-streaming) and the alias's
`Cascade` settings. Checks, in order, on the first choice; the first that fires is the reason:
- `length`: `finish_reason == "length"` (the answer was cut off);
- `empty`: no text content and no tool calls;
- `refusal`: the message's `refusal` field is set, or the answer's first 200 characters open with a refusal
  ("I can't", "I cannot", "I'm not able to", "I am unable", "I don't know", "As an AI", ... plus the
  configured `refusal_patterns`); only the opening is checked, so an answer that quotes a refusal later
  does not escalate;
- `low-logprob`: when log-probabilities are present (chat: `logprobs.content[*].logprob`, completions:
  `logprobs.token_logprobs`), their mean is below `min_mean_logprob` (default -2.5 nats per token, i.e. the
  model's own geometric-mean token probability under ~8%).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from fleetgate.router.tiers.config import Cascade

OPENING_CHARS = 200
DEFAULT_REFUSALS: tuple[str, ...] = (
    r"i\s*(?:can\s*not|can'?t|can\u2019t|cannot)\b",
    r"i(?:'m|\u2019m| am)\s+(?:not able|unable|sorry,? but)",
    r"i\s*(?:don'?t|do not|don\u2019t)\s+know\b",
    r"i\s*(?:won'?t|will not|won\u2019t)\s+(?:be able|help|assist|answer|provide)",
    r"as an ai\b",
    r"sorry,? (?:but )?i\b",
    r"unfortunately,? i\b",
)


def compile_refusals(extra: Sequence[str] = ()) -> re.Pattern[str]:
    """One regex anchored at the answer's start (after leading whitespace and punctuation)."""
    alternatives = "|".join(f"(?:{p})" for p in (*DEFAULT_REFUSALS, *extra))
    return re.compile(rf"^[\s\"'*_>#-]*(?:{alternatives})", re.IGNORECASE)


def _first_choice(response: dict[str, Any]) -> dict[str, Any] | None:
    choices = response.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    return None


def _content(choice: dict[str, Any]) -> tuple[str, bool, Any]:
    """(text, has tool calls, refusal field) for a chat or completion choice."""
    message = choice.get("message")
    if isinstance(message, dict):
        text = message.get("content")
        return (text if isinstance(text, str) else ""), bool(message.get("tool_calls")), message.get("refusal")
    text = choice.get("text")
    return (text if isinstance(text, str) else ""), False, None


def mean_logprob(choice: dict[str, Any]) -> float | None:
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    values: list[float] = []
    content = logprobs.get("content")
    if isinstance(content, list):
        values = [float(t["logprob"]) for t in content if isinstance(t, dict) and _is_number(t.get("logprob"))]
    else:
        raw = logprobs.get("token_logprobs")
        if isinstance(raw, list):
            values = [float(v) for v in raw if _is_number(v)]
    return sum(values) / len(values) if values else None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def escalation_reason(response: dict[str, Any], *, cascade: Cascade, refusals: re.Pattern[str]) -> str | None:
    choice = _first_choice(response)
    if choice is None:
        return "empty" if cascade.on_empty else None
    if cascade.on_length and choice.get("finish_reason") == "length":
        return "length"
    text, tool_calls, refusal = _content(choice)
    if cascade.on_empty and not text.strip() and not tool_calls and not refusal:
        return "empty"
    if cascade.on_refusal and (refusal or refusals.search(text[:OPENING_CHARS])):
        return "refusal"
    if cascade.min_mean_logprob is not None:
        mean = mean_logprob(choice)
        if mean is not None and mean < cascade.min_mean_logprob:
            return "low-logprob"
    return None
