"""The live benchmark's workloads: seeded, sized from the engines, cut to a window, cancellations chosen."""

from __future__ import annotations

import orjson

from fleetgate.bench.live_workloads import Target, tenant_of, to_requests
from fleetgate.sim.workloads import Sizes, sized_items

SIZES = Sizes(prefix_tokens=512, question_tokens=32, output_tokens=16, tenants=4)


def _items(workload: str, seed: int, **kw: object) -> list:
    args: dict = {"seed": seed, "rate": 20.0, "window_s": 5.0, "sizes": SIZES, "chars_per_token": 5.5,
                  "capacity_tokens": 8192, "replicas": 2, "users": 6}
    args.update(kw)
    return sized_items(workload, **args)


def test_same_seed_same_requests_other_seed_other_requests() -> None:
    for workload in ("shared-prefix", "chat", "unique"):
        a, b, c = _items(workload, 1), _items(workload, 1), _items(workload, 2)
        assert [(i.id, i.prompt, i.arrival_s, i.after) for i in a] == [(i.id, i.prompt, i.arrival_s, i.after)
                                                                       for i in b]
        assert [i.prompt for i in a] != [i.prompt for i in c]


def test_shared_prefix_groups_are_sized_from_one_engines_kv_and_arrivals_fit_the_window() -> None:
    items = _items("shared-prefix", 3)
    groups = {i.group for i in items}
    # hot factor min(2.5, 0.75 x 2) = 1.5: 1.5 x 8192 / 512 = 24 groups
    assert SIZES.groups(capacity_tokens=8192, replicas=2) == 24
    assert len(groups) <= 24 and len(groups) >= 20
    assert all(0 <= i.arrival_s < 5.0 for i in items)
    assert 60 <= len(items) <= 140  # ~ 20/s x 5 s, Poisson
    by_group: dict[str, set[str]] = {}
    for i in items:
        by_group.setdefault(i.group, set()).add(i.prompt.split("\nQuestion")[0])
    assert all(len(prefixes) == 1 for prefixes in by_group.values())  # one long prompt per group
    assert all(i.max_tokens == 16 for i in items)


def test_prompt_length_follows_the_measured_characters_per_token() -> None:
    short = _items("shared-prefix", 3, chars_per_token=4.0)[0].prompt
    long = _items("shared-prefix", 3, chars_per_token=6.0)[0].prompt
    assert 1.4 < len(long) / len(short) < 1.6


def test_chat_turns_follow_each_other_with_the_users_session() -> None:
    items = _items("chat", 5)
    assert len(items) == 6 * SIZES.chat_rounds
    first = [i for i in items if i.after is None]
    assert len(first) == 6
    for i in items:
        if i.after is not None:
            prev = next(p for p in items if p.id == i.after)
            assert i.prompt.startswith(prev.prompt)  # the history grows
            assert i.session_key == prev.session_key


def test_cancellations_are_seeded_about_the_share_asked_and_mid_stream() -> None:
    items = _items("shared-prefix", 3, rate=80.0)
    target = Target(url="http://gw", model="m", keys={f"t{k}": f"key{k}" for k in range(4)})
    reqs = to_requests(items, target=target, tenants=4, cancel_share=0.3, seed=9, output_tokens=16)
    again = to_requests(items, target=target, tenants=4, cancel_share=0.3, seed=9, output_tokens=16)
    assert [r.cancel_after for r in reqs] == [r.cancel_after for r in again]
    cancelled = [r for r in reqs if r.cancel_after is not None]
    assert 0.2 < len(cancelled) / len(reqs) < 0.4
    assert all(1 <= r.cancel_after <= 15 for r in cancelled)  # type: ignore[operator]
    body = orjson.loads(reqs[0].body)
    assert body["stream"] and body["ignore_eos"] and body["max_tokens"] == 16
    assert reqs[0].headers["Authorization"] == f"Bearer key{reqs[0].tenant[1:]}"


def test_direct_requests_go_to_the_engines_in_turn_without_keys() -> None:
    items = _items("unique", 4)
    target = Target(url="", model="m", keys={}, engine_urls=("http://e0", "http://e1"))
    reqs = to_requests(items, target=target, tenants=4, path="direct")
    assert [r.url for r in reqs[:4]] == ["http://e0", "http://e1", "http://e0", "http://e1"]
    assert "Authorization" not in reqs[0].headers


def test_tenants_own_groups_and_users() -> None:
    items = _items("shared-prefix", 3)
    for i in items:
        assert tenant_of(i, 4) == f"t{int(i.group[1:]) % 4}"


def test_a_request_cut_off_before_its_first_token_counts_with_its_wait() -> None:
    from fleetgate.bench.live_client import LiveResult
    from fleetgate.bench.live_points import summarize

    def res(i: int, **kw: object) -> LiveResult:
        values: dict = {"id": f"r{i}", "path": "gateway", "tenant": "t0", "group": "g0", "sent_s": 1.0,
                        "status": 200, "done_s": 2.0, "endpoint": "e0"}
        values.update(kw)
        return LiveResult(**values)

    results = [res(i, ttft_s=0.1) for i in range(8)]
    results += [res(8, forced=True, done_s=31.0), res(9, status=0, forced=True, done_s=21.0),
                res(10, status=500, error="boom")]
    s = summarize(results, window_s=9.0)
    assert s["ttft_censored"] == 2 and s["forced"] == 2 and s["errors"] == 1
    assert s["ttft_p50_s"] == 0.1
    assert s["ttft_p99_s"] > 20  # waited 30 s and 20 s without a first token: not dropped from the tail
    assert s["left_before_first_chunk"] == 2
