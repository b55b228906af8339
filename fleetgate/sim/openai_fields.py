"""How vLLM reads the OpenAI request fields the simulated engines act on (shared by `server` and `fake_engine`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def requested_max_tokens(body: Mapping[str, Any], *, chat: bool) -> Any:
    """The completion limit the request sets, as vLLM 0.32 reads it: chat takes `max_completion_tokens`, else
    the deprecated `max_tokens`; `/v1/completions` has only `max_tokens` (its `CompletionRequest` has no
    `max_completion_tokens`: an extra field, ignored), so a completion asking for `max_tokens: 1,
    max_completion_tokens: 100000` generates one token."""
    if chat and body.get("max_completion_tokens") is not None:
        return body["max_completion_tokens"]
    return body.get("max_tokens")
