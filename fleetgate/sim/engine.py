"""The simulated engine core: continuous batching over a prefix-caching KV cache, in engine time.

No clock and no I/O here: a driver calls `plan_step(now)`, waits the returned `Step.duration_s`
(real time scaled, or virtual time in a discrete-event simulation) and calls `finish_step`.

Scheduling per step (vLLM v1, first come first served, no preemption):
- every running sequence decodes one token;
- waiting requests are admitted in arrival order while fewer than `max_num_seqs` run, the KV cache
  can hold the prompt plus `max_tokens` (after evicting unpinned cached blocks, LRU), and the step's
  prefill budget `max_batched_tokens` is not exceeded (the first admission always fits);
- an admitted request prefills only its *uncached* tokens and emits its first token at the end of
  the step, so TTFT = queueing + prefill of the uncached prompt (see `SimProfile` for the formula).
Cached tokens = leading full blocks already in the cache, capped so at least one prompt token is
computed (as vLLM does). Counters follow vLLM's prefix-cache metrics: queries and hits in tokens.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from fleetgate.router.hashing import chained_block_hashes
from fleetgate.sim.kvcache import Allocation, PrefixKVCache
from fleetgate.sim.profile import SimProfile


def count_tokens(text: str, *, chars_per_token: int) -> int:
    """Deterministic approximate tokeniser: one token per `chars_per_token` UTF-8 bytes."""
    return max(1, -(-len(text.encode("utf-8", "surrogatepass")) // chars_per_token))


@dataclass(slots=True, eq=False)
class SimRequest:
    id: str
    prompt_tokens: int
    block_hashes: list[int]
    max_tokens: int
    arrival_s: float
    cached_tokens: int = 0
    generated: int = 0
    first_token_s: float | None = None
    finish_s: float | None = None
    alloc: Allocation | None = None
    listener: Callable[[SimRequest], None] | None = None  # called after each token and at finish

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def done(self) -> bool:
        return self.finish_s is not None


@dataclass(slots=True)
class Step:
    duration_s: float
    admitted: list[SimRequest]
    decoding: list[SimRequest]
    prefill_tokens: int


@dataclass(slots=True)
class EngineCounters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0  # tokens looked up in the prefix cache
    prefix_hits: int = 0  # tokens found
    requests_success: int = 0
    requests_started: int = 0  # requests received (engine calls)
    busy_s: float = 0.0  # simulated seconds spent executing steps (what the GPUs are paid for)


class SimEngine:
    def __init__(self, *, profile: SimProfile, name: str = "sim-0") -> None:
        self.profile = profile
        self.name = name
        self.kv = PrefixKVCache(num_blocks=profile.num_blocks)
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.counters = EngineCounters()
        self.on_first_token: Callable[[SimRequest], None] | None = None

    def make_request(self, *, request_id: str, prompt: str, max_tokens: int | None, now: float) -> SimRequest:
        p = self.profile
        tokens = count_tokens(prompt, chars_per_token=p.chars_per_token)
        hashes = chained_block_hashes(prompt, block_chars=p.block_size * p.chars_per_token)
        out = max(1, max_tokens if max_tokens is not None else p.default_max_tokens)
        if -(-(tokens + out) // p.block_size) > p.num_blocks:
            raise ValueError(f"prompt of {tokens} tokens plus {out} output tokens exceeds the KV cache")
        return SimRequest(id=request_id, prompt_tokens=tokens, block_hashes=hashes, max_tokens=out, arrival_s=now)

    def add(self, req: SimRequest) -> None:
        self.counters.requests_started += 1
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def plan_step(self) -> Step | None:
        p = self.profile
        admitted: list[SimRequest] = []
        budget = p.max_batched_tokens
        prefill = 0
        while self.waiting and len(self.running) + len(admitted) < p.max_num_seqs:
            req = self.waiting[0]
            max_hit = (req.prompt_tokens - 1) // p.block_size
            hit = min(self.kv.match(req.block_hashes), max_hit)
            uncached = req.prompt_tokens - hit * p.block_size
            if admitted and uncached > budget:
                break
            total_blocks = -(-(req.prompt_tokens + req.max_tokens) // p.block_size)
            alloc = self.kv.allocate(
                req.block_hashes, private_blocks=total_blocks - len(req.block_hashes), max_hit_blocks=max_hit
            )
            if alloc is None:
                break
            self.waiting.popleft()
            req.alloc = alloc
            req.cached_tokens = alloc.hit_blocks * p.block_size
            uncached = req.prompt_tokens - req.cached_tokens
            c = self.counters
            c.prompt_tokens += req.prompt_tokens
            c.prefix_queries += req.prompt_tokens
            c.prefix_hits += req.cached_tokens
            budget -= uncached
            prefill += uncached
            admitted.append(req)
        decoding = list(self.running)
        if not admitted and not decoding:
            return None
        duration = p.step_overhead_s + p.prefill_s_per_token * prefill + p.decode_s_per_seq * len(decoding)
        self.running.extend(admitted)
        return Step(duration_s=duration, admitted=admitted, decoding=decoding, prefill_tokens=prefill)

    def finish_step(self, step: Step, *, now: float) -> list[SimRequest]:
        """Apply a planned step that ended at `now`; returns the requests that finished."""
        c = self.counters
        c.busy_s += step.duration_s
        for req in step.admitted:
            req.first_token_s = now
            req.generated = 1
            if self.on_first_token is not None:
                self.on_first_token(req)
        for req in step.decoding:
            req.generated += 1
        c.generation_tokens += len(step.admitted) + len(step.decoding)
        finished = [r for r in self.running if r.generated >= r.max_tokens]
        if finished:
            self.running = [r for r in self.running if r.generated < r.max_tokens]
            for req in finished:
                req.finish_s = now
                if req.alloc is not None:
                    self.kv.release(req.alloc)
                c.requests_success += 1
        for req in (*step.admitted, *step.decoding):
            if req.listener is not None:
                req.listener(req)
        return finished

    def abort(self, req: SimRequest) -> None:
        """Drop a request (client went away): free its KV blocks, as vLLM does."""
        if req.done:
            return
        if req in self.waiting:
            self.waiting.remove(req)
        elif req in self.running:
            self.running.remove(req)
            if req.alloc is not None:
                self.kv.release(req.alloc)
        req.finish_s = req.arrival_s if req.first_token_s is None else req.first_token_s

    @property
    def kv_usage(self) -> float:
        return self.kv.used_blocks / self.kv.num_blocks
