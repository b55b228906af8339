"""What one request can cost at most, in tokens, before the engine says: the limiter's reservation input.

- prompt tokens: about 4 characters per token of every prompt (`parsing.estimate_prompt_tokens`), exact
  for token-id prompts, plus the chat template: `TEMPLATE_TOKENS_PER_MESSAGE` per message (role markers,
  turn separators: 4-6 tokens in Llama 3, Gemma, Qwen and Mistral templates) and
  `TEMPLATE_TOKENS_PER_REQUEST` for the generation prompt and BOS.
- sequences: how many completions the engine generates: prompts in a `/v1/completions` prompt list
  times `max(n, best_of)`.
- completion: `max_tokens` per sequence; when the client set none, the model's context length minus
  the prompt where it is configured (`models[].max_model_len`), else `server.default_max_tokens`. The
  limiter may lower it to what the tenant's window still allows, and the gateway then sets it upstream,
  so the engine cannot generate more than was reserved.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fleetgate.gateway.parsing import ParsedRequest, estimate_prompt_tokens
from fleetgate.gateway.stages import Limiter, Reservation, Tenant

TEMPLATE_TOKENS_PER_MESSAGE = 8
TEMPLATE_TOKENS_PER_REQUEST = 8


@dataclass(frozen=True, slots=True)
class RequestEstimate:
    prompt_tokens: int
    sequences: int


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def _prompts(prompt: Any) -> tuple[int, int]:
    """(number of prompts, their estimated tokens) of a completions `prompt`."""
    if isinstance(prompt, str):
        return 1, estimate_prompt_tokens(prompt)
    if isinstance(prompt, list) and prompt:
        if all(isinstance(p, int) for p in prompt):
            return 1, len(prompt)  # token ids: exact
        parts = [_prompts(p) for p in prompt]
        return sum(n for n, _ in parts), sum(t for _, t in parts)
    return 1, 1


def estimate_request(parsed: ParsedRequest) -> RequestEstimate:
    body = parsed.body
    if parsed.kind == "chat":
        messages = body.get("messages") or []
        prompts = 1
        tokens = estimate_prompt_tokens(parsed.prompt_text) + TEMPLATE_TOKENS_PER_MESSAGE * len(messages)
    else:
        prompts, tokens = _prompts(body.get("prompt"))
    n = _positive_int(body.get("n")) or 1
    best_of = _positive_int(body.get("best_of")) or 1
    return RequestEstimate(prompt_tokens=tokens + TEMPLATE_TOKENS_PER_REQUEST * prompts,
                           sequences=prompts * max(n, best_of))


def default_max_tokens(*, prompt_tokens: int, context: int | None, default: int) -> int:
    """Completion tokens per sequence for a request without `max_tokens`."""
    if context is None:
        return default
    return max(1, context - prompt_tokens)


async def reserve_request(
    *, limiter: Limiter, tenant: Tenant, parsed: ParsedRequest, estimate: RequestEstimate, context: int | None,
    default: int,
) -> Reservation:
    """Reserve the most the request can cost. A completion sized by the context that the budget did not lower
    is not set upstream (`Reservation.max_tokens` None): the engine stops at its context length by itself,
    while a value computed from the prompt *estimate* could ask for more than the context leaves, which vLLM
    refuses with a 400."""
    completion = parsed.max_tokens or default_max_tokens(
        prompt_tokens=estimate.prompt_tokens, context=context, default=default)
    reservation = await limiter.reserve(
        tenant, parsed.model, prompt_tokens=estimate.prompt_tokens, max_tokens=completion,
        sequences=estimate.sequences, fit_max_tokens=parsed.max_tokens is None,
    )  # fmt: skip
    if context is not None and parsed.max_tokens is None and reservation.max_tokens == completion:
        reservation.max_tokens = None
    return reservation
