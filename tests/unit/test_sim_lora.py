"""The simulator's LoRA model, stepped by hand: GPU slots and the CPU cache, the batch limit of
`max_loras`, the mixed-adapter step penalty, runtime loads, and prefix caching kept apart per adapter."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetgate.sim.engine import SimEngine, SimRequest
from fleetgate.sim.lora import LoraError, LoraSlots, adapter_rank, parse_lora_module
from fleetgate.sim.profile import SimProfile

BASE = SimProfile(
    block_size=4,
    chars_per_token=1,
    num_blocks=256,
    max_num_seqs=8,
    max_batched_tokens=1000,
    step_overhead_s=0.01,
    prefill_s_per_token=0.001,
    decode_s_per_seq=0.002,
)
LORA = BASE.with_(
    enable_lora=True,
    max_loras=2,
    max_cpu_loras=3,
    lora_load_s=0.3,
    lora_activate_s=0.005,
    lora_compute_overhead=0.1,
    lora_s_per_adapter=0.01,
    lora_modules=(("a", "/x/a"), ("b", "/x/b"), ("c", "/x/c")),
)


def base_step(*, prefill: int, decoding: int = 0, p: SimProfile = BASE) -> float:
    return p.step_overhead_s + p.prefill_s_per_token * prefill + p.decode_s_per_seq * decoding


def add(engine: SimEngine, rid: str, prompt: str, adapter: str | None, *, max_tokens: int = 3) -> SimRequest:
    req = engine.make_request(request_id=rid, prompt=prompt, max_tokens=max_tokens, now=0.0, adapter=adapter)
    engine.add(req)
    return req


def run_to_completion(engine: SimEngine, *, now: float = 0.0) -> float:
    """Step the engine from `now` until it has nothing left to do; returns the time it finished."""
    while (step := engine.plan_step()) is not None:
        now += step.duration_s
        engine.finish_step(step, now=now)
    return now


def test_slots_reuse_the_least_recently_used_slot_and_reload_what_the_cpu_cache_dropped() -> None:
    slots = LoraSlots(max_loras=2, max_cpu_loras=2, max_lora_rank=16)
    for name in ("a", "b", "c"):  # registering c evicts a from the CPU cache (it holds 2)
        slots.register(name=name, path=f"/x/{name}", rank=8)
    assert list(slots.cpu) == ["b", "c"] and slots.disk_loads == 3
    assert slots.activate("b", batch=set(), load_s=0.3, activate_s=0.005) == pytest.approx(0.005)  # cached: copy
    assert slots.activate("b", batch={"b"}, load_s=0.3, activate_s=0.005) == 0.0  # resident
    assert slots.activate("a", batch={"b"}, load_s=0.3, activate_s=0.005) == pytest.approx(0.305)  # from disk
    assert slots.disk_loads == 4 and set(slots.gpu) == {"a", "b"}
    assert not slots.can_admit("c", {"a", "b"}) and slots.can_admit("a", {"a", "b"}) and slots.can_admit("c", {"a"})
    slots.touch({"a"})  # b is now the least recently used slot
    slots.activate("c", batch={"a"}, load_s=0.3, activate_s=0.005)
    assert set(slots.gpu) == {"a", "c"}


def test_registration_refuses_duplicates_and_ranks_above_the_maximum() -> None:
    slots = LoraSlots(max_loras=1, max_cpu_loras=1, max_lora_rank=16)
    slots.register(name="a", path="/x", rank=16)
    with pytest.raises(LoraError, match="already been loaded") as dup:
        slots.register(name="a", path="/y", rank=8)
    assert dup.value.status == 400
    with pytest.raises(LoraError, match="greater than max_lora_rank") as big:
        slots.register(name="b", path="/x", rank=32)
    assert big.value.status == 400
    with pytest.raises(LoraError) as missing:
        slots.unregister("nope")
    assert missing.value.status == 404
    with pytest.raises(ValueError):
        LoraSlots(max_loras=2, max_cpu_loras=1, max_lora_rank=16)


def test_a_batch_holds_at_most_max_loras_adapters_and_later_requests_pass_the_one_that_waits() -> None:
    engine = SimEngine(profile=LORA)
    ra = add(engine, "ra", "x" * 10, "a")
    rb = add(engine, "rb", "y" * 10, "b")
    rc = add(engine, "rc", "z" * 10, "c")  # a third adapter: no slot in this batch
    ra2 = add(engine, "ra2", "w" * 10, "a")  # same adapter as a running one: admitted past rc
    base = add(engine, "base", "v" * 10, None)  # base model requests need no slot
    step = engine.plan_step()
    assert step is not None
    assert step.admitted == [ra, rb, ra2, base] and list(engine.waiting) == [rc]
    assert step.adapters == 2
    # a and b both come from the CPU cache: two copies into GPU slots; a, b and c were registered at start-up
    expected = base_step(prefill=40) * 1.1 + 0.01 * 2 + 2 * 0.005
    assert step.duration_s == pytest.approx(expected)
    engine.finish_step(step, now=step.duration_s)
    run_to_completion(engine, now=step.duration_s)
    assert rc.done and rc.first_token_s is not None and rc.first_token_s > ra.finish_s  # type: ignore[operator]


def test_mixed_adapters_make_the_step_slower() -> None:
    wide = LORA.with_(max_loras=3)
    same = SimEngine(profile=wide)
    mixed = SimEngine(profile=wide)
    for i in range(3):
        add(same, f"s{i}", f"{i}" * 12, "a")
        add(mixed, f"m{i}", f"{i}" * 12, "abc"[i])
    for engine in (same, mixed):  # first step swaps adapters in; compare the decode steps after it
        first = engine.plan_step()
        assert first is not None
        engine.finish_step(first, now=first.duration_s)
    s, m = same.plan_step(), mixed.plan_step()
    assert s is not None and m is not None and s.adapters == 1 and m.adapters == 3
    assert m.duration_s - s.duration_s == pytest.approx(2 * wide.lora_s_per_adapter)
    assert s.duration_s == pytest.approx(base_step(prefill=0, decoding=3) * 1.1 + 0.01)


def test_lora_off_keeps_the_base_step_time_and_lora_on_charges_every_batch() -> None:
    off, on = SimEngine(profile=BASE), SimEngine(profile=LORA)
    for engine in (off, on):
        add(engine, "r", "q" * 20, None)
    s_off, s_on = off.plan_step(), on.plan_step()
    assert s_off is not None and s_on is not None
    assert s_off.duration_s == pytest.approx(base_step(prefill=20))
    assert s_on.duration_s == pytest.approx(base_step(prefill=20) * 1.1)
    with pytest.raises(LoraError):  # no adapters without --enable-lora
        off.make_request(request_id="x", prompt="q", max_tokens=1, now=0.0, adapter="a")
    with pytest.raises(LoraError) as unknown:
        on.make_request(request_id="x", prompt="q", max_tokens=1, now=0.0, adapter="nope")
    assert unknown.value.status == 404


def test_prefix_cache_is_never_shared_between_adapters_or_with_the_base_model() -> None:
    engine = SimEngine(profile=LORA.with_(max_loras=3))
    prompt = "s" * 40 + "question"
    first = add(engine, "a1", prompt, "a")
    run_to_completion(engine)
    again = add(engine, "a2", prompt, "a")
    other = add(engine, "b1", prompt, "b")
    base = add(engine, "base", prompt, None)
    run_to_completion(engine)
    assert first.cached_tokens == 0 and again.cached_tokens == 44  # 11 of 12 full blocks (one token computed)
    assert other.cached_tokens == 0 and base.cached_tokens == 0


def test_a_request_for_an_adapter_the_cpu_cache_dropped_pays_the_disk_load() -> None:
    engine = SimEngine(profile=LORA.with_(max_loras=1, max_cpu_loras=1))
    assert engine.lora is not None and list(engine.lora.cpu) == ["c"]  # a and b were evicted at start-up
    add(engine, "ra", "x" * 10, "a")
    step = engine.plan_step()
    assert step is not None
    p = engine.profile
    assert step.duration_s == pytest.approx(base_step(prefill=10) * 1.1 + 0.01 + p.lora_load_s + p.lora_activate_s)


def test_runtime_load_is_paid_by_the_engine_loop_and_unload_forgets_the_adapter() -> None:
    engine = SimEngine(profile=LORA)
    load = engine.request_load(name="d", path="/x/d")
    assert engine.request_load(name="d", path="/x/d") is load  # joins the load in progress
    assert "d" not in engine.adapters() and engine.has_work()
    step = engine.plan_step()
    assert step is not None and step.loads == [load] and step.duration_s == pytest.approx(LORA.lora_load_s)
    engine.finish_step(step, now=step.duration_s)
    assert load.done and engine.adapters() == ["a", "b", "c", "d"]
    with pytest.raises(LoraError, match="already"):
        engine.request_load(name="d", path="/x/d")
    with pytest.raises(LoraError, match="max_lora_rank"):
        engine.request_load(name="e", path="/x/e", rank=64)
    engine.unload("d")
    assert "d" not in engine.adapters()
    with pytest.raises(LoraError) as gone:
        engine.unload("d")
    assert gone.value.status == 404
    with pytest.raises(LoraError) as off:
        SimEngine(profile=BASE).request_load(name="d", path="/x/d")
    assert off.value.status == 400


def test_rank_comes_from_peft_adapter_config_and_modules_parse_like_vllm(tmp_path: Path) -> None:
    (tmp_path / "adapter_config.json").write_text(json.dumps({"r": 32, "lora_alpha": 16}))
    assert adapter_rank(str(tmp_path), default=8) == 32
    assert adapter_rank(str(tmp_path / "missing"), default=8) == 8
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "adapter_config.json").write_text("[not json")
    assert adapter_rank(str(tmp_path / "bad"), default=8) == 8
    assert parse_lora_module("sql=/adapters/sql") == ("sql", "/adapters/sql")
    assert parse_lora_module('{"name": "sql", "path": "/a/sql", "base_model_name": "m"}') == ("sql", "/a/sql")
    for bad in ("sql", "=/x", "sql=", '{"name": "x"}'):
        with pytest.raises(ValueError):
            parse_lora_module(bad)
    with pytest.raises(LoraError, match="max_lora_rank"):  # a start-up adapter above the maximum rank
        SimEngine(profile=LORA.with_(max_lora_rank=16, lora_modules=(("big", str(tmp_path)),)))


def test_unloading_an_adapter_lets_its_running_requests_finish_and_refuses_new_ones() -> None:
    engine = SimEngine(profile=LORA)
    running = add(engine, "r", "x" * 10, "a", max_tokens=4)
    step = engine.plan_step()
    assert step is not None
    now = step.duration_s
    engine.finish_step(step, now=now)
    engine.unload("a")
    now = run_to_completion(engine, now=now)
    assert running.done and running.generated == 4
    with pytest.raises(LoraError):
        engine.make_request(request_id="late", prompt="x", max_tokens=1, now=now, adapter="a")
