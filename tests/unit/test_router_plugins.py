"""Each built-in plugin's formula, exercised directly."""

from __future__ import annotations

import random

import pytest

from fleetgate.core.types import Endpoint
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.health import HealthTracker
from fleetgate.router.plugins.healthy_filter import HealthyFilter
from fleetgate.router.plugins.inflight_scorer import InflightScorer
from fleetgate.router.plugins.kv_usage_scorer import KVCacheUsageScorer
from fleetgate.router.plugins.max_score_picker import MaxScorePicker
from fleetgate.router.plugins.model_filter import ServesModelFilter
from fleetgate.router.plugins.queue_scorer import QueueDepthScorer
from fleetgate.router.plugins.random_picker import WeightedRandomPicker
from fleetgate.router.plugins.session_scorer import SessionAffinityScorer
from fleetgate.router.types import RoutingRequest

EPS = [Endpoint(id=f"e{i}", url=f"http://e{i}", model="m") for i in range(3)]
REQ = RoutingRequest(request_id="r", model="m", prompt_text="hi")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_serves_model_filter() -> None:
    other = Endpoint(id="x", url="http://x", model="other")
    assert ServesModelFilter(name="f").filter(REQ, {}, [*EPS, other]) == EPS


def test_healthy_filter_drops_ejected_and_fails_open_to_the_soonest_back() -> None:
    clock = Clock()
    health = HealthTracker(base_s=1, max_s=8, clock=clock)
    f = HealthyFilter(name="healthy", health=health)
    health.record_failure("e0")
    assert f.filter(REQ, {}, list(EPS)) == EPS[1:]
    health.record_failure("e1")
    health.record_failure("e1")  # 2 s back-off
    health.record_failure("e2")
    health.record_failure("e2")
    health.record_failure("e2")  # 4 s
    assert f.filter(REQ, {}, list(EPS)) == [EPS[0]]
    clock.t += 1.5
    assert f.filter(REQ, {}, list(EPS)) == [EPS[0]]
    clock.t += 1.0
    assert f.filter(REQ, {}, list(EPS)) == [EPS[0], EPS[1]]


def test_inflight_scorer_is_inverse_minmax_of_load() -> None:
    state = FleetState()
    s = InflightScorer(name="inflight", state=state)
    assert s.score(REQ, {}, EPS) == [1.0, 1.0, 1.0]
    for _ in range(4):
        state.started("e0")
    state.started("e1")
    assert s.score(REQ, {}, EPS) == [0.0, 0.75, 1.0]
    state.stats_of("e2").waiting = 8  # scraped load from other gateway replicas counts too
    assert s.score(REQ, {}, EPS) == [4 / 7, 1.0, 0.0]  # loads 4, 1, 8
    for _ in range(4):
        state.finished("e0")
    assert state.inflight.get("e0") is None


def test_queue_and_kv_usage_scorers() -> None:
    state = FleetState()
    state.stats_of("e0").waiting = 10
    state.stats_of("e1").waiting = 5
    assert QueueDepthScorer(name="q", state=state).score(REQ, {}, EPS) == [0.0, 0.5, 1.0]
    state.stats_of("e0").kv_usage = 0.9
    state.stats_of("e1").kv_usage = 1.3  # clamped
    assert KVCacheUsageScorer(name="kv", state=state).score(REQ, {}, EPS) == pytest.approx([0.1, 0.0, 1.0])


def test_session_affinity_scores_the_last_endpoint_and_is_bounded() -> None:
    s = SessionAffinityScorer(name="session", max_sessions=2)
    with_session = RoutingRequest(request_id="r", model="m", prompt_text="", session_key="alice")
    assert s.score(with_session, {}, EPS) == [0.0, 0.0, 0.0]
    s.on_start(with_session, {}, EPS[2])
    assert s.score(with_session, {}, EPS) == [0.0, 0.0, 1.0]
    assert s.score(REQ, {}, EPS) == [0.0, 0.0, 0.0]  # no session key: no effect
    for name in ("bob", "carol"):
        s.on_start(RoutingRequest(request_id="r", model="m", prompt_text="", session_key=name), {}, EPS[0])
    assert s.score(with_session, {}, EPS) == [0.0, 0.0, 0.0]  # alice was evicted


def test_max_score_picker_orders_by_score_and_breaks_ties_randomly() -> None:
    p = MaxScorePicker(name="max", rng=random.Random(7))
    assert p.pick(EPS, [0.2, 0.9, 0.5]) == [1, 2, 0]
    firsts = {p.pick(EPS, [1.0, 1.0, 0.0])[0] for _ in range(50)}
    assert firsts == {0, 1}


def test_weighted_random_picker_follows_scores() -> None:
    p = WeightedRandomPicker(name="wr", rng=random.Random(3))
    counts = [0, 0, 0]
    for _ in range(3000):
        order = p.pick(EPS, [1.0, 3.0, 0.0])
        counts[order[0]] += 1
        assert sorted(order) == [0, 1, 2]
    assert counts[2] == 0
    assert 0.2 < counts[0] / 3000 < 0.3
    assert {p.pick(EPS, [0.0, 0.0, 0.0])[0] for _ in range(60)} == {0, 1, 2}


def test_session_table_holds_digests_not_client_keys() -> None:
    """A megabyte `user` must not be stored: the table's memory is bounded by its entry count alone."""
    import sys

    s = SessionAffinityScorer(name="session", max_sessions=1000)
    huge = "u" * 1_000_000
    for i in range(50):
        s.on_start(RoutingRequest(request_id="r", model="m", prompt_text="", session_key=f"{i}{huge}"), {}, EPS[1])
    stored = sum(sys.getsizeof(k) for k in s._last)
    assert len(s._last) == 50 and stored < 50 * 100  # 16-byte digests, not 50 MB of keys
    again = RoutingRequest(request_id="r", model="m", prompt_text="", session_key=f"7{huge}")
    assert s.score(again, {}, EPS) == [0.0, 1.0, 0.0]  # affinity still works through the digest


def test_saturation_filter_drops_saturated_and_sheds_when_all_are() -> None:
    from fleetgate.core.errors import FleetSaturatedError
    from fleetgate.router.plugins.saturation_filter import SaturationFilter

    clock = Clock()
    state = FleetState(clock=clock)
    flt = SaturationFilter(name="s", state=state, queue_depth=3, kv_usage=0.9, max_stale_s=2.0, retry_after_s=2.5)
    assert flt.filter(REQ, {}, EPS) == EPS  # never scraped: not known saturated (fails open)
    state.update("e0", waiting=3, running=1, kv_usage=0.1)  # queue at the threshold
    state.update("e1", waiting=0, running=1, kv_usage=0.95)  # KV cache nearly full
    state.update("e2", waiting=2, running=4, kv_usage=0.5)
    assert flt.filter(REQ, {}, EPS) == [EPS[2]]
    state.update("e2", waiting=9, running=4, kv_usage=0.5)
    with pytest.raises(FleetSaturatedError) as refused:
        flt.filter(REQ, {}, EPS)
    assert refused.value.status == 429 and refused.value.headers["Retry-After"] == "3"
    clock.t += 2.5  # every scrape is stale now: nothing is known saturated any more
    assert flt.filter(REQ, {}, EPS) == EPS
    assert flt.filter(REQ, {}, []) == []  # no candidates is the scheduler's 503, not a shed
    with pytest.raises(ValueError, match="queueDepth"):
        SaturationFilter(name="s", state=state, queue_depth=0, kv_usage=0.9, max_stale_s=1, retry_after_s=1)
