"""Precise prefix affinity: producer + scorer + observer over the blocks each engine says it holds.

Inputs: the request's prompt token ids (`fleetgate.router.prompt_tokens`: the engine's `/tokenize`, or
a local tokenizer), each endpoint's block set rebuilt from its own KV events (`fleetgate.router.kv_fleet`,
`kv_subscriber`, `kv_block_index`), and, for the endpoints whose set cannot be trusted now, the
approximate text index of `prefix-affinity-scorer`, which this plugin embeds and keeps warm (the same
parameters, shared through Redis the same way).

Producer: start following new endpoints' events, run the approximate producer, and, when at least one
candidate's set is usable, get the prompt's tokens and hash them (`token_block_hashes`, per block size
the candidates use, seeded by the LoRA adapter).
Scorer: for each endpoint e, with n_e = full blocks of the prompt at e's block size and m_e = leading
blocks e holds,

    f_e = m_e / n_e                       if e's set is usable (connected, synced, not stale) and tokens known
    f_e = m'_e / n'                       otherwise (approximate index: char blocks sent there), counted by reason
    score_e = (f_e - min_c f_c) * g_e     (g_e: the shared hotspot guard, `hotspot_guard`)

the share of the prompt's blocks e would not recompute, over the least-cached candidate (a prefix every
engine holds earns nothing, so load decides). Prompts shorter than a block score 0.
Observer: on start, the approximate index records the prompt (as the approximate scorer does); when
the chosen endpoint's set was used and did not hold the whole prompt, the engine must store blocks,
so when the request completes without a batch having arrived since it started, the endpoint is expected
to publish within `staleS` (else it is stale and falls back).
Start-up (`start`) loads a local tokenizer before the gateway reports ready, at most `tokenizerLoadTimeoutS` (120 s;
then requests route on the approximate index until it has loaded): loading holds the GIL for seconds.
Parameters: tokenizer (engine | local), tokenizerPaths ({model: dir}, local only), tokenizeTimeoutS (0.5: the
engine's answer, or local, the worker thread's encode; past it, the approximate index),
tokenizerLoadTimeoutS (120),
tokenizeCacheEntries (4096), tokenizeSegmentCacheMiB (64 per model, local only; 0: encode whole prompts),
tokenizeThreadMinChars (null: always on the event loop; local only: N encodes what is left from N characters on
in a worker thread, off the loop: measured worse on GPUs, so opt-in),
staleS (5), replayTimeoutS (2), eventCoalesceS (0.05: after a wake that applied KV-event batches, wait this
long before reading more, so an engine publishing every scheduler step costs one wake per interval; 0 to 1),
kvGroup (null: the full-attention group), port / replayPort / topic
(template for endpoints without discovery labels), maxBlocks (1024 token blocks), hotspotMargin (2; null
disables), hotspotRelativeMargin (null; as the approximate scorer's), and the approximate scorer's blockChars,
maxBlocks as approxMaxBlocks, charsPerToken, defaultCapacityTokens, capacityTokens, shared, syncIntervalS.
"""

from __future__ import annotations

from collections.abc import Sequence
from time import perf_counter
from typing import Any

from fleetgate.core.types import Endpoint, Usage
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.hashing import root_seed, token_block_hashes
from fleetgate.router.kv_fleet import KvEventFleet, KvEventsCollector
from fleetgate.router.plugins import prefix_scorer
from fleetgate.router.plugins.base import CACHED_SHARE, PROMPT_TOKENS, CycleState, PluginContext, hotspot_guard, param
from fleetgate.router.prompt_tokens import THREAD_MIN_CHARS, EngineTokenizer, LocalTokenizer, PromptTokenizer
from fleetgate.router.timing import TimingHistogram
from fleetgate.router.types import RoutingRequest

TOKENS = "precise.tokens"
HASHES = "precise.hashes"  # block size -> the prompt's chained token-block hashes
TOKENIZE_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)


