"""vLLM's token and prefix-cache counters read from `/metrics` text, and their deltas over an interval."""

from __future__ import annotations

import pytest

from fleetgate.engine.vllm_counters import CounterResetError, CounterSnapshot, deltas, parse_counters, total

# The shape vLLM 0.26's Prometheus exposition has: `_total` and `_created` samples, a label set per engine
# (data parallel), `finished_reason` on request_success, the cache configuration as info labels.
EXPOSITION = """\
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="llama-3.1-8b"} 12000.0
vllm:prompt_tokens_total{engine="1",model_name="llama-3.1-8b"} 3000.0
# HELP vllm:prompt_tokens_created Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_created gauge
vllm:prompt_tokens_created{engine="0",model_name="llama-3.1-8b"} 1.7642e+09
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="llama-3.1-8b"} 640.0
vllm:generation_tokens_total{engine="1",model_name="llama-3.1-8b"} 128.0
# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="llama-3.1-8b"} 15000.0
# HELP vllm:prefix_cache_hits_total Prefix cache hits, in terms of number of cached tokens.
# TYPE vllm:prefix_cache_hits_total counter
vllm:prefix_cache_hits_total{engine="0",model_name="llama-3.1-8b"} 9000.0
# HELP vllm:request_success_total Count of successfully processed requests.
# TYPE vllm:request_success_total counter
vllm:request_success_total{engine="0",finished_reason="stop",model_name="llama-3.1-8b"} 7.0
vllm:request_success_total{engine="0",finished_reason="length",model_name="llama-3.1-8b"} 3.0
# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="llama-3.1-8b"} 2.0
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="4096"} 1.0
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="llama-3.1-8b"} 5.0
"""


def test_reads_every_counter_summed_over_engines_and_labels() -> None:
    snap = parse_counters(EXPOSITION)
    assert snap.prompt_tokens == 15000
    assert snap.generation_tokens == 768
    assert snap.prefix_queries == 15000 and snap.prefix_hits == 9000
    assert snap.requests_finished == 10
    assert snap.preemptions == 2
    assert snap.kv_capacity_tokens == 4096 * 16
    assert snap.hit_rate == pytest.approx(0.6)
    assert snap.uncached_prompt_tokens == 6000


def test_an_engine_without_these_families_reads_as_zeros() -> None:
    snap = parse_counters("# TYPE other_total counter\nother_total 3\n")
    assert snap == CounterSnapshot()
    assert snap.hit_rate == 0.0


def test_a_capacity_not_yet_known_is_zero() -> None:
    text = 'vllm:cache_config_info{block_size="16",num_gpu_blocks="None"} 1.0\n'
    assert parse_counters(text).kv_capacity_tokens == 0


def test_deltas_per_engine_and_their_total() -> None:
    before = [parse_counters(EXPOSITION), CounterSnapshot(prompt_tokens=10, generation_tokens=1)]
    after_text = EXPOSITION.replace("12000.0", "12500.0").replace(" 640.0", " 700.0").replace("9000.0", "9400.0")
    after = [parse_counters(after_text), CounterSnapshot(prompt_tokens=30, generation_tokens=6)]
    per_engine = deltas(before, after)
    assert per_engine[0].prompt_tokens == 500 and per_engine[0].generation_tokens == 60
    assert per_engine[0].prefix_hits == 400 and per_engine[0].prefix_queries == 0
    assert per_engine[0].kv_capacity_tokens == 4096 * 16  # configuration, kept as is
    both = total(per_engine)
    assert both.prompt_tokens == 520 and both.generation_tokens == 65


def test_a_counter_that_went_down_means_a_restart_and_is_refused() -> None:
    with pytest.raises(CounterResetError, match="engine-1: generation_tokens went from 5 to 2"):
        deltas([CounterSnapshot(), CounterSnapshot(generation_tokens=5)],
               [CounterSnapshot(), CounterSnapshot(generation_tokens=2)])


def test_snapshot_lists_must_match() -> None:
    with pytest.raises(ValueError, match="1 snapshots before, 2 after"):
        deltas([CounterSnapshot()], [CounterSnapshot(), CounterSnapshot()])


def test_the_simulated_engine_exports_the_same_counters() -> None:
    from prometheus_client import generate_latest

    from fleetgate.sim.engine import SimEngine
    from fleetgate.sim.metrics import SimMetrics
    from fleetgate.sim.profile import PROFILES

    engine = SimEngine(profile=PROFILES["gpu-8b"])
    req = engine.make_request(request_id="r", prompt="x" * 400, max_tokens=3, now=0.0)
    engine.add(req)
    while engine.has_work():
        step = engine.plan_step()
        assert step is not None
        engine.finish_step(step, now=0.0)
    snap = parse_counters(generate_latest(SimMetrics(engine).registry).decode())
    assert snap.prompt_tokens == req.prompt_tokens
    assert snap.generation_tokens == 3
    assert snap.requests_finished == 1
    assert snap.kv_capacity_tokens == PROFILES["gpu-8b"].capacity_tokens
