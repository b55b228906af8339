"""The simulated engine counts tokens as vLLM does: a prompt with its first token, nothing for aborted work."""

from __future__ import annotations

from fleetgate.sim.engine import SimEngine
from fleetgate.sim.profile import PROFILES


def _engine() -> SimEngine:
    return SimEngine(profile=PROFILES["gpu-8b"].with_(num_blocks=64))


def test_a_prompt_is_counted_when_its_first_token_comes_out() -> None:
    engine = _engine()
    req = engine.make_request(request_id="a", prompt="y" * 800, max_tokens=4, now=0.0)
    engine.add(req)
    step = engine.plan_step()
    assert step is not None and step.admitted == [req]
    assert engine.counters.prompt_tokens == 0  # scheduled, prefilling: not yet
    assert engine.counters.prefix_queries == req.prompt_tokens  # the cache lookup is counted at scheduling
    engine.finish_step(step, now=0.1)
    assert engine.counters.prompt_tokens == req.prompt_tokens


def test_a_request_aborted_during_its_step_gets_no_token_and_no_prompt_count() -> None:
    engine = _engine()
    first = engine.make_request(request_id="a", prompt="y" * 800, max_tokens=4, now=0.0)
    gone = engine.make_request(request_id="b", prompt="z" * 800, max_tokens=4, now=0.0)
    engine.add(first)
    engine.add(gone)
    step = engine.plan_step()
    assert step is not None and len(step.admitted) == 2
    engine.abort(gone)  # the client left while the step ran
    engine.finish_step(step, now=0.1)
    assert engine.counters.prompt_tokens == first.prompt_tokens
    assert engine.counters.generation_tokens == 1
    step = engine.plan_step()
    assert step is not None
    engine.abort(first)
    engine.finish_step(step, now=0.2)
    assert engine.counters.generation_tokens == 1
    assert first.generated == 1


def test_reset_prefix_cache_refuses_while_busy_then_forgets_cached_blocks() -> None:
    engine = _engine()
    prompt = "w" * 1600
    req = engine.make_request(request_id="a", prompt=prompt, max_tokens=1, now=0.0)
    engine.add(req)
    assert engine.reset_prefix_cache() is False  # queued work holds it
    step = engine.plan_step()
    assert step is not None
    engine.finish_step(step, now=0.1)
    again = engine.make_request(request_id="b", prompt=prompt, max_tokens=1, now=0.2)
    assert engine.kv.match(again.block_hashes) > 0
    assert engine.reset_prefix_cache() is True
    assert engine.kv.match(again.block_hashes) == 0
    assert engine.kv.cached_blocks == 0
