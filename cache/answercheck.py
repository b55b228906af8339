"""Answer-level verification of semantic hits, after verified semantic caching (vCache).

The pair model decides from the two prompts alone; this checks its decisions against the engine. For a
sampled share (`sample_rate`) of semantic hits on greedy requests (temperature 0: a fresh answer is then
comparable), after the client got the cached answer, `AnswerChecker.start` asks the engine the same
request in a background task and compares the fresh answer with the cached one: equal text (whitespace
collapsed) agrees; otherwise the cosine of the two answers' embeddings must be >= `answer_similarity`.

What a disagreement (a false hit) does, online:
- per entry: the entry's similarity bar rises just above the similarity of the hit that failed (`margin`),
  so looser neighbours stop hitting it; after `evict_after` false hits the entry is evicted;
- globally: over the last `window` checks, the similarity floor is the lowest similarity s such that the
  checked hits at >= s have a false-hit rate <= `max_false_hit_rate`; semantic hits below the floor are
  refused (no floor while no false hit was seen).
The estimate is the Beta(1, 1) posterior mean of the false-hit rate over the window.

Bounded and fail-safe: at most `max_in_flight` checks run at once (others are skipped, never queued); a
check is skipped when the caller says the engine is busy or the budget is out; a check never raises
into the request, holds no request resource, and is not cancelled when the client leaves (the task belongs
to the checker). State is in memory per replica (bounded LRU of `max_tracked` entries), so a dead Redis
does not stop it. Who pays: the check's tokens are the gateway's own cost, counted by
`fleetgate_cache_answer_check_tokens_total`, never billed to the tenant whose hit was sampled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fleetgate.cache.config import AnswerCheckConfig
from fleetgate.cache.metrics import AnswerCheckMetrics

log = logging.getLogger("fleetgate.cache.answercheck")

Ask = Callable[[], Awaitable[tuple[str, int] | None]]  # the engine's answer text and its tokens; None: skipped
Embed = Callable[[Sequence[str]], Awaitable[np.ndarray]]


@dataclass(slots=True)
class _Entry:
    bar: float = -1.0  # the entry's own minimum similarity
    false_hits: int = 0


class AnswerChecker:
    def __init__(
        self,
        *,
        config: AnswerCheckConfig,
        metrics: AnswerCheckMetrics,
        embed: Embed | None,
        evict: Callable[[str], Awaitable[None]],
        rng: random.Random | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics
        self._embed = embed
        self._evict = evict
        self._rng = rng or random.Random()
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._recent: deque[tuple[float, bool]] = deque(maxlen=config.window)  # (similarity, false hit)
        self._floor = -1.0
        self._tasks: set[asyncio.Task[None]] = set()

    # -- the lookup's side (hot path: dictionary reads only) -------------------------------------------
    def bar(self, key: str) -> float:
        """The similarity a semantic hit on entry `key` needs beyond the cache's own gates."""
        entry = self._entries.get(key)
        return max(self._floor, entry.bar) if entry is not None else self._floor

    def sample(self, *, greedy: bool) -> bool:
        return greedy and self._rng.random() < self.config.sample_rate

    # -- the check ---------------------------------------------------------------------------------------
    def start(
        self,
        *,
        key: str,
        similarity: float,
        cached: str,
        ask: Ask,
        busy: Callable[[], bool] = lambda: False,
        budget_left: Callable[[], bool] = lambda: True,
    ) -> asyncio.Task[None] | None:
        """Check one served hit in the background; None when skipped. The task is the checker's own."""
        if busy():
            self.metrics.checks.labels("skipped_busy").inc()
            return None
        if not budget_left():
            self.metrics.checks.labels("skipped_budget").inc()
            return None
        if len(self._tasks) >= self.config.max_in_flight:
            self.metrics.checks.labels("skipped_concurrency").inc()
            return None
        task = asyncio.create_task(
            self._run(key=key, similarity=similarity, cached=cached, ask=ask), name="cache-answer-check"
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _run(self, *, key: str, similarity: float, cached: str, ask: Ask) -> None:
        try:
            fresh = await asyncio.wait_for(ask(), timeout=self.config.timeout_s)
            if fresh is None:
                self.metrics.checks.labels("skipped_busy").inc()
                return
            text, tokens = fresh
            self.metrics.tokens.inc(max(0, tokens))
            agree = await self.agree(cached, text)
            await self.record(key=key, similarity=similarity, agree=agree)
        except Exception as exc:  # a check must never surface anywhere but its metric and one log line
            self.metrics.checks.labels("error").inc()
            log.warning("answer check failed: %s", exc)

    async def agree(self, cached: str, fresh: str) -> bool:
        a, b = " ".join(cached.split()), " ".join(fresh.split())
        if a == b:
            return True
        if self._embed is None:
            return False
        vectors = await self._embed([a, b])
        return float(np.dot(vectors[0], vectors[1])) >= self.config.answer_similarity

    async def record(self, *, key: str, similarity: float, agree: bool) -> None:
        """Learn from one checked hit: the entry's bar, eviction, the global floor and the estimate."""
        self.metrics.checks.labels("agree" if agree else "false_hit").inc()
        self._recent.append((similarity, not agree))
        if not agree:
            entry = self._entries.pop(key, None) or _Entry()
            entry.bar = max(entry.bar, similarity + self.config.margin)
            entry.false_hits += 1
            self._entries[key] = entry
            while len(self._entries) > self.config.max_tracked:
                self._entries.popitem(last=False)
            if entry.false_hits >= self.config.evict_after:
                self.metrics.evictions.inc()
                try:
                    await self._evict(key)
                    self._entries.pop(key, None)  # gone; an answer stored again under its key starts afresh
                except Exception as exc:  # a dead store: the entry's bar still keeps it out
                    log.warning("answer check: evicting %s failed: %s", key, exc)
        self._floor = self.floor()
        self.metrics.floor.set(max(0.0, self._floor))
        false = sum(f for _, f in self._recent)
        self.metrics.false_hit_rate.set((false + 1) / (len(self._recent) + 2))

    def floor(self) -> float:
        """The lowest checked similarity s whose checked hits at >= s stay within the bound (-1: no floor)."""
        if not any(f for _, f in self._recent):
            return -1.0
        ordered = sorted(self._recent, reverse=True)  # most similar first
        best, false = None, 0
        for n, (s, f) in enumerate(ordered, start=1):
            false += f
            if false / n <= self.config.max_false_hit_rate:
                best = s
        return best if best is not None else ordered[0][0] + self.config.margin

    async def aclose(self) -> None:
        for task in list(self._tasks):
            with contextlib.suppress(BaseException):
                await task