class PrecisePrefixScorer:
    def __init__(
        self, *, name: str, state: FleetState, fleet: KvEventFleet, tokenizer: PromptTokenizer,
        approx: prefix_scorer.PrefixAffinityScorer, max_blocks: int = 1024, hotspot_margin: float | None = 2.0,
        hotspot_relative_margin: float | None = None, tokenize_timer: Any = None, tokenizer_load_s: float = 120.0,
    ) -> None:
        if max_blocks <= 0:
            raise ValueError("maxBlocks must be positive")
        if hotspot_margin is not None and hotspot_margin <= 0:
            raise ValueError("hotspotMargin must be positive (or null to disable the guard)")
        if hotspot_relative_margin is not None and hotspot_relative_margin < 0:
            raise ValueError("hotspotRelativeMargin must be >= 0 (or null)")
        self.name = name
        self.state = state
        self.fleet = fleet
        self.tokenizer = tokenizer
        self.approx = approx
        self.max_blocks = max_blocks
        self.hotspot_margin = hotspot_margin
        self.hotspot_relative_margin = hotspot_relative_margin
        self.tokenize_timer = tokenize_timer
        self.tokenizer_load_s = tokenizer_load_s  # start-up waits this long for a local tokenizer

    async def produce(self, req: RoutingRequest, cycle: CycleState, endpoints: Sequence[Endpoint]) -> None:
        self.fleet.ensure(endpoints)
        await self.approx.produce(req, cycle, endpoints)
        now = self.fleet.clock()
        if not any((st := self.fleet.states.get(e.id)) is not None and st.usable(now) for e in endpoints):
            return  # nobody to be precise about: no tokenization cost
        t0 = perf_counter()
        tokens = await self.tokenizer.tokens(req, endpoints)
        if self.tokenize_timer is not None:
            self.tokenize_timer.observe(perf_counter() - t0)
        if tokens is None:
            return
        cycle[TOKENS] = tokens
        cycle[PROMPT_TOKENS] = len(tokens)
        seed = root_seed(req.adapter)
        hashes: dict[int, list[int]] = {}
        for e in endpoints:
            st = self.fleet.states.get(e.id)
            size = st.blocks.block_size if st is not None else None
            if size is not None and size not in hashes:
                hashes[size] = token_block_hashes(tokens, block_size=size, seed=seed, max_blocks=self.max_blocks)
        cycle[HASHES] = hashes

    def score(self, req: RoutingRequest, cycle: CycleState, endpoints: Sequence[Endpoint]) -> list[float]:
        tokens: list[int] | None = cycle.get(TOKENS)
        hashes: dict[int, list[int]] = cycle.get(HASHES, {})
        now = self.fleet.clock()
        approx_hashes: list[int] | None = None
        shares: list[float] = []
        precise: list[bool] = []
        for e in endpoints:
            st = self.fleet.states.get(e.id)
            if tokens is not None and st is not None and st.usable(now):
                size = st.blocks.block_size
                chain = hashes.get(size, []) if size is not None else []
                shares.append(st.blocks.match(chain) / len(chain) if chain else 0.0)
                precise.append(True)
                continue
            if st is None:
                self.fleet.note_fallback("no-events")  # discovery names no event address for it
            elif not st.usable(now):
                self.fleet.note_fallback(st.reason(now))  # disconnected, syncing or stale
            else:
                self.fleet.note_fallback("tokenize")  # usable, but the prompt's tokens could not be had
            if approx_hashes is None:
                approx_hashes = self.approx.hashes(req, cycle)
            n = len(approx_hashes)
            shares.append(self.approx.index.match(e.id, approx_hashes) / n if n else 0.0)
            precise.append(False)
        floor = min(shares) if shares else 0.0
        scores = [s - floor for s in shares]
        hotspot_guard(scores, endpoints, self.state, self.hotspot_margin, self.hotspot_relative_margin)
        cycle["precise.used"] = precise
        cycle["precise.shares"] = shares
        cycle["precise.ids"] = [e.id for e in endpoints]
        cycle[CACHED_SHARE] = {e.id: share for e, share in zip(endpoints, shares, strict=True)}
        return scores

    def on_start(self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint) -> None:
        self.approx.on_start(req, cycle, endpoint)
        st = self.fleet.states.get(endpoint.id)
        ids: list[str] = cycle.get("precise.ids", [])
        if st is None or endpoint.id not in ids:  # score() did not run for this endpoint
            return
        i = ids.index(endpoint.id)
        size = st.blocks.block_size
        chain = cycle.get(HASHES, {}).get(size, []) if size is not None else []
        if cycle["precise.used"][i] and chain and cycle["precise.shares"][i] < 1.0:  # set by score()
            cycle["precise.expect"] = st.batches  # it must store blocks: an event is due after this request

    def on_complete(
        self, req: RoutingRequest, cycle: CycleState, endpoint: Endpoint, *, ok: bool, usage: Usage | None
    ) -> None:
        self.approx.on_complete(req, cycle, endpoint, ok=ok, usage=usage)
        batches_at_start = cycle.get("precise.expect")
        st = self.fleet.states.get(endpoint.id)
        if ok and batches_at_start is not None and st is not None:
            st.expect_blocks(batches_at_start=batches_at_start)

    async def start(self, source: Any) -> None:
        await self.tokenizer.warm(self.tokenizer_load_s)
        await self.fleet.start(source)

    async def sync_now(self) -> bool:
        return await self.approx.sync_now()

    async def aclose(self) -> None:
        await self.fleet.aclose()
        await self.tokenizer.aclose()
        await self.approx.aclose()


