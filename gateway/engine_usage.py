"""Reading the `usage` an engine reports, which the gateway must never trust blindly.

`parse_usage` accepts only an object whose token counts are non-negative integers (an integral float is
accepted: some servers emit `12.0`) below `MAX_TOKENS`; anything else (a string, a list, negative or
absurd counts, a non-integral number) is *malformed* and read as unknown (None), never as an exception
in the stream's close or the non-streaming path. Unknown usage is charged by `fallback_usage`: the
reservation side's prompt estimate plus one token per output chunk relayed, so cancelled or broken
work is never charged $0 and never more than the engine could have done.
"""

from __future__ import annotations

from typing import Any

from fleetgate.core.types import Usage

MAX_TOKENS = 1 << 31  # more than any context length times any n: beyond it a count is not believable


def _count(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        number = value
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    else:
        return None
    return number if 0 <= number < MAX_TOKENS else None


def is_malformed(raw: Any) -> bool:
    """Present but not a usage object `parse_usage` can read."""
    return raw is not None and parse_usage(raw) is None


def usage_counts(raw: Any) -> tuple[int, int] | None:
    """(prompt, completion) tokens of a well-formed usage, None when missing or malformed (what `parse_usage`
    decides, without building a `Usage`: a stream checks one per token)."""
    if not isinstance(raw, dict):
        return None
    prompt = raw.get("prompt_tokens", 0)
    completion = raw.get("completion_tokens", 0)
    if type(prompt) is int and type(completion) is int:  # what engines send, checked at once (not a bool)
        return (prompt, completion) if 0 <= prompt < MAX_TOKENS and 0 <= completion < MAX_TOKENS else None
    prompt, completion = _count(prompt), _count(completion)
    return None if prompt is None or completion is None else (prompt, completion)


def parse_usage(raw: Any) -> Usage | None:
    """The engine's usage, or None when it is missing or malformed."""
    counts = usage_counts(raw)
    if counts is None:
        return None
    prompt, completion = counts
    details = raw.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens", 0) or 0) if isinstance(details, dict) else 0
    return Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=min(cached or 0, prompt))


def fallback_usage(*, prompt_estimate: int, output_chunks: int) -> Usage:
    """What to charge when the engine's usage is unknown: the estimate of the prompt it read and the
    tokens it was seen to generate (each relayed output chunk carries at least one)."""
    return Usage(prompt_tokens=max(prompt_estimate, 0), completion_tokens=max(output_chunks, 0), estimated=True)
