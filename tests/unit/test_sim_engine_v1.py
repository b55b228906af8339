"""The simulator's "vllm-v1" engine model, stepped by hand: what vLLM's v1 scheduler and KV cache manager do.

Each test pins one behaviour of vLLM 0.26 that the GPU calibration (docs/reports/sim-calibration-gpu.md)
showed the older "reserve" model missing: blocks taken as tokens are computed (not prompt + max_tokens at
admission), a per-step token budget that decodes share with chunked prefills, recompute preemption of the
newest running request, FCFS admission that stops at a head that does not fit, and prefix-cache counters
that count every lookup of a never-preempted request.
"""

from __future__ import annotations

import pytest

from fleetgate.sim.engine import SimEngine, SimRequest
from fleetgate.sim.kvcache import PrefixKVCache
from fleetgate.sim.profile import SimProfile

# 4 tokens per block, 1 character per token: a prompt of n characters is n tokens, n // 4 full blocks.
V1 = SimProfile(block_size=4, chars_per_token=1, num_blocks=64, max_num_seqs=8, max_batched_tokens=1000,
                step_overhead_s=0.01, prefill_s_per_token=0.001, decode_s_per_seq=0.002, scheduler="vllm-v1")


def add(engine: SimEngine, rid: str, prompt: str, max_tokens: int) -> SimRequest:
    req = engine.make_request(request_id=rid, prompt=prompt, max_tokens=max_tokens, now=0.0)
    engine.add(req)
    return req


def step(engine: SimEngine, now: float) -> float:
    planned = engine.plan_step()
    assert planned is not None
    now += planned.duration_s
    engine.finish_step(planned, now=now)
    return now


def test_unknown_scheduler_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown scheduler"):
        SimProfile(scheduler="fifo")


def test_kv_grow_is_all_or_nothing_and_frees_tail_first() -> None:
    kv = PrefixKVCache(num_blocks=4)
    held = kv.admit([1, 2, 3], hit_blocks=0, total_blocks=2)
    assert held is not None and held.hashes == [1, 2] and kv.used_blocks == 2
    assert kv.grow(held, [1, 2, 3], total_blocks=5) is False and held.blocks == 2  # 3 more do not fit
    assert kv.grow(held, [1, 2, 3], total_blocks=4) and held.hashes == [1, 2, 3] and held.private_blocks == 1
    kv.free(held)
    assert kv.used_blocks == 0 and kv.cached_blocks == 3
    other = kv.admit([7, 8], hit_blocks=0, total_blocks=2)  # 1 free block + evicts the chain's tail (3)
    assert other is not None and kv.match([1, 2, 3]) == 2


def test_blocks_are_taken_as_tokens_are_computed_not_for_the_whole_answer() -> None:
    engine = SimEngine(profile=V1)
    req = add(engine, "a", "x" * 10, max_tokens=20)  # the reserve model would hold ceil(30 / 4) = 8 blocks
    step(engine, 0.0)
    assert req.generated == 1 and engine.kv.used_blocks == 3  # ceil(10 / 4): prompt only
    now = step(engine, 1.0)  # decode: token 11 still fits block 3
    assert engine.kv.used_blocks == 3
    step(engine, now)  # token 12 computed: still 3 blocks; token 13 needs a 4th on the next step
    step(engine, now + 1)
    assert engine.kv.used_blocks == 4


def test_a_long_prompt_is_prefilled_in_chunks_and_decodes_share_the_budget() -> None:
    engine = SimEngine(profile=V1.with_(max_batched_tokens=16))
    first = add(engine, "first", "a" * 8, max_tokens=5)
    now = step(engine, 0.0)
    long = add(engine, "long", "b" * 40, max_tokens=2)
    planned = engine.plan_step()
    assert planned is not None
    # the running request decodes 1 token first; the long prompt gets the other 15 of the 16-token budget
    assert planned.decoding == [first] and planned.prefilling == [long] and planned.prefill_tokens == 15
    assert planned.duration_s == pytest.approx(0.01 + 0.001 * 15 + 0.002)
    now += planned.duration_s
    engine.finish_step(planned, now=now)
    assert long.first_token_s is None and long.computed == 15
    now = step(engine, now)  # 15 more
    now = step(engine, now)  # the last 10: its first token comes out at the end of this step
    assert long.computed == 40 and long.first_token_s == pytest.approx(now)


def test_the_newest_running_request_is_preempted_and_recomputes() -> None:
    # 6 blocks of 4 tokens: two 8-token prompts take 2 blocks each; decoding grows them until one must go.
    engine = SimEngine(profile=V1.with_(num_blocks=6))
    old = add(engine, "old", "o" * 8, max_tokens=12)
    new = add(engine, "new", "n" * 8, max_tokens=12)
    now = step(engine, 0.0)
    assert engine.running == [old, new] and engine.kv.used_blocks == 4
    for _ in range(6):
        now = step(engine, now)
    assert engine.counters.preemptions >= 1 and new.preemptions >= 1 and old.preemptions == 0
    # the preempted one waits at the head, then recomputes its prompt and the tokens it had generated
    while not (old.done and new.done):
        now = step(engine, now)
    assert old.generated == 12 and new.generated == 12 and engine.kv.used_blocks == 0


def test_admission_is_fcfs_and_a_head_that_does_not_fit_blocks_the_queue() -> None:
    engine = SimEngine(profile=V1.with_(num_blocks=8))
    add(engine, "big-running", "r" * 20, max_tokens=10)  # 5 blocks, 6 once it decodes
    step(engine, 0.0)
    add(engine, "head", "h" * 16, max_tokens=1)  # needs 4 blocks: 2 are free
    add(engine, "small", "s" * 4, max_tokens=1)  # 1 block would fit, but may not overtake the head
    planned = engine.plan_step()
    assert planned is not None and [r.id for r in engine.waiting] == ["head", "small"]
    assert planned.admitted == [] and len(planned.decoding) == 1


def test_every_lookup_counts_but_a_preempted_requests_are_kept_apart() -> None:
    engine = SimEngine(profile=V1.with_(num_blocks=8))
    add(engine, "big-running", "r" * 20, max_tokens=10)
    now = step(engine, 0.0)
    add(engine, "head", "h" * 16, max_tokens=1)
    queries = engine.counters.prefix_queries
    for _ in range(3):
        now = step(engine, now)  # the head is looked up on every step and never fits
    assert engine.counters.prefix_queries == queries + 3 * 16

    engine = SimEngine(profile=V1.with_(num_blocks=6))
    add(engine, "old", "o" * 8, max_tokens=12)
    add(engine, "new", "n" * 8, max_tokens=12)
    now = 0.0
    while engine.has_work():
        now = step(engine, now)
    c = engine.counters
    assert c.preemptions >= 1 and c.prefix_queries == 16  # the two first lookups only
    assert c.preempted_queries >= 8 and c.preempted_hits >= 4  # the recompute found its own prompt cached


def test_context_attention_and_request_overhead_terms() -> None:
    engine = SimEngine(profile=V1.with_(decode_s_per_ctx_token=0.0001, request_overhead_s=0.05))
    req = add(engine, "a", "x" * 10, max_tokens=3)
    now = step(engine, 0.0)
    assert req.ttft_s == pytest.approx(0.01 + 0.001 * 10 + 0.05)  # the overhead reaches the client only
    planned = engine.plan_step()
    assert planned is not None
    assert planned.duration_s == pytest.approx(0.01 + 0.002 + 0.0001 * 11)  # decode reads 11 tokens of KV
    assert now == pytest.approx(0.02)
