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

With LoRA enabled (`SimProfile.enable_lora`, see `fleetgate.sim.lora` for the slots): a request may name
a registered adapter. A waiting request whose adapter would exceed `max_loras` distinct adapters in the
batch is skipped for this step (later requests may still be admitted, as vLLM's scheduler does); an
admitted request's adapter is swapped into a GPU slot and the step pays for it. Runtime loads
(`request_load`) are paid by the next step too: vLLM runs them in the engine loop, between batches.
Block hashes of an adapter request are re-keyed with the adapter's id, so the prefix cache never shares
blocks between adapters (nor with the base model).

`SimProfile.scheduler = "vllm-v1"` replaces the admission above with what vLLM's v1 scheduler
(`vllm/v1/core/sched/scheduler.py`, `KVCacheManager.allocate_slots`) does, one step at a time:
- a token budget of `max_batched_tokens` per step, shared by everything scheduled in it;
- running requests first, in the order they were admitted: a decoding request takes one token, a
  request whose prompt is not all computed takes the rest of it up to the budget (chunked prefill);
  each grows its KV blocks to cover the tokens it will have computed. When a block cannot be had, the
  newest running request is preempted (its blocks freed, its computed tokens forgotten, back at the head
  of the waiting queue; it recomputes prompt and output when scheduled again) until it can, or until the
  request itself was the one preempted;
- then, only if nobody was preempted in this step, waiting requests in order while the budget lasts and
  fewer than `max_num_seqs` run: the head's cached prefix is looked up, it takes blocks for the tokens it
  computes now (not for its answer), and when they cannot be had the queue stops there (FCFS: nobody
  overtakes). Every lookup counts in the prefix-cache counters, those of a head that then does not fit
  included, as vLLM 0.26's `get_computed_blocks` records them, except a preempted request's: vLLM's
  `PrefixCacheStats.record(preempted=True)` keeps those apart (`preempted_queries`, `preempted_hits`) and
  `vllm:prefix_cache_queries`/`_hits` never see them. Under KV pressure queries therefore outgrow prompt
  tokens and the hit rate a scraper reads falls though the hits per prompt token do not;
- a token comes out for a request once all its tokens are computed: its first token when its prompt is
  done (TTFT), the next one on each decode step, and one when a preempted request has recomputed.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import xxhash

from fleetgate.router.hashing import chained_block_hashes
from fleetgate.sim.kvcache import Allocation, Held, PrefixKVCache
from fleetgate.sim.lora import LoraError, LoraSlots, adapter_rank
from fleetgate.sim.profile import SimProfile


def count_tokens(text: str, *, chars_per_token: float) -> int:
    """Deterministic approximate tokeniser: one token per `chars_per_token` UTF-8 bytes."""
    return max(1, math.ceil(len(text.encode("utf-8", "surrogatepass")) / chars_per_token))


def block_chars(profile: SimProfile) -> int:
    """Characters per KV block of the approximate tokeniser (a fractional `chars_per_token` rounds here)."""
    return max(1, round(profile.block_size * profile.chars_per_token))


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
    adapter: str | None = None  # the LoRA adapter's name; None: the base model
    held: Held | None = None  # vllm-v1: the blocks held now (None while waiting)
    computed: int = 0  # vllm-v1: tokens whose KV is computed (cached hits included)
    preemptions: int = 0

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_token_s is None else self.first_token_s - self.arrival_s

    @property
    def done(self) -> bool:
        return self.finish_s is not None


@dataclass(slots=True, eq=False)
class PendingLoad:
    """A runtime adapter load (`POST /v1/load_lora_adapter`): done once the step carrying it ends."""

    name: str
    path: str
    rank: int
    done: bool = False
    listener: Callable[[PendingLoad], None] | None = None


@dataclass(slots=True)
class Step:
    duration_s: float
    admitted: list[SimRequest]
    decoding: list[SimRequest]
    prefill_tokens: int
    loads: list[PendingLoad] = field(default_factory=list)
    adapters: int = 0  # distinct adapters in the batch
    prefilling: list[SimRequest] = field(default_factory=list)  # vllm-v1: a prompt chunk, no token yet


@dataclass(slots=True)
class EngineCounters:
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_queries: int = 0  # tokens looked up in the prefix cache
    prefix_hits: int = 0  # tokens found
    requests_success: int = 0
    requests_started: int = 0  # requests received (engine calls)
    preemptions: int = 0  # vllm-v1: running requests sent back to the queue for want of KV blocks
    preempted_queries: int = 0  # vllm-v1: lookups of preempted requests, which vLLM counts apart
    preempted_hits: int = 0
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
        self.lora: LoraSlots | None = None
        self.pending_loads: list[PendingLoad] = []
        if profile.enable_lora and profile.scheduler != "reserve":
            raise ValueError("LoRA is simulated with the 'reserve' scheduler only")
        if profile.enable_lora:
            self.lora = LoraSlots(max_loras=profile.max_loras, max_cpu_loras=profile.cpu_loras,
                                  max_lora_rank=profile.max_lora_rank)
            for name, path in profile.lora_modules:  # loaded before serving starts, as vLLM does
                self.lora.register(name=name, path=path, rank=adapter_rank(path, default=profile.lora_default_rank))

    def make_request(
        self, *, request_id: str, prompt: str, max_tokens: int | None, now: float, adapter: str | None = None
    ) -> SimRequest:
        """Raises `LoraError` (404) for an adapter that is not registered, `ValueError` for a prompt that
        cannot fit the KV cache."""
        p = self.profile
        tokens = count_tokens(prompt, chars_per_token=p.chars_per_token)
        hashes = chained_block_hashes(prompt, block_chars=block_chars(p))
        if adapter is not None:
            registered = self.lora.registered.get(adapter) if self.lora is not None else None
            if registered is None:
                raise LoraError(f"The model `{adapter}` does not exist.", status=404)
            # vLLM puts the LoRA id into every block's hash key: an adapter's KV is its own.
            seed = registered.int_id
            hashes = [xxhash.xxh3_64_intdigest(h.to_bytes(8, "little"), seed) for h in hashes]
        out = max(1, max_tokens if max_tokens is not None else p.default_max_tokens)
        if -(-(tokens + out) // p.block_size) > p.num_blocks:
            raise ValueError(f"prompt of {tokens} tokens plus {out} output tokens exceeds the KV cache")
        return SimRequest(id=request_id, prompt_tokens=tokens, block_hashes=hashes, max_tokens=out, arrival_s=now,
                          adapter=adapter)

    def request_load(self, *, name: str, path: str, rank: int | None = None) -> PendingLoad:
        """Queue a runtime load of adapter `name`; raises `LoraError` as vLLM's API answers (LoRA off,
        already loaded, rank above `max_lora_rank`). A second load of a name still loading joins the first."""
        if self.lora is None:
            raise LoraError("LoRA is not enabled (start the engine with --enable-lora).", status=400)
        for pending in self.pending_loads:
            if pending.name == name:
                return pending
        r = rank if rank is not None else adapter_rank(path, default=self.profile.lora_default_rank)
        self.lora.check_new(name=name, rank=r)
        load = PendingLoad(name=name, path=path, rank=r)
        self.pending_loads.append(load)
        return load

    def unload(self, name: str) -> None:
        """Forget adapter `name` (`LoraError` 404 when it is not registered). Requests already queued for
        it still run: vLLM does not abort them either."""
        if self.lora is None:
            raise LoraError("LoRA is not enabled (start the engine with --enable-lora).", status=400)
        self.lora.unregister(name)

    def adapters(self) -> list[str]:
        """Registered adapter names, in registration order."""
        return list(self.lora.registered) if self.lora is not None else []

    def add(self, req: SimRequest) -> None:
        self.counters.requests_started += 1
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self.pending_loads)

    def plan_step(self) -> Step | None:
        if self.profile.scheduler == "vllm-v1":
            return self._plan_v1()
        p = self.profile
        lora = self.lora
        admitted: list[SimRequest] = []
        budget = p.max_batched_tokens
        prefill = 0
        swap_s = 0.0
        batch = {r.adapter for r in self.running if r.adapter is not None}
        skipped: list[SimRequest] = []
        while self.waiting and len(self.running) + len(admitted) < p.max_num_seqs:
            req = self.waiting[0]
            if lora is not None and req.adapter is not None and not lora.can_admit(req.adapter, batch):
                skipped.append(self.waiting.popleft())  # no GPU slot in this batch: the next one may fit
                continue
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
            if lora is not None and req.adapter is not None:
                swap_s += lora.activate(req.adapter, batch=batch, load_s=p.lora_load_s, activate_s=p.lora_activate_s)
                batch.add(req.adapter)
            req.alloc = alloc
            req.cached_tokens = alloc.hit_blocks * p.block_size
            uncached = req.prompt_tokens - req.cached_tokens
            c = self.counters
            c.prefix_queries += req.prompt_tokens
            c.prefix_hits += req.cached_tokens
            budget -= uncached
            prefill += uncached
            admitted.append(req)
        self.waiting.extendleft(reversed(skipped))
        decoding = list(self.running)
        loads, self.pending_loads = self.pending_loads, []
        if not admitted and not decoding and not loads:
            return None
        duration = 0.0
        if admitted or decoding:
            context = sum(r.prompt_tokens + r.generated for r in decoding)
            duration = self._step_s(prefill_tokens=prefill, decoding=len(decoding), context=context)
        if lora is not None:
            lora.touch(batch)
            duration = (duration * (1 + p.lora_compute_overhead) + p.lora_s_per_adapter * len(batch) + swap_s
                        + p.lora_load_s * len(loads))
        self.running.extend(admitted)
        return Step(duration_s=duration, admitted=admitted, decoding=decoding, prefill_tokens=prefill, loads=loads,
                    adapters=len(batch))

    def _step_s(self, *, prefill_tokens: int, decoding: int, context: int) -> float:
        p = self.profile
        return (p.step_overhead_s + p.prefill_s_per_token * prefill_tokens + p.decode_s_per_seq * decoding
                + p.decode_s_per_ctx_token * context)

    def _plan_v1(self) -> Step | None:
        p = self.profile
        bs = p.block_size
        budget = p.max_batched_tokens
        scheduled: list[tuple[SimRequest, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.prompt_tokens + req.generated - req.computed, budget)
            assert req.held is not None
            while not self.kv.grow(req.held, req.block_hashes, total_blocks=-(-(req.computed + n) // bs)):
                victim = self.running.pop()  # the newest: vLLM's FCFS policy preempts from the back
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                scheduled.append((req, n))
                budget -= n
                i += 1
                continue
            break
        while not preempted and self.waiting and budget > 0 and len(self.running) < p.max_num_seqs:
            req = self.waiting[0]
            tokens = req.prompt_tokens + req.generated
            hit = min(self.kv.match(req.block_hashes), (tokens - 1) // bs)
            c = self.counters
            if req.preemptions:  # vLLM's PrefixCacheStats.record(preempted=True): kept apart, not exported
                c.preempted_queries += tokens
                c.preempted_hits += hit * bs
            else:  # every lookup counts, a failed admission's too (vLLM 0.26)
                c.prefix_queries += tokens
                c.prefix_hits += hit * bs
            n = min(tokens - hit * bs, budget)
            held = self.kv.admit(req.block_hashes, hit_blocks=hit, total_blocks=-(-(hit * bs + n) // bs))
            if held is None:
                break
            self.waiting.popleft()
            req.held, req.computed = held, hit * bs
            if req.first_token_s is None and req.preemptions == 0:
                req.cached_tokens = hit * bs
            self.running.append(req)
            scheduled.append((req, n))
            budget -= n
        if not scheduled:
            # Everyone running was preempted: vLLM's next step admits from the queue (now headed by them).
            return self._plan_v1() if preempted else None
        admitted: list[SimRequest] = []
        decoding: list[SimRequest] = []
        prefilling: list[SimRequest] = []
        prefill = context = n_decode = 0
        for req, n in scheduled:
            is_decode = req.computed >= req.prompt_tokens and n == 1
            req.computed += n  # advanced when scheduled, as vLLM's _update_after_schedule does
            if is_decode:
                n_decode += 1
                context += req.computed
            else:
                prefill += n
            if req.computed < req.prompt_tokens + req.generated:
                prefilling.append(req)
            elif req.first_token_s is None:
                admitted.append(req)
            else:
                decoding.append(req)
        duration = self._step_s(prefill_tokens=prefill, decoding=n_decode, context=context)
        return Step(duration_s=duration, admitted=admitted, decoding=decoding, prefill_tokens=prefill,
                    prefilling=prefilling)

    def _preempt(self, req: SimRequest) -> None:
        """vLLM's recompute preemption: free the blocks, forget the computed tokens, queue it at the head."""
        if req.held is not None:
            self.kv.free(req.held)
        req.held, req.computed = None, 0
        req.preemptions += 1
        self.counters.preemptions += 1
        self.waiting.appendleft(req)

    def finish_step(self, step: Step, *, now: float) -> list[SimRequest]:
        """Apply a planned step that ended at `now`; returns the requests that finished."""
        c = self.counters
        c.busy_s += step.duration_s
        # A request aborted while its step ran (the client left) gets no token: vLLM drops the outputs of
        # aborted requests before counting them.
        admitted = [r for r in step.admitted if not r.done]
        decoding = [r for r in step.decoding if not r.done]
        for req in admitted:
            req.first_token_s = now + self.profile.request_overhead_s
            req.generated += 1
            c.prompt_tokens += req.prompt_tokens  # counted with the first token, as vLLM's prompt_tokens_total
            if self.on_first_token is not None:
                self.on_first_token(req)
        for req in decoding:
            req.generated += 1
        c.generation_tokens += len(admitted) + len(decoding)
        finished = [r for r in self.running if r.generated >= r.max_tokens]
        if finished:
            self.running = [r for r in self.running if r.generated < r.max_tokens]
            for req in finished:
                req.finish_s = now
                if req.alloc is not None:
                    self.kv.release(req.alloc)
                if req.held is not None:
                    self.kv.free(req.held)
                    req.held = None
                c.requests_success += 1
        for req in (*admitted, *decoding):
            if req.listener is not None:
                req.listener(req)
        for load in step.loads:
            if self.lora is not None and load.name not in self.lora.registered:
                self.lora.register(name=load.name, path=load.path, rank=load.rank)
            load.done = True
            if load.listener is not None:
                load.listener(load)
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
            if req.held is not None:
                self.kv.free(req.held)
                req.held = None
        req.finish_s = req.arrival_s if req.first_token_s is None else req.first_token_s

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block no request holds (vLLM's `POST /reset_prefix_cache`); False, and nothing
        changes, while requests are queued or running (vLLM refuses then too)."""
        if self.waiting or self.running:
            return False
        self.kv.reset()
        return True

    def adapters_of(self, requests: list[SimRequest] | deque[SimRequest]) -> list[str]:
        """Distinct adapters of `requests`, in first-seen order (vLLM's `lora_requests_info` labels)."""
        return list(dict.fromkeys(r.adapter for r in requests if r.adapter is not None))

    @property
    def kv_usage(self) -> float:
        return self.kv.used_blocks / self.kv.num_blocks
