"""`Reserver`: one object per gateway app that reserves what a request may cost (`estimate`), for any route.

It holds what the reservation needs beyond the request: each model's prompt profile (`models[].prompt_bound`;
an adapter uses its base's) and context length (`models[].max_model_len`, else discovery), the server's
`default_max_tokens`, and the exact counter (`token_count`, when `server.exact_token_count`).

Calling it from a route:

    reserved = await reserver.reserve(tenant, model=name, body=body, prompts_field=None,
                                      max_tokens=client_max_tokens, kind="chat")
    # reserved.reservation: settle it with the engine's usage (`Limiter.settle`)
    # reserved.estimate.typical: what to charge if the engine reports no usage
    # reserved.completion_cap: never charge (nor relay) more completion tokens than this

- `/v1/chat/completions`: `prompts_field=None, kind="chat"`; `/v1/completions`: `"prompt"`, `"completions"`.
- `/v1/messages` (Anthropic), `/v1/responses`: `prompts_field=None` (the whole body is one templated prompt:
  `system`/`instructions`, messages or input items, content blocks, tools, all counted), their own
  `max_tokens` / `max_output_tokens`, `kind=None` (`/tokenize` takes neither shape: the bound decides).
- `/v1/embeddings`: `prompts_field="input"` (a string, token ids, or a list of either), `max_tokens=0`
  (nothing is generated: only the prompt is reserved, and `completion_cap` is 0), `kind=None`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from fleetgate.gateway.discovery import EndpointSource, context_length
from fleetgate.gateway.estimate import RequestEstimate, completion_cap, estimate_body, reserve_request
from fleetgate.gateway.parsing import Kind
from fleetgate.gateway.prompt_bound import DEFAULT_PROFILE, PromptProfile
from fleetgate.gateway.settings import GatewaySettings
from fleetgate.gateway.stages import Limiter, Reservation, Tenant
from fleetgate.gateway.token_count import EngineTokenCounter


@dataclass(frozen=True, slots=True)
class Reserved:
    reservation: Reservation
    estimate: RequestEstimate  # what was reserved: the bound, or the exact count
    completion_cap: int  # completion tokens reserved over all sequences


class Reserver:
    def __init__(self, *, settings: GatewaySettings, source: EndpointSource, limiter: Limiter,
                 session: Callable[[], aiohttp.ClientSession]) -> None:
        names = [(m, n) for m in settings.models for n in (m.name, *(a.name for a in m.adapters))]
        self._context = {n: m.max_model_len for m, n in names if m.max_model_len}
        self._profiles = {n: m.prompt_bound.profile() for m, n in names}
        self._source = source
        self._limiter = limiter
        self._default = settings.server.default_max_tokens
        self._counter: EngineTokenCounter | None = None  # exact prompt counts where the bound would refuse
        if settings.server.exact_token_count:
            self._counter = EngineTokenCounter(source=source, session=session,
                                               timeout_s=settings.server.token_count_timeout_s)

    def context_of(self, model: str) -> int | None:
        """The model's context length: configured on its route, else what discovery knows."""
        return self._context.get(model) or context_length(self._source, model)

    def profile_of(self, model: str) -> PromptProfile:
        return self._profiles.get(model, DEFAULT_PROFILE)

    async def reserve(self, tenant: Tenant, *, model: str, body: Mapping[str, Any], prompts_field: str | None,
                      max_tokens: int | None, kind: Kind | None = None) -> Reserved:
        """Raise `RateLimitError` (429) when even the exact count does not fit (see `estimate`)."""
        context = self.context_of(model)
        estimate = estimate_body(body, prompts_field=prompts_field, profile=self.profile_of(model), context=context)
        reservation, estimate = await reserve_request(
            limiter=self._limiter, tenant=tenant, model=model, body=body, max_tokens=max_tokens, estimate=estimate,
            context=context, default=self._default, counter=self._counter, kind=kind)
        cap = completion_cap(reservation, max_tokens=max_tokens, sequences=estimate.sequences)
        return Reserved(reservation=reservation, estimate=estimate, completion_cap=cap)
