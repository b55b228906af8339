"""The simulator's KV cache and engine core, stepped by hand (no clock)."""

from __future__ import annotations

import pytest

from fleetgate.sim.engine import SimEngine, count_tokens
from fleetgate.sim.kvcache import PrefixKVCache
from fleetgate.sim.profile import SimProfile


def test_kv_cache_reuses_leading_blocks_and_evicts_lru_tail_first() -> None:
    kv = PrefixKVCache(num_blocks=6)
    a = kv.allocate([1, 2, 3], private_blocks=1, max_hit_blocks=3)
    assert a is not None and a.hit_blocks == 0 and kv.used_blocks == 4
    kv.release(a)
    assert kv.used_blocks == 0 and kv.cached_blocks == 3
    b = kv.allocate([1, 2, 9], private_blocks=0, max_hit_blocks=3)
    assert b is not None and b.hit_blocks == 2  # chain diverges at block 3
    kv.release(b)
    # 4 blocks cached (1, 2, 3, 9), 2 free: a 4-block request evicts 2, tail blocks first (3 then 9)
    c = kv.allocate([7, 8, 10, 11], private_blocks=0, max_hit_blocks=4)
    assert c is not None
    assert kv.match([1, 2]) == 2 and kv.match([1, 2, 3]) == 2 and kv.match([1, 2, 9]) == 2


def test_kv_cache_refuses_what_does_not_fit_and_never_evicts_pinned_blocks() -> None:
    kv = PrefixKVCache(num_blocks=4)
    a = kv.allocate([1, 2, 3], private_blocks=0, max_hit_blocks=3)
    assert a is not None
    assert kv.allocate([5, 6], private_blocks=0, max_hit_blocks=2) is None
    shared = kv.allocate([1, 2], private_blocks=1, max_hit_blocks=2)
    assert shared is not None and shared.hit_blocks == 2 and kv.used_blocks == 4


def test_max_hit_keeps_one_token_to_compute() -> None:
    kv = PrefixKVCache(num_blocks=8)
    kv.release(kv.allocate([1, 2], private_blocks=0, max_hit_blocks=2))  # type: ignore[arg-type]
    again = kv.allocate([1, 2], private_blocks=0, max_hit_blocks=1)
    assert again is not None and again.hit_blocks == 1


PROFILE = SimProfile(block_size=4, chars_per_token=1, num_blocks=64, max_num_seqs=2, max_batched_tokens=1000,
                     step_overhead_s=0.01, prefill_s_per_token=0.001, decode_s_per_seq=0.002)


def run_to_completion(engine: SimEngine, start: float = 0.0) -> float:
    now = start
    while (step := engine.plan_step()) is not None:
        now += step.duration_s
        engine.finish_step(step, now=now)
    return now


def test_ttft_is_queueing_plus_uncached_prefill() -> None:
    engine = SimEngine(profile=PROFILE)
    prompt = "a" * 100 + "b" * 3
    cold = engine.make_request(request_id="cold", prompt=prompt, max_tokens=2, now=0.0)
    engine.add(cold)
    end = run_to_completion(engine)
    assert cold.cached_tokens == 0
    assert cold.ttft_s == pytest.approx(0.01 + 0.001 * 103)
    warm = engine.make_request(request_id="warm", prompt=prompt, max_tokens=2, now=end)
    engine.add(warm)
    run_to_completion(engine, end)
    assert warm.cached_tokens == 100  # 25 full blocks of 4; the 3-token tail is computed
    assert warm.ttft_s == pytest.approx(0.01 + 0.001 * 3)
    assert engine.counters.prefix_hits == 100 and engine.counters.prefix_queries == 206
    assert engine.counters.requests_started == 2
    assert engine.counters.busy_s == pytest.approx(end + 0.01 + 0.001 * 3 + 0.01 + 0.002)  # warm: prefill + 1 decode


def test_batch_limit_queues_and_decode_time_grows_with_batch() -> None:
    engine = SimEngine(profile=PROFILE)
    reqs = [engine.make_request(request_id=str(i), prompt=f"{i}" * 8, max_tokens=3, now=0.0) for i in range(3)]
    for r in reqs:
        engine.add(r)
    first = engine.plan_step()
    assert first is not None and len(first.admitted) == 2 and len(engine.waiting) == 1
    engine.finish_step(first, now=first.duration_s)
    decode = engine.plan_step()
    assert decode is not None and decode.prefill_tokens == 0
    assert decode.duration_s == pytest.approx(0.01 + 2 * 0.002)
    run_to_completion(engine, first.duration_s + decode.duration_s)
    assert all(r.done and r.generated == 3 for r in reqs)
    assert reqs[2].ttft_s is not None and reqs[2].ttft_s > reqs[0].ttft_s  # type: ignore[operator]
    assert engine.kv.used_blocks == 0


def test_abort_frees_blocks_and_oversized_prompt_is_refused() -> None:
    engine = SimEngine(profile=PROFILE)
    req = engine.make_request(request_id="x", prompt="z" * 40, max_tokens=4, now=0.0)
    engine.add(req)
    step = engine.plan_step()
    assert step is not None and engine.kv.used_blocks == 11
    engine.abort(req)
    assert engine.kv.used_blocks == 0 and not engine.running
    with pytest.raises(ValueError, match="exceeds the KV cache"):
        engine.make_request(request_id="big", prompt="q" * 300, max_tokens=1, now=0.0)
    assert count_tokens("abcdefgh", chars_per_token=4) == 2
