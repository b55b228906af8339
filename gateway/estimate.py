"""What one request can cost at most, in tokens, before the engine says: the limiter's reservation input.

- prompt tokens: a bound that is safe by construction (`prompt_bound.bound_request`: bytes of everything the
  engine's template could render, the template's own text, media items, each prompt capped at the context);
  where that bound would be refused by a token or dollar limit, the engine's exact count (`token_count`,
  vLLM's `/tokenize`) replaces it, so a request is never refused on the bound alone.
- sequences: how many completions the engine generates: prompts in a `/v1/completions` prompt list
  times `max(n, best_of)`.
- completion: `max_tokens` per sequence; when the client set none, the model's context length minus one
  (the engine stops at its context, and the prompt is at least one token) where it is known
  (`models[].max_model_len` or discovery), else `server.default_max_tokens`. The limiter may lower it to
  what the tenant's window still allows, and the gateway then sets it upstream, so the engine cannot
  generate more than was reserved; the relay enforces the same cap on streams (`completion_cap`).

So the reservation is at least what the engine charges: prompt <= bound (or = the exact count) and
completion <= cap per sequence, priced at the same rates.

Routes call it through `reserving.Reserver` (one per app: each model's profile and context, the exact
counter); see there for other request shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from fleetgate.core.errors import RateLimitError
from fleetgate.gateway.parsing import Kind, ParsedRequest
from fleetgate.gateway.prompt_bound import DEFAULT_PROFILE, PromptProfile, bound_request
from fleetgate.gateway.stages import Limiter, Reservation, Tenant


class TokenCounter(Protocol):
    async def count(self, *, kind: Kind, model: str, body: Mapping[str, Any]) -> list[int] | None:
        """The engine's exact prompt tokens per prompt, or None when it cannot say."""
        ...


@dataclass(frozen=True, slots=True)
class RequestEstimate:
    prompt_tokens: int  # what is reserved: the bound, or the exact count (`exact`)
    sequences: int
    typical: int  # a rough count, <= prompt_tokens: charged when the engine reports no usage
    prompts: int = 1
    exact: bool = False


def _positive_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def estimate_body(
    body: Mapping[str, Any], *, prompts_field: str | None, profile: PromptProfile = DEFAULT_PROFILE,
    context: int | None = None,
) -> RequestEstimate:
    """The estimate of any request shape (see the module doc)."""
    bound = bound_request(body, prompts_field=prompts_field, profile=profile, context=context)
    n = _positive_int(body.get("n")) or 1
    best_of = _positive_int(body.get("best_of")) or 1
    return RequestEstimate(prompt_tokens=bound.tokens, sequences=bound.prompts * max(n, best_of),
                           typical=bound.typical, prompts=bound.prompts)


def estimate_request(
    parsed: ParsedRequest, *, profile: PromptProfile = DEFAULT_PROFILE, context: int | None = None
) -> RequestEstimate:
    return estimate_body(parsed.body, prompts_field=None if parsed.kind == "chat" else "prompt", profile=profile,
                         context=context)


def default_max_tokens(*, context: int | None, default: int) -> int:
    """Completion tokens per sequence reserved for a request without `max_tokens`: the whole context but the
    one token a prompt has at least (the engine stops at its context by itself), else the server default."""
    if context is None:
        return default
    return max(1, context - 1)


def completion_cap(reservation: Reservation, *, max_tokens: int | None, sequences: int) -> int:
    """The completion tokens the engine may be charged for over all sequences: what was reserved for them."""
    if reservation.max_tokens is not None:
        return reservation.max_tokens * sequences  # what the gateway set upstream
    return (max_tokens if max_tokens is not None else reservation.completion_per_seq) * sequences


async def _exact(counter: TokenCounter | None, kind: Kind | None, model: str, body: Mapping[str, Any],
                 estimate: RequestEstimate, context: int | None) -> RequestEstimate | None:
    """The estimate with the engine's exact prompt count, when that is lower than the bound."""
    if counter is None or kind is None:
        return None
    counts = await counter.count(kind=kind, model=model, body=body)
    if counts is None or len(counts) != estimate.prompts:
        return None
    if context is not None:
        counts = [min(c, context) for c in counts]
    exact = sum(counts)
    if exact >= estimate.prompt_tokens:
        return None
    return RequestEstimate(prompt_tokens=exact, sequences=estimate.sequences, typical=min(estimate.typical, exact),
                           prompts=estimate.prompts, exact=True)


async def reserve_request(
    *, limiter: Limiter, tenant: Tenant, model: str, body: Mapping[str, Any], max_tokens: int | None,
    estimate: RequestEstimate, context: int | None, default: int, counter: TokenCounter | None = None,
    kind: Kind | None = None,
) -> tuple[Reservation, RequestEstimate]:
    """Reserve the most the request can cost; the estimate that was reserved (exact where the bound was
    refused and `counter` could count `kind`). A completion sized by the context that the budget did not lower
    is not set upstream (`Reservation.max_tokens` None): the engine stops at its context length. One the budget
    lowered is set, at most what the context leaves after the prompt's bound, when that is known to be positive."""
    fit = max_tokens is None  # 0 is a limit: a route that generates nothing (embeddings)
    completion = default_max_tokens(context=context, default=default) if max_tokens is None else max_tokens
    try:
        reservation = await _reserve(limiter, tenant, model, estimate, completion, fit)
    except RateLimitError as exc:
        tokens = exc.limit is not None and exc.limit != "rpm"  # a token or dollar window, not a request count
        exact = await _exact(counter, kind, model, body, estimate, context) if tokens else None
        if exact is None:
            raise
        estimate = exact
        reservation = await _reserve(limiter, tenant, model, estimate, completion, fit)
    reservation.completion_per_seq = completion
    if context is not None and fit:
        if reservation.max_tokens == completion:
            reservation.max_tokens = None
        elif reservation.max_tokens is not None and context - estimate.prompt_tokens >= 1:
            reservation.max_tokens = min(reservation.max_tokens, context - estimate.prompt_tokens)
    return reservation, estimate


async def _reserve(limiter: Limiter, tenant: Tenant, model: str, estimate: RequestEstimate, completion: int,
                   fit: bool) -> Reservation:
    return await limiter.reserve(tenant, model, prompt_tokens=estimate.prompt_tokens, max_tokens=completion,
                                 sequences=estimate.sequences, fit_max_tokens=fit)
