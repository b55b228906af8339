"""The exit report of usage a stopping gateway could not confirm written (its Redis stalled or down at shutdown).

There is no durable queue on the gateway's side: ledger additions that failed wait in memory (`TenancyAccountant`)
and die with the process. So whatever was not confirmed by the shutdown deadline (`server.settle_s`) is said once
per request, loudly: an error line on `fleetgate.usage` (the logger of the per-request `usage` lines, whose fields it
repeats, so a log pipeline can re-bill it) and `fleetgate_unwritten_tokens_total{tenant, kind}`. `attempted` says
the write had been sent or was under way: a Redis that was only stalled applies a write it had received once it
runs again, so such a request may be in the ledger after all (never twice: the addition carries a one-time token).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from fleetgate.gateway.metrics import GatewayMetrics
from fleetgate.gateway.stages import Unwritten

log = logging.getLogger("fleetgate.usage")
MESSAGE = "usage not written: the store did not confirm it before the gateway stopped"


def report(items: Sequence[Unwritten], metrics: GatewayMetrics) -> None:
    for item in items:
        u = item.usage
        log.error(MESSAGE, extra={
            "request_id": item.request_id, "tenant": item.tenant, "model": item.model, "tier": item.tier,
            "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "cached_tokens": u.cached_tokens, "cost_micros": item.cost_micros, "attempted": item.attempted,
        })
        metrics.unwritten_requests.labels(item.tenant).inc()
        for kind, amount in (("prompt", u.prompt_tokens), ("completion", u.completion_tokens),
                             ("cached", u.cached_tokens)):
            metrics.unwritten_tokens.labels(item.tenant, kind).inc(amount)
