"""Prefix affinity: chained hashing, the capacity-bounded index, longest match, the hot-spot guard."""

from __future__ import annotations

from fleetgate.core.types import Endpoint
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.hashing import chained_block_hashes
from fleetgate.router.plugins.prefix_scorer import PrefixAffinityScorer
from fleetgate.router.prefix_index import PrefixIndex
from fleetgate.router.types import RoutingRequest

EPS = [Endpoint(id=f"e{i}", url=f"http://e{i}", model="m") for i in range(3)]


def test_chained_hashes_cover_the_whole_prefix() -> None:
    a = chained_block_hashes("AAAA" + "BBBB" + "CCCC" + "xx", block_chars=4)
    b = chained_block_hashes("ZZZZ" + "BBBB" + "CCCC", block_chars=4)
    c = chained_block_hashes("AAAA" + "BBBB" + "DDDD", block_chars=4)
    assert len(a) == 3  # the 2-char tail is not a full block
    assert a[1] != b[1] and a[2] != b[2]  # same block text, different prefix -> different hash
    assert a[:2] == c[:2] and a[2] != c[2]
    assert chained_block_hashes("AAAA" * 10, block_chars=4, max_blocks=4) == chained_block_hashes(
        "AAAA" * 4, block_chars=4
    )
    assert len(set(chained_block_hashes("AAAA" * 10, block_chars=4))) == 10  # repeated blocks still differ


def test_index_longest_match_and_lru_bound_evicts_tails_first() -> None:
    idx = PrefixIndex(default_capacity_blocks=5)
    idx.record("e0", [1, 2, 3])
    assert idx.match("e0", [1, 2, 3, 4]) == 3
    assert idx.match("e0", [1, 9, 3]) == 1
    assert idx.match("e1", [1, 2]) == 0
    idx.record("e0", [1, 5, 6])  # 5 distinct blocks now: at capacity
    assert idx.size("e0") == 5
    idx.record("e0", [7])  # evicts the least recent: the tail of the older chain (3)
    assert idx.size("e0") == 5
    assert idx.match("e0", [1, 2, 3]) == 2 and idx.match("e0", [1, 5, 6]) == 3
    idx.set_capacity("e0", 2)
    assert idx.size("e0") == 2 and idx.match("e0", [7]) == 1


def _req(i: int, text: str) -> RoutingRequest:
    return RoutingRequest(request_id=str(i), model="m", prompt_text=text)


def test_scorer_prefers_the_endpoint_holding_the_longest_prefix() -> None:
    scorer = PrefixAffinityScorer(name="prefix", state=FleetState(), block_chars=8, hotspot_margin=None)
    system = "S" * 32
    first = _req(1, system + "one question....")
    scorer.on_start(first, {}, EPS[1])
    scores = scorer.score(_req(2, system + "two question...."), {}, EPS)
    # 6 blocks, the 4 system-prompt blocks are on e1
    assert scores == [0.0, 4 / 6, 0.0]
    assert scorer.score(_req(3, "short"), {}, EPS) == [0.0, 0.0, 0.0]


def test_hot_spot_guard_fades_prefix_preference_with_excess_load() -> None:
    state = FleetState()
    scorer = PrefixAffinityScorer(name="prefix", state=state, block_chars=8, hotspot_margin=4)
    text = "P" * 64
    scorer.on_start(_req(1, text), {}, EPS[0])
    scorer.on_start(_req(2, text), {}, EPS[1])
    for _ in range(3):
        state.started("e0")  # excess 3 <= margin: full preference
    assert scorer.score(_req(3, text), {}, EPS)[:2] == [1.0, 1.0]
    for _ in range(3):
        state.started("e0")  # excess 6: preference halved (1 - (6-4)/4)
    assert scorer.score(_req(4, text), {}, EPS)[0] == 0.5
    for _ in range(4):
        state.started("e0")  # excess 10 >= 2 * margin: no preference left
    assert scorer.score(_req(5, text), {}, EPS)[:2] == [0.0, 1.0]


def test_capacity_follows_scraped_kv_capacity() -> None:
    state = FleetState()
    state.stats_of("e0").kv_capacity_tokens = 16  # 16 tokens * 4 chars / 8 chars per block = 8 blocks
    scorer = PrefixAffinityScorer(name="prefix", state=state, block_chars=8, default_capacity_tokens=10_000)
    scorer.on_start(_req(1, "x" * 8 * 20), {}, EPS[0])
    assert scorer.index.size("e0") == 8
    assert scorer.index.match("e0", chained_block_hashes("x" * 160, block_chars=8)) == 8  # the head survives
    fixed = PrefixAffinityScorer(name="prefix", state=state, block_chars=8, capacity_tokens=4)
    fixed.on_start(_req(1, "x" * 8 * 20), {}, EPS[0])
    assert fixed.index.size("e0") == 2  # the configured capacity wins over the scraped one
