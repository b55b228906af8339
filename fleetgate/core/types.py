"""Small value types shared by the gateway, router, cache and operator."""

from __future__ import annotations

from dataclasses import dataclass, field

# Endpoint labels that say where the engine publishes its KV-cache events (set by discovery, read by the
# precise prefix scorer): the ZMQ publisher address, the replay address and the topic.
LABEL_KV_EVENTS = "kv_events"
LABEL_KV_EVENTS_REPLAY = "kv_events_replay"
LABEL_KV_EVENTS_TOPIC = "kv_events_topic"


@dataclass(frozen=True, slots=True)
class Endpoint:
    """One engine replica that serves one model: a pod in a cluster, a subprocess locally."""

    id: str
    url: str  # base URL, e.g. http://127.0.0.1:8100 (no trailing slash, no /v1)
    model: str  # the served model name the engine answers to
    labels: dict[str, str] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage as reported by the engine (OpenAI `usage`), plus prefix-cache hits."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    # True when `prompt_tokens` is the gateway's estimate, not the engine's count (its usage was missing or
    # malformed): charged all the same, but the router must not learn characters per token from it.
    estimated: bool = field(default=False, compare=False)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            prompt_tokens=self.prompt_tokens + other.prompt_tokens,
            completion_tokens=self.completion_tokens + other.completion_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            estimated=self.estimated or other.estimated,
        )

    @classmethod
    def from_openai(cls, usage: dict[str, object] | None) -> Usage:
        if not usage:
            return cls()
        details = usage.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens", 0) if isinstance(details, dict) else 0
        return cls(
            prompt_tokens=int(usage.get("prompt_tokens", 0) or 0),  # type: ignore[call-overload]
            completion_tokens=int(usage.get("completion_tokens", 0) or 0),  # type: ignore[call-overload]
            cached_tokens=int(cached or 0),
        )
