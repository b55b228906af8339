"""Prefix affinity: producer + scorer + observer. Send a prompt where its prefix is likely cached.

Producer: hash `req.prompt_text` into chained blocks of `blockChars` bytes (at most `maxBlocks`;
see `fleetgate.router.hashing`) and, when the index is shared, start a background sync with the
other gateway replicas when one is due (never awaited on the request path; fails open).
Scorer: for each endpoint e, m_e = longest run of leading blocks e is believed to hold
(`PrefixIndex.match`), n = number of blocks, m_min = the smallest m over candidates, and

    score_e = ((m_e - m_min) / n) * g_e,
                                 g_e = 1                                  if x_e <= margin
                                 g_e = max(0, 1 - (x_e - margin) / margin)  otherwise

The score is the share of the prompt's prefill that e saves *over the least-cached candidate*: a
prefix every endpoint holds (a system prompt replicated everywhere) earns nothing and leaves the
choice to load. x_e = load_e - min over candidates of load (`FleetState.load`) is e's excess load. The guard
g fades the preference out between `hotspotMargin` and twice that excess, so one hot prefix (a
shared system prompt) cannot pile every request onto one pod; load scorers then spread it.
Prompts shorter than one block score 0 everywhere.
Observer: on start, record the prompt's blocks on the chosen endpoint, bounded by that engine's KV
capacity (`vllm:cache_config_info` when scraped, else `defaultCapacityTokens`), converted to
blocks with `charsPerToken`: `auto` (default) uses the characters per token the model's engines report
(`FleetState.chars_per_token`; 4 until learned) and resizes an endpoint's capacity when it moves by more than 5%;
a number fixes it. Why auto: Llama 3.1 counts 6.48 characters per token of English, so at 4 the index held 0.62
of what the engines cache and forgot prefixes they still had (docs/reports/chars-per-token.md).
Parameters: blockChars (512), maxBlocks (256), charsPerToken (auto), defaultCapacityTokens (16384),
capacityTokens (overrides the scraped capacity: set it for hybrid-attention models such as Gemma 3,
whose `num_gpu_blocks` are shared by several KV-cache groups, so blocks x block size overstates it),
hotspotMargin (2 requests; null disables the guard), hotspotRelativeMargin (null; r: the guard's margin is
max(hotspotMargin, r x the least candidate load), so past saturation a few requests of difference do not move a
prompt group; `hotspot_guard`), shared (auto: on when the KV store is not
the in-memory one), syncIntervalS (0.05).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from fleetgate.core.kvstore import MemoryKVStore
from fleetgate.core.tasks import cancel_and_wait
from fleetgate.core.types import Endpoint, Usage
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.hashing import chained_block_hashes
from fleetgate.router.plugins.base import CACHED_SHARE, CycleState, PluginContext, hotspot_guard, param
from fleetgate.router.prefix_index import PrefixIndex
from fleetgate.router.prefix_sync import PrefixIndexSync
from fleetgate.router.token_ratio import FALLBACK, chars_per_token_param
from fleetgate.router.types import RoutingRequest

HASHES = "prefix.hashes"


class PrefixAffinityScorer:
    def __init__(
        self,
        *,
        name: str,
        state: FleetState,
        block_chars: int = 512,
        max_blocks: int = 256,
        chars_per_token: float | None = 4,  # None: auto, learned per model (FleetState.chars_per_token)
        default_capacity_tokens: int = 16_384,
        hotspot_margin: float | None = 2.0,
        hotspot_relative_margin: float | None = None,
        capacity_tokens: int | None = None,
        sync: PrefixIndexSync | None = None,
        index: PrefixIndex | None = None,
    ) -> None:
        if block_chars <= 0 or max_blocks <= 0 or (chars_per_token is not None and chars_per_token <= 0):
            raise ValueError("blockChars, maxBlocks and charsPerToken must be positive")
        if hotspot_margin is not None and hotspot_margin <= 0:
            raise ValueError("hotspotMargin must be positive (or null to disable the guard)")
        if hotspot_relative_margin is not None and hotspot_relative_margin < 0:
            raise ValueError("hotspotRelativeMargin must be >= 0 (or null)")
        self.name = name
        self.state = state
        self.block_chars = block_chars
        self.max_blocks = max_blocks
        self.chars_per_token = chars_per_token
        self.hotspot_margin = hotspot_margin
        self.hotspot_relative_margin = hotspot_relative_margin
        self.capacity_tokens = capacity_tokens
        self.default_capacity_tokens = default_capacity_tokens
        default_blocks = max(1, int(default_capacity_tokens * (chars_per_token or FALLBACK) // block_chars))
        self.index = index or (sync.index if sync else PrefixIndex(default_capacity_blocks=default_blocks))
        self.sync = sync
        self._sync_task: asyncio.Task[bool] | None = None
        # endpoint id -> (capacity tokens, characters per token) its index capacity was last set from
        self._capacity_seen: dict[str, tuple[int, float]] = {}
        # The prompt's block hashes in the cycle, keyed by what they depend on: two approximate indexes in one
        # profile (the precise preset's `history` beside the precise scorer's embedded fallback) hash a prompt
        # once when their blocks agree, and never read each other's hashes when they do not.
        self._hashes_key = f"{HASHES}:{block_chars}:{max_blocks}"

    async def produce(self, req: RoutingRequest, cycle: CycleState, endpoints: Sequence[Endpoint]) -> None:
        self.hashes(req, cycle)
        if self.sync is not None and self.sync.due() and (self._sync_task is None or self._sync_task.done()):
            self._sync_task = asyncio.create_task(self.sync.sync(), name="prefix-index-sync")

    def hashes(self, req: RoutingRequest, cycle: CycleState) -> list[int]:
        hashes: list[int] | None = cycle.get(self._hashes_key)
        if hashes is None:  # the first of the profile's approximate indexes with these blocks (or a bare scorer)
            hashes = cycle[self._hashes_key] = chained_block_hashes(
                req.prompt_text, block_chars=self.block_chars, max_blocks=self.max_blocks
            )
        return hashes

    def score(self, req: RoutingRequest, cycle: CycleState, endpoints: Sequence[Endpoint]) -> list[float]:
        hashes = self.hashes(req, cycle)
        if not hashes:
            return [0.0] * len(endpoints)
        n = len(hashes)
        match = self.index.match
        matched = [match(e.id, hashes) for e in endpoints]
        floor = min(matched)
        scores = [(m - floor) / n for m in matched]
        hotspot_guard(scores, endpoints, self.state, self.hotspot_margin, self.hotspot_relative_margin)
        cycle["prefix.matched_blocks"] = matched
        cycle[CACHED_SHARE] = {e.id: m / n for e, m in zip(endpoints, matched, strict=True)}
        return scores

    def on_start(self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint) -> None:
        st = self.state.stats.get(endpoint.id)
        cap_tokens = self.capacity_tokens or (st.kv_capacity_tokens if st is not None else None)
        cpt = self.chars_per_token
        seen = self._capacity_seen.get(endpoint.id)
        if cpt is None:  # auto: an unscraped engine's default capacity follows the learned ratio too
            # A model not learned yet (a new LoRA adapter's name on the same engine) keeps the engine's last ratio:
            # the fallback would shrink the index, evicting what the engine holds, and grow it on the next request.
            cpt = self.state.chars_per_token.get(req.model, seen[1] if seen is not None else FALLBACK)
            cap_tokens = cap_tokens or self.default_capacity_tokens
        # resized when the capacity or the ratio moved (> 5%), not per request; a shrink evicts LRU tails first
        if cap_tokens and (seen is None or seen[0] != cap_tokens or abs(cpt - seen[1]) > 0.05 * seen[1]):
            self._capacity_seen[endpoint.id] = (cap_tokens, cpt)
            self.index.set_capacity(endpoint.id, int(cap_tokens * cpt // self.block_chars))
        hashes = self.hashes(req, cycle)
        if not hashes:
            return
        if self.sync is not None:
            self.sync.record(endpoint.id, hashes)
        else:
            self.index.record(endpoint.id, hashes)

    def on_complete(
        self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint, *, ok: bool, usage: Usage | None
    ) -> None:
        return None

    async def sync_now(self) -> bool:
        return True if self.sync is None else await self.sync.sync()

    async def aclose(self) -> None:
        await cancel_and_wait(self._sync_task)


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> PrefixAffinityScorer:
    block_chars = param(parameters, "blockChars", 512, int)
    chars_per_token = chars_per_token_param(parameters.get("charsPerToken", "auto"), int)
    capacity = param(parameters, "defaultCapacityTokens", 16_384, int)
    shared = parameters.get("shared", "auto")
    if shared not in ("auto", True, False):
        raise ValueError(f"parameter 'shared' must be auto, true or false, got {shared!r}")
    use_sync = ctx.kvstore is not None and (shared is True or (shared == "auto" and not isinstance(
        ctx.kvstore, MemoryKVStore)))
    sync = None
    if use_sync and ctx.kvstore is not None:
        index = PrefixIndex(default_capacity_blocks=max(1, int(capacity * (chars_per_token or FALLBACK)
                                                                // max(1, block_chars))))
        sync = PrefixIndexSync(index=index, kvstore=ctx.kvstore, namespace=ctx.namespace,
                               interval_s=param(parameters, "syncIntervalS", 0.05, float), clock=ctx.clock)
    return PrefixAffinityScorer(
        name=name,
        state=ctx.state,
        block_chars=block_chars,
        max_blocks=param(parameters, "maxBlocks", 256, int),
        chars_per_token=chars_per_token,
        default_capacity_tokens=capacity,
        hotspot_margin=param(parameters, "hotspotMargin", 2.0, float),
        hotspot_relative_margin=param(parameters, "hotspotRelativeMargin", None, float),
        capacity_tokens=param(parameters, "capacityTokens", None, int),
        sync=sync,
    )
