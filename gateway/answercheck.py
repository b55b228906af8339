"""The gateway's side of the cache's answer checks (`fleetgate.cache.answercheck`, vCache-style).

After a semantic hit was served, `start_answer_check` hands the cache an `ask` callable; when the cache
samples the hit (greedy requests only, `cache.semantic.answer_check.sample_rate`), `ask` re-sends the
same request, non-streaming, to the model that produced the cached answer, in a task the cache owns (the
client already has its answer; leaving does not cancel the check). The engine call goes through the same
forwarder as any request (scheduler, retries), under the tenant `GATEWAY`: its usage is recorded as the
gateway's own cost (ledger and metrics under that tenant, and the cache's token counter), never billed to
the tenant whose hit was sampled, and no tenant budget is reserved for it. A model with no serving endpoint
(scaled to zero) is skipped rather than woken.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from fleetgate.cache.types import CacheLookup, CacheStatus, ResponseCache
from fleetgate.core.types import Usage
from fleetgate.gateway.context import Attempt, RequestContext
from fleetgate.gateway.stages import RequestRecord, Tenant

GATEWAY = Tenant(id="fleetgate-gateway", name="the gateway's own answer checks")
Call = Callable[[RequestContext, list[tuple[str, str | None]]], Awaitable[tuple[Attempt, dict[str, Any], Usage, bytes]]]


def start_answer_check(
    *,
    cache: ResponseCache,
    ctx: RequestContext,
    lookup: CacheLookup,
    call: Call,
    finished: Callable[[RequestContext], None],
    record: Callable[[RequestRecord], Awaitable[None]],
    served: Callable[[], list[str]],
) -> None:
    """Offer a served semantic hit to the cache's answer checker (a no-op when checks are off)."""
    check_hit = getattr(cache, "check_hit", None)
    if check_hit is None or lookup.status != CacheStatus.HIT_SEMANTIC or ctx.cache_request is None:
        return
    model = ctx.served_model or ""

    async def ask() -> tuple[str, int] | None:
        check = RequestContext(
            request_id=f"{ctx.request_id}:answer-check",
            received_at=time.perf_counter(),
            tenant=GATEWAY,
            parsed=ctx.parsed,
            authenticated=True,
        )
        try:
            attempt, obj, usage, _ = await call(check, [(model, None)])
        finally:
            finished(check)
        await record(
            RequestRecord(
                request_id=check.request_id,
                tenant=GATEWAY,
                model=attempt.model,
                tier=attempt.tier,
                endpoint=attempt.endpoint.id,
                usage=usage,
                status=200,
                stream=False,
                cache_status="answer-check",
                duration_s=time.perf_counter() - check.received_at,
            )
        )
        choice = (obj.get("choices") or [{}])[0]
        text = (choice.get("message") or {}).get("content") or choice.get("text") or ""
        return str(text), usage.total_tokens

    check_hit(ctx.cache_request, lookup, ask=ask, busy=lambda: model not in served())