def _tokenizer(*, kind: object, paths: object, timeout_s: float, cache: int, segment_mib: float,
               thread_min_chars: int | None, state: FleetState) -> PromptTokenizer:
    if kind == "engine":
        def least_loaded(endpoints: Sequence[Endpoint]) -> Endpoint:
            return min(endpoints, key=lambda e: state.load(e.id))

        return EngineTokenizer(choose=least_loaded, timeout_s=timeout_s, cache_entries=cache)
    if kind == "local":
        if not isinstance(paths, dict) or not paths or not all(isinstance(v, str) for v in paths.values()):
            raise ValueError("tokenizer: local needs tokenizerPaths, a map of model name -> tokenizer directory")
        if segment_mib < 0:
            raise ValueError("tokenizeSegmentCacheMiB must be 0 (off) or positive")
        return LocalTokenizer(paths={str(k): v for k, v in paths.items()}, cache_entries=cache,
                              segment_bytes=int(segment_mib * (1 << 20)), thread_min_chars=thread_min_chars,
                              timeout_s=timeout_s)
    raise ValueError(f"parameter 'tokenizer' must be engine or local, got {kind!r}")


APPROX_KEYS = ("blockChars", "charsPerToken", "defaultCapacityTokens", "capacityTokens", "shared", "syncIntervalS",
               "hotspotMargin", "hotspotRelativeMargin")


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> PrecisePrefixScorer:
    approx_params = {k: parameters[k] for k in APPROX_KEYS if k in parameters}
    if "approxMaxBlocks" in parameters:
        approx_params["maxBlocks"] = parameters["approxMaxBlocks"]
    approx = prefix_scorer.build(name=f"{name}.approximate", parameters=approx_params, ctx=ctx)
    group = parameters.get("kvGroup")
    if group is not None and (isinstance(group, bool) or not isinstance(group, int) or group < 0):
        raise ValueError(f"parameter 'kvGroup' must be a non-negative integer or null, got {group!r}")
    topic = parameters.get("topic", "")
    if not isinstance(topic, str):
        raise ValueError(f"parameter 'topic' must be a string, got {topic!r}")
    fleet = KvEventFleet(
        stale_s=param(parameters, "staleS", 5.0, float), group=group,
        replay_timeout_s=param(parameters, "replayTimeoutS", 2.0, float),
        port=param(parameters, "port", None, int), replay_port=param(parameters, "replayPort", None, int),
        topic=topic, coalesce_s=param(parameters, "eventCoalesceS", 0.05, float), clock=ctx.clock,
    )
    tokenizer = _tokenizer(
        kind=parameters.get("tokenizer", "engine"), paths=parameters.get("tokenizerPaths"),
        timeout_s=param(parameters, "tokenizeTimeoutS", 0.5, float),
        cache=param(parameters, "tokenizeCacheEntries", 4096, int),
        segment_mib=param(parameters, "tokenizeSegmentCacheMiB", 64.0, float),
        thread_min_chars=param(parameters, "tokenizeThreadMinChars", THREAD_MIN_CHARS, int), state=ctx.state,
    )
    timer = None  # metrics registered last: a parameter error above leaves the registry as it was
    if ctx.registry is not None:
        ctx.registry.register(KvEventsCollector(fleet))
        histogram = TimingHistogram("fleetgate_router_tokenize_seconds",
                                    "Time to get a prompt's token ids for precise prefix routing.", ["plugin"],
                                    buckets=TOKENIZE_BUCKETS)
        ctx.registry.register(histogram)
        timer = histogram.labels(name)
    return PrecisePrefixScorer(
        name=name, state=ctx.state, fleet=fleet, tokenizer=tokenizer, approx=approx,
        max_blocks=param(parameters, "maxBlocks", 1024, int),
        hotspot_margin=param(parameters, "hotspotMargin", 2.0, float),
        hotspot_relative_margin=param(parameters, "hotspotRelativeMargin", None, float), tokenize_timer=timer,
        tokenizer_load_s=param(parameters, "tokenizerLoadTimeoutS", 120.0, float),
    )
