"""The overhead phase's control pairs: what the paired probe charges a known pure delay, and their report."""

from __future__ import annotations

import pytest

from fleetgate.bench.live_overhead import control_rows, over_5ms
from fleetgate.bench.live_report import control_lines


def test_control_rows_give_the_real_offset_and_the_added_time_per_offset() -> None:
    pairs = {1.0: [(0.0012, 0.0002), (0.0014, 0.0302), (0.0010, 0.0004)], 3.0: [(0.0031, 0.0031)]}
    rows = control_rows(pairs)
    assert [r["offset_ms"] for r in rows] == [1.0, 3.0]
    one = rows[0]
    assert one["pairs"] == 3 and one["real_offset_ms"] == pytest.approx(1.2)
    assert one["added_ms"][0] == pytest.approx((0.2 + 30.2 + 0.4) / 3, abs=1e-3)
    assert one["added_median_ms"] == pytest.approx(0.4)
    assert one["share_over_5ms"] == pytest.approx(1 / 3, abs=1e-4)


def test_share_over_5ms() -> None:
    assert over_5ms([]) == 0.0
    assert over_5ms([0.001, 0.006, 0.02, -0.001]) == 0.5


def test_report_shows_controls_beside_the_gateway_pairs() -> None:
    row = {"loaded_share_over_5ms": 0.08, "controls": control_rows({0.5: [(0.0006, 0.0009), (0.0005, 0.0251)]})}
    text = "\n".join(control_lines(row))
    assert "8.0% of them over 5 ms" in text
    assert "| 0.5 | 0.55 | 2 | +13.00" in text and "| 50.0% |" in text
    assert control_lines({"loaded_share_over_5ms": 0.1}) == []


def test_the_overhead_phase_runs_once_per_replica_count_on_the_same_requests() -> None:
    from fleetgate.bench.live_routing import LiveOptions, plan

    specs = [s for s in plan(LiveOptions(loads=[], overhead_replicas=(1, 2)), 10.0) if s.tag == "overhead"]
    assert [s.replicas for s in specs] == [1, 2]
    assert len({s.seed for s in specs}) == 1  # the same background requests for both counts
    default = [s for s in plan(LiveOptions(loads=[], gateway_replicas=3), 10.0) if s.tag == "overhead"]
    assert [s.replicas for s in default] == [3]


def test_the_overhead_phase_runs_each_profile_at_each_replica_count_on_the_same_requests() -> None:
    from fleetgate.bench.live_routing import LiveOptions, plan

    options = LiveOptions(loads=[], overhead_profiles=["default", "default-shared"], overhead_replicas=(1, 2))
    specs = [s for s in plan(options, 10.0) if s.tag == "overhead"]
    assert [(s.profile, s.replicas) for s in specs] == [("default", 1), ("default", 2), ("default-shared", 1),
                                                        ("default-shared", 2)]
    assert len({s.seed for s in specs}) == 1


def test_the_cli_splits_the_overhead_profiles() -> None:
    import argparse

    from fleetgate.bench.live_cli import add_live_arguments, options_from_args

    parser = argparse.ArgumentParser()
    add_live_arguments(parser)
    parser.add_argument("--prefix-tokens", type=int, default=None)  # added by the commands that embed these options
    parser.add_argument("--kv-tokens", type=int, default=None)
    assert options_from_args(parser.parse_args([])).overhead_profiles == ["default"]
    args = parser.parse_args(["--overhead-profiles", "default, default-shared"])
    assert options_from_args(args).overhead_profiles == ["default", "default-shared"]
