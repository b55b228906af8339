"""The live routing benchmark end to end on simulated engines: what a GPU run does, small and slow-stepped.

Two simulated engines in their own process, one gateway process per profile, the capacity probe, routing
points, the accounting point with cancellations mid-stream, the gateway-overhead phase; then the report.
The engines' own token counters must equal what the gateway charged the tenants wherever no client left
early, and stay within a token per starved cancellation where clients left mid-stream.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from fleetgate.bench.live_cli import sim_engines
from fleetgate.bench.live_report import write_reports
from fleetgate.bench.live_routing import LiveOptions, run_live
from fleetgate.sim.workloads import Sizes


def test_a_small_live_run_on_simulated_engines(tmp_path: Path) -> None:
    options = LiveOptions(
        profiles=["round-robin", "default", "precise-prefix-unknown"], loads=[1.0], window_s=3.0, short_window_s=3.0,
        drain_s=15.0, unique_loads=[], chat_loads=[], accounting_cancel_share=0.4, overhead_window_s=3.0,
        probe_s=3.0, probe_concurrency=16, calibrate=False, budget_s=120.0, overhead_idle_pairs=4,
        sizes=Sizes(prefix_tokens=256, question_tokens=32, output_tokens=8, tenants=3),
    )
    with sim_engines(replicas=2, kv_blocks=256, time_scale=2.0, log_dir=tmp_path) as urls:
        rows = asyncio.run(run_live(urls, options, out_dir=tmp_path, workdir=tmp_path, log=lambda _: None))
    kinds = [r["kind"] for r in rows]
    assert kinds[0] == "meta" and "capacity" in kinds and "overhead" in kinds and kinds[-1] == "accounting"
    meta = rows[0]
    assert list(meta["unknown_profiles"]) == ["precise-prefix-unknown"]
    assert meta["prefix_cache_reset"] is True and meta["kv_capacity_tokens"] == 256 * 16
    skipped = next(r for r in rows if r["kind"] == "skipped")
    assert (skipped["point"], skipped["why"]) == ("shared-prefix x1 precise-prefix-unknown", "profile unavailable")
    points = [r for r in rows if r["kind"] == "point"]
    assert [(p["profile"], p["tag"]) for p in points] == [("round-robin", "routing"), ("default", "routing"),
                                                         ("default", "accounting")]
    for p in points:
        assert p["requests"] > 0 and p["errors"] == 0 and p["forced"] == 0, p
        assert p["engine_generation_tokens"] > 0 and p["ttft_p50_s"] is not None
        assert sum(p["spread"].values()) == p["requests"]
    overhead = next(r for r in rows if r["kind"] == "overhead")
    # the gateway watched its own loop over the loaded window (`loop_watch`): ~200 timer samples a second
    assert overhead["gateway_loop"]["samples"] > 100 and overhead["gateway_loop"]["lag_ms"]["max"] >= 0, overhead
    # the second method: the gateway's own clocks, one observation per phase for each idle pair's gateway request
    phases = ("before_upstream", "stages", "upstream_write", "first_chunk", "total_to_first_byte")
    assert {p: s["count"] for p, s in overhead["own_idle"].items()} == dict.fromkeys(
        phases, overhead["idle_pairs"]), overhead["own_idle"]
    loaded = overhead["own_loaded"]["total_to_first_byte"]
    assert loaded["count"] > overhead["loaded_pairs"]  # the background's requests too
    assert 0 < loaded["mean_ms"] < 1000 * overhead["background_ttft_p50_s"]
    assert overhead["own_share_of_ttft_p50"] > 0
    for p in [*points[:2], overhead]:  # no client left early: exact
        assert p["lost_prompt_tokens"] == 0 and p["lost_completion_tokens"] == 0, p
    cancelling = points[2]
    assert cancelling["cancelled"] > 0 and cancelling["lost_prompt_tokens"] == 0
    # A client leaving mid-stream is charged what the engine counted (`test_cancel_accounting`), unless the
    # gateway or engine process is starved for a whole engine step at that moment (this machine is shared):
    # then one token can be missed. Never more than that, and never charged above the engine's count.
    assert 0 <= cancelling["lost_completion_tokens"] <= cancelling["cancelled"] // 4, cancelling
    summary = rows[-1]
    assert summary["verdict"] == ("PASS" if cancelling["lost_completion_tokens"] == 0 else "FAIL"), summary
    assert summary["cancelled"] == cancelling["cancelled"]
    on_disk = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert [r["kind"] for r in on_disk] == kinds  # written as it went
    paths = write_reports(rows, out_dir=tmp_path)
    text = paths[0].read_text()
    assert "## shared-prefix x1" in text and f"ACCOUNTING {summary['verdict']}" in text
    assert "Gateway loop lag (a timer every 5 ms)" in text
    assert "Second method, the gateway's own time measured inside it" in text
    assert "gateway's own time <= 1% of TTFT p50" in text


def test_the_overhead_phase_at_the_reference_scale_through_the_cli_on_simulated_engines(tmp_path: Path) -> None:
    """`--overhead-background reference --overhead-streams 4`: 4 closed-loop streams per engine (8 for the two
    simulated engines) of unique ~1k-token prompts for 128 tokens each, behind the paired probes."""
    import argparse
    import math

    from fleetgate.bench.routing import add_arguments, run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--live", "--profiles", "default", "--loads", "", "--unique-loads", "", "--chat-loads",
                              "", "--no-calibrate", "--base-rate", "4", "--no-accounting", "--overhead-window", "4",
                              "--overhead-background", "reference", "--overhead-streams", "4", "--budget", "150",
                              "--out", str(tmp_path)])
    assert run(args) == 0  # the accounting check over the overhead row alone: nothing lost
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    overhead = next(r for r in rows if r["kind"] == "overhead")
    assert (overhead["background"], overhead["streams"], overhead["rate"]) == ("reference", 8, None)
    assert overhead["background_requests"] >= 8  # every stream sent at least its first request
    assert 950 <= overhead["background_prompt_tokens_mean"] <= 1050
    assert overhead["engine_generation_tokens"] >= 128 * overhead["background_requests"]  # ignore_eos: 128 each
    assert overhead["loaded_pairs"] > 0 and math.isfinite(overhead["added_share_of_ttft_p50"])
    assert overhead["background_ttft_p50_s"] > 0 and overhead["own_share_of_ttft_p50"] > 0
    assert overhead["comparable"] and overhead["lost_prompt_tokens"] == overhead["lost_completion_tokens"] == 0
    assert overhead["background_chains_ran_out"] == 0
    text = (tmp_path / "report.md").read_text()
    assert "## Gateway at engine speed (default; reference background, 8 closed-loop streams)" in text
