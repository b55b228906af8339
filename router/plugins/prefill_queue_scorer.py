"""Scorer + observer: prefer endpoints with less prefill queued ahead of a new request.

Why: time to first token is mostly the prefill an engine must do before this request's own, and a count of
requests in flight does not see it: twenty decoding requests cost a new prompt little, one 2,000-token prompt
not yet started costs it a whole prefill. On two H100s with unique 256-2,048-token prompts, routing by
request counts (least-loaded, and the default's load scorers) gave a TTFT p90 5-20% above round-robin's,
which at least splits every burst (docs/reports/gpu-routing.md).

State: for each request sent and not yet
past its first token, the prompt tokens the chosen endpoint must compute, estimated as
t x (1 - c_e): t = the prompt's tokens (the precise scorer's token count when it ran, else
len(prompt_text) / charsPerToken, where `auto` is the characters per token the model's engines report,
`FleetState.chars_per_token`, 4 until learned) and c_e = the share of the prompt the prefix scorer in the same profile
believes e holds (`CACHED_SHARE`; 0 without one). An entry leaves at the first generated token
(`on_first_token`), at completion, or after `maxPendingS` (a request whose first token is never reported).
With `shared` (auto: on when the store is networked) and gateway replicas sharing a store (`redis_url`), each
replica's map is shared through it (`fleetgate.router.prefill_sync`: a background sync every `syncIntervalS`,
maps older than `syncMaxAgeS` ignored, local figures alone while the store is down) and P_e below counts every
replica's queue: this replica's own entries plus the others' last-known totals. Without it each replica sees about
1/N of the queue (issue 24: two replicas' background TTFT p50 0.15 s against one's 0.089 s on 2 H200s).
Measured on 2 H200s (runs 7a and 7c, the order reversed between them; docs/reports/gpu-routing.md): with two gateway
replicas sharing Redis, sharing cut the background TTFT p50 from 0.188 to 0.136 s and 0.132 to 0.119 s, p90 0.566 to
0.277 s and 0.341 to 0.259 s, so it is on by default wherever the store is networked (`auto`). The CPU box's
simulator had it worse past saturation (docs/reports/gateway-replicas.md); the GPUs decide.

Formula: W_e = P_e + t x (1 - c_e g_e), the prefill e would do before this request's first token: P_e, the sum
of e's entries, plus this request's own uncached tokens there (`includeOwn`, default on; off: W_e = P_e), with
g_e the shared hotspot guard (`hotspot_guard`: a cached prefix stops counting on an endpoint carrying more
than `hotspotMargin` requests over the least loaded, so one hot prefix cannot draw every request);
score_e = 1 - (W_e - min W) / max(max W - min W, scaleTokens), so a difference of a whole long prompt or more
is a full vote and a few hundred tokens a small one. In token units, affinity and queued work trade off
directly: a 2,600-token cache hit is worth waiting behind up to ~2,600 tokens of someone else's prefill.
`warmShare` (default null: never; the shipped default profile sets 0.5): when some candidate holds at least this
share of the prompt, the scorer abstains (every score 1) and prefix affinity decides, so queued prefill only places
prompts nobody holds. Why the default sets it: on 2 H100s at 1.2x round-robin's capacity, letting queued prefill
move warm prompts lost 9-18 points of cache hits in two runs of three (the prefix ends up held twice and, under KV
pressure, evicts others), while it won at 1.0x in all three (docs/reports/gpu-routing.md, runs 4a-4c).
Parameters: scaleTokens (2048), charsPerToken (auto), maxPendingS (30), includeOwn (true), hotspotMargin (2; null
disables the guard), hotspotRelativeMargin (null; as the prefix scorer's), warmShare (null), shared (auto: share
through a networked store such as Redis, not the in-memory one; true; false), syncIntervalS (0.05),
syncMaxAgeS (2).
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from fleetgate.core.kvstore import MemoryKVStore
from fleetgate.core.tasks import cancel_and_wait
from fleetgate.core.types import Endpoint, Usage
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.plugins.base import (
    CACHED_SHARE,
    PROMPT_TOKENS,
    CycleState,
    PluginContext,
    hotspot_guard,
    param,
)
from fleetgate.router.prefill_sync import PrefillQueueSync
from fleetgate.router.token_ratio import FALLBACK, chars_per_token_param
from fleetgate.router.types import RoutingRequest


class PrefillQueueScorer:
    def __init__(
        self, *, name: str, state: FleetState, scale_tokens: float = 2048.0, chars_per_token: float | None = 4.0,
        max_pending_s: float = 30.0, include_own: bool = True, hotspot_margin: float | None = 2.0,
        hotspot_relative_margin: float | None = None, warm_share: float | None = None,
        sync: PrefillQueueSync | None = None,
    ) -> None:
        if scale_tokens <= 0 or (chars_per_token is not None and chars_per_token <= 0) or max_pending_s <= 0:
            raise ValueError("scaleTokens, charsPerToken and maxPendingS must be positive")
        if hotspot_margin is not None and hotspot_margin <= 0:  # the guard divides by it
            raise ValueError("hotspotMargin must be positive (or null to disable the guard)")
        if hotspot_relative_margin is not None and hotspot_relative_margin < 0:
            raise ValueError("hotspotRelativeMargin must be >= 0 (or null)")
        if warm_share is not None and not 0 < warm_share <= 1:
            raise ValueError("warmShare must be in (0, 1] (or null: never abstain)")
        self.name = name
        self.state = state
        self.scale_tokens = scale_tokens
        self.chars_per_token = chars_per_token  # None: auto, learned per model
        self.max_pending_s = max_pending_s
        self.include_own = include_own
        self.hotspot_margin = hotspot_margin
        self.hotspot_relative_margin = hotspot_relative_margin
        self.warm_share = warm_share
        # request id -> (endpoint id, tokens, clock time sent); insertion order is send order (expiry from the front)
        self._pending: OrderedDict[str, tuple[str, float, float]] = OrderedDict()
        self.queued: dict[str, float] = {}  # endpoint id -> prefill tokens sent there and not started
        self.sync = sync
        self._sync_task: asyncio.Task[None] | None = None

    def score(self, req: RoutingRequest, cycle: CycleState, endpoints: Sequence[Endpoint]) -> list[float]:
        self._expire()
        if self.sync is not None and self._sync_task is None:  # the first decision starts it: it needs the loop
            self._sync_task = asyncio.create_task(self.sync.run(self._snapshot), name="prefill-queue-sync")
        cached = cycle.get(CACHED_SHARE, {})
        if self.warm_share is not None and any(cached.get(e.id, 0.0) >= self.warm_share for e in endpoints):
            return [1.0] * len(endpoints)  # a warm prompt: prefix affinity and its hotspot guard decide
        if self.sync is None:
            queued = [self.queued.get(e.id, 0.0) for e in endpoints]
        else:
            others = self.sync.others()
            queued = [self.queued.get(e.id, 0.0) + others.get(e.id, 0.0) for e in endpoints]
        if self.include_own:
            tokens = self._tokens(req, cycle)
            shares = [min(1.0, max(0.0, cached.get(e.id, 0.0))) for e in endpoints]
            hotspot_guard(shares, endpoints, self.state, self.hotspot_margin, self.hotspot_relative_margin)
            queued = [q + tokens * (1.0 - s) for q, s in zip(queued, shares, strict=True)]
        low = min(queued, default=0.0)
        span = max(max(queued, default=0.0) - low, self.scale_tokens)
        return [1.0 - (q - low) / span for q in queued]

    def _snapshot(self) -> dict[str, float]:
        self._expire()
        return self.queued

    async def sync_now(self) -> bool:
        return True if self.sync is None else await self.sync.sync(self._snapshot())

    async def aclose(self) -> None:
        await cancel_and_wait(self._sync_task)

    def _tokens(self, req: RoutingRequest, cycle: CycleState) -> float:
        counted = cycle.get(PROMPT_TOKENS)
        if counted is not None:
            return float(counted)
        cpt = self.chars_per_token or self.state.chars_per_token.get(req.model, FALLBACK)
        return len(req.prompt_text) / cpt

    def on_start(self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint) -> None:
        tokens = self._tokens(req, cycle)
        share = cycle.get(CACHED_SHARE, {}).get(endpoint.id, 0.0)
        self._drop(req.key)  # a retry on another endpoint replaces the first try
        work = tokens * (1.0 - min(1.0, max(0.0, share)))
        self._pending[req.key] = (endpoint.id, work, self.state.clock())
        self.queued[endpoint.id] = self.queued.get(endpoint.id, 0.0) + work

    def on_first_token(self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint) -> None:
        self._drop(req.key)

    def on_complete(
        self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint, *, ok: bool, usage: Usage | None
    ) -> None:
        self._drop(req.key)

    def _drop(self, key: str) -> None:
        entry = self._pending.pop(key, None)
        if entry is None:
            return
        endpoint_id, work, _ = entry
        left = self.queued.get(endpoint_id, 0.0) - work
        if left > 1e-6:
            self.queued[endpoint_id] = left
        else:
            self.queued.pop(endpoint_id, None)

    def _expire(self) -> None:
        cutoff = self.state.clock() - self.max_pending_s
        while self._pending:
            key, (_, _, sent) = next(iter(self._pending.items()))
            if sent > cutoff:
                return
            self._drop(key)


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> PrefillQueueScorer:
    shared = parameters.get("shared", "auto")  # on with a networked store, as measured on GPUs (module docstring)
    if shared not in ("auto", True, False):
        raise ValueError(f"parameter 'shared' must be auto, true or false, got {shared!r}")
    sync = None
    networked = ctx.kvstore is not None and not isinstance(ctx.kvstore, MemoryKVStore)
    if ctx.kvstore is not None and (shared is True or (shared == "auto" and networked)):
        sync = PrefillQueueSync(kvstore=ctx.kvstore, namespace=ctx.namespace, clock=ctx.clock,
                                interval_s=param(parameters, "syncIntervalS", 0.05, float),
                                max_age_s=param(parameters, "syncMaxAgeS", 2.0, float))
    return PrefillQueueScorer(
        name=name,
        state=ctx.state,
        scale_tokens=param(parameters, "scaleTokens", 2048.0, float),
        chars_per_token=chars_per_token_param(parameters.get("charsPerToken", "auto"), float),
        max_pending_s=param(parameters, "maxPendingS", 30.0, float),
        include_own=param(parameters, "includeOwn", True, bool),
        hotspot_margin=param(parameters, "hotspotMargin", 2.0, float),
        hotspot_relative_margin=param(parameters, "hotspotRelativeMargin", None, float),
        warm_share=param(parameters, "warmShare", None, float),
        sync=sync,
    )
