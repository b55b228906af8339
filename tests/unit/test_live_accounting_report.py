"""The live run's accounting verdict, its targets and the measured throughput file it writes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fleetgate.bench import live_report
from fleetgate.bench.live_report import targets, write_reports
from fleetgate.bench.live_routing import accounting_line, accounting_summary
from fleetgate.bench.measured_throughput import load


def point(profile: str, load: float, *, workload: str = "shared-prefix", p50: float = 1.0, p90: float = 2.0,
          tps: float = 1000.0, lost: tuple[float, float] = (0, 0), comparable: bool = True, **extra: Any
          ) -> dict[str, Any]:
    row = {"kind": "point", "tag": "routing", "workload": workload, "profile": profile, "load": load, "rate": 10.0,
           "window_s": 10.0, "requests": 100, "ttft_p50_s": p50, "ttft_p90_s": p90, "ttft_steady_p90_s": p90,
           "output_tps": tps, "hit_rate": 0.5, "gateway_cpu_ms_per_request": 1.0, "spread": {"e0": 50, "e1": 50},
           "engine_prompt_tokens": 50_000 + lost[0], "engine_generation_tokens": 6_400 + lost[1],
           "charged_prompt_tokens": 50_000, "charged_completion_tokens": 6_400, "lost_prompt_tokens": lost[0],
           "lost_completion_tokens": lost[1], "comparable": comparable, "cancelled": 0,
           "window_prompt_tokens": 40_000, "window_uncached_prompt_tokens": 10_000,
           "window_generation_tokens": tps * 10}
    row.update(extra)
    return row


def test_accounting_passes_only_when_nothing_is_lost_on_comparable_rows() -> None:
    rows = [point("round-robin", 1.0), point("default", 1.0, cancelled=30)]
    summary = accounting_summary(rows)
    assert summary["verdict"] == "PASS" and summary["rows"] == 2
    assert summary["engine_generation_tokens"] == summary["charged_completion_tokens"] == 12_800
    assert "ACCOUNTING PASS" in accounting_line(summary) and "30 requests cancelled" in accounting_line(summary)
    rows.append(point("default", 1.5, lost=(0, 3)))
    summary = accounting_summary(rows)
    assert summary["verdict"] == "FAIL" and summary["lost_completion_tokens"] == 3
    assert "lost 0 prompt, 3 completion" in accounting_line(summary)


def test_rows_that_cannot_be_compared_are_listed_not_counted() -> None:
    rows = [point("default", 1.0), point("least-loaded", 0.8, workload="unique", lost=(-900, 0), comparable=False)]
    summary = accounting_summary(rows)
    assert summary["verdict"] == "PASS" and summary["rows"] == 1
    assert summary["excluded"] == ["unique least-loaded x0.8"]


def test_no_comparable_row_is_no_pass() -> None:
    assert accounting_summary([point("default", 1.0, comparable=False)])["verdict"] == "FAIL"


def test_the_overhead_phase_subtracts_its_direct_probes() -> None:
    row = {"kind": "overhead", "engine_prompt_tokens": 1000, "engine_generation_tokens": 100,
           "direct_prompt_tokens": 300, "direct_completion_tokens": 20, "charged_prompt_tokens": 700,
           "charged_completion_tokens": 80, "lost_prompt_tokens": 0, "lost_completion_tokens": 0, "comparable": True}
    summary = accounting_summary([row])
    assert summary["verdict"] == "PASS" and summary["direct_prompt_tokens"] == 300


def test_targets_judge_the_routing_points_against_round_robin_and_least_loaded() -> None:
    rows = [
        point("round-robin", 1.5, p90=9.0, tps=1000), point("default", 1.5, p90=2.0, tps=1500),
        point("precise-prefix", 1.5, p90=1.5, tps=1600),
        point("round-robin", 0.5, p90=0.5, tps=500), point("default", 0.5, p90=0.5, tps=500),
        point("least-loaded", 0.8, workload="unique", p50=1.0, p90=2.0, tps=900),
        point("default", 0.8, workload="unique", p50=1.03, p90=2.2, tps=905),
        {"kind": "accounting", "verdict": "PASS", "lost_prompt_tokens": 0, "lost_completion_tokens": 0, "rows": 5,
         "cancelled": 30},
    ]
    got = {name: met for name, met, _ in targets(rows)}
    assert got["shared-prefix x1.5: default TTFT p90 >= 3x round-robin"] is True  # 4.5x
    assert got["shared-prefix x1.5: default output tok/s >= 1.3x round-robin"] is True
    assert got["shared-prefix x1.5: precise-prefix >= default"] is True
    assert not any(name.startswith("shared-prefix x0.5: default TTFT") for name in got)  # light load: no target
    assert got["unique x0.8: default within +-5% of least-loaded"] is False  # TTFT p90 +10%
    assert got["accounting exact against the engines' counters"] is True


def test_overhead_target_needs_the_whole_interval_under_one_percent() -> None:
    base = {"kind": "overhead", "background_ttft_p50_s": 0.5, "output_tps": 4000.0}
    settled = {**base, "loaded_added_ms": [2.0, 1.0, 4.0], "added_share_of_ttft_p50": 0.004}
    straddles = {**base, "loaded_added_ms": [4.0, 1.0, 9.0], "added_share_of_ttft_p50": 0.008}
    missed = {**base, "loaded_added_ms": [8.0, 6.5, 9.0], "added_share_of_ttft_p50": 0.016}
    assert [met for _, met, _ in targets([settled])] == [True]
    assert [met for _, met, _ in targets([straddles])] == [None]
    assert [met for _, met, _ in targets([missed])] == [False]


def test_the_throughput_file_holds_the_calibration_the_capacity_probe_and_every_point(tmp_path: Path) -> None:
    rows = [{"kind": "meta", "replicas": 2, "model": "llama-3.1-8b", "options": {"calibration_reps": 3},
             "sizes": {"prefix_tokens": 2048, "question_tokens": 96, "output_tokens": 64}},
            {"kind": "calibration", "prefill_s_per_token": 5e-5, "step_overhead_s": 0.01, "decode_s_per_seq": 2e-4,
             "ttft_intercept_s": 0.02, "ttft_by_len": {"128": 0.025, "2048": 0.12}, "tpot_by_batch": {"1": 0.0102,
                                                                                                   "64": 0.0228}},
            {"kind": "capacity", "concurrency": 192, "completed": 400, "output_tps": 6000.0, "ttft_p50_s": 0.8,
             "base_rate": 90.0, "hit_rate": 0.5,
             "ttft_p90_s": 1.5},
            point("round-robin", 1.5, tps=3000, mean_in_flight=80.0, requests=100),
            point("round-robin", 1.0, tps=2000, mean_in_flight=30.0, requests=100)]
    info = {"model_shape": "llama-3.1-8b", "card": "NVIDIA H100 80GB HBM3", "vllm_version": "0.26.0",
            "max_num_seqs": 128, "max_num_batched_tokens": 8192, "parameters": 8_000_000_000}
    paths = write_reports(rows, out_dir=tmp_path, info=info)
    assert [p.name for p in paths] == ["report.md", "throughput.json"]
    data = load(tmp_path / "throughput.json")  # the GPU tier's schema, validated
    assert data.vllm_version == "0.26.0"
    entries = {e.name: e for e in data.entries}
    assert list(entries) == ["llama-3.1-8b-calibration", "llama-3.1-8b-capacity-round-robin",
                             "llama-3.1-8b-shared-prefix-round-robin"]
    cal = entries["llama-3.1-8b-calibration"]
    assert cal.card == "NVIDIA H100 80GB HBM3" and cal.max_num_seqs == 128 and cal.gpus == 1
    assert [(p.concurrency, p.prompt_tokens, p.output_tokens) for p in cal.points] == [
        (1, 128, 1), (1, 2048, 1), (1, 64, 32), (64, 64, 32)]
    assert cal.points[1].output_tokens_per_s == pytest.approx(1 / 0.12)
    assert cal.points[3].output_tokens_per_s == pytest.approx(64 / 0.0228)
    [cap] = entries["llama-3.1-8b-capacity-round-robin"].points
    assert (cap.concurrency, cap.prompt_tokens, cap.output_tokens, cap.output_tokens_per_s) == (96, 2144, 64, 3000)
    routing = entries["llama-3.1-8b-shared-prefix-round-robin"].points
    assert [(p.concurrency, p.output_tokens_per_s) for p in routing] == [(15, 1000.0), (40, 1500.0)]  # per replica
    assert routing[0].prompt_tokens == 500  # the engines' 50,000 prompt tokens over 100 requests


def test_a_run_that_measured_nothing_writes_no_throughput_file(tmp_path: Path) -> None:
    rows = [{"kind": "meta", "replicas": 2}, {"kind": "skipped", "point": "x", "why": "budget"}]
    assert [p.name for p in write_reports(rows, out_dir=tmp_path)] == ["report.md"]


RUN_ROWS = [{"kind": "meta", "replicas": 2, "model": "llama-3.1-8b", "sizes": {"output_tokens": 64}},
            point("round-robin", 1.0, mean_in_flight=30.0)]
RUN_INFO = {"engine_desc": "vllm 0.26.0, 2x llama-3.1-8b on NVIDIA H100 80GB HBM3", "model_shape": "llama-3.1-8b",
            "card": "NVIDIA H100 80GB HBM3", "vllm_version": "0.26.0"}


def _write_run(tmp_path: Path, info_name: str | None) -> Path:
    results = tmp_path / "gpu-routing-h100-call1.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in RUN_ROWS), encoding="utf-8")
    if info_name is not None:
        (tmp_path / info_name).write_text(json.dumps(RUN_INFO), encoding="utf-8")
    return results


@pytest.mark.parametrize("info_name", ["run-info.json", "gpu-routing-h100-call1-run-info.json"])
def test_the_cli_finds_the_run_info_kept_beside_the_results_under_either_name(tmp_path: Path, info_name: str
                                                                              ) -> None:
    results = _write_run(tmp_path, info_name)
    assert live_report.main([str(results), str(tmp_path / "out")]) == 0
    assert "on NVIDIA H100 80GB HBM3" in (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    [entry] = load(tmp_path / "out" / "throughput.json").entries
    assert entry.card == "NVIDIA H100 80GB HBM3"


def test_the_cli_takes_a_named_run_info_and_refuses_a_missing_one(tmp_path: Path) -> None:
    results = _write_run(tmp_path, "elsewhere.json")
    assert live_report.main([str(results), str(tmp_path / "out"), "--info", str(tmp_path / "elsewhere.json")]) == 0
    assert load(tmp_path / "out" / "throughput.json").entries[0].card == "NVIDIA H100 80GB HBM3"
    assert live_report.main([str(results), str(tmp_path / "o2"), "--info", str(tmp_path / "nope.json")]) == 2
    assert not (tmp_path / "o2").exists()
    assert live_report.main([str(results), "--info"]) == 2


def test_the_cli_without_run_info_says_the_card_is_unknown(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                           ) -> None:
    results = _write_run(tmp_path, None)
    assert live_report.main([str(results), str(tmp_path / "out")]) == 0
    assert "no run-info.json" in capsys.readouterr().err
    assert load(tmp_path / "out" / "throughput.json").entries[0].card == "unknown"


def test_the_finish_row_replays_the_accounting_rows_requests_through_a_gateway_that_lets_engines_finish() -> None:
    from fleetgate.bench.live_routing import LiveOptions, plan

    rows = [p for p in plan(LiveOptions(accounting_finish_tokens=4096), 50.0) if p.tag.startswith("accounting")]
    abort, finish = rows
    assert (abort.tag, finish.tag) == ("accounting", "accounting-finish")
    assert finish.seed == abort.seed and finish.rate == abort.rate and finish.cancel_share == abort.cancel_share > 0
    assert abort.server == () and dict(finish.server) == {"cancel_finish_tokens": 4096}
    assert [p.tag for p in plan(LiveOptions(), 50.0)].count("accounting-finish") == 0


def test_repeated_seeds_rerun_the_first_loads_shared_points_on_other_requests_and_optional_phases_can_be_left_out(
        ) -> None:
    from fleetgate.bench.live_routing import LiveOptions, plan

    options = LiveOptions(profiles=["round-robin", "default"], loads=[1.2, 1.0], unique_loads=[], chat_loads=[],
                          repeat_seeds=[73], accounting=False, overhead_window_s=0)
    specs = plan(options, 50.0)
    main = [s for s in specs if s.tag == "routing"]
    again = [s for s in specs if s.tag == "seed-73"]
    assert [(s.profile, s.load) for s in again] == [("round-robin", 1.2), ("default", 1.2)]
    first = {s.seed for s in main if s.load == 1.2}
    assert len(first) == 1 and {s.seed for s in again} != first  # the same load on other requests
    assert {s.tag for s in specs} == {"routing", "seed-73"}  # no accounting row, no overhead phase


def test_a_repeated_seed_group_gets_its_own_table_and_targets_and_precise_local_is_judged_as_precise(
        tmp_path: Path) -> None:
    rows = [point("round-robin", 1.2, p90=9.0, tps=1000), point("default", 1.2, p90=2.0, tps=1500),
            point("precise-local", 1.2, p90=1.5, tps=1600),
            point("round-robin", 1.2, p90=6.0, tps=1000, tag="seed-73"),
            point("default", 1.2, p90=3.0, tps=1200, tag="seed-73")]
    got = {name: met for name, met, _ in targets(rows)}
    assert got["shared-prefix x1.2: default TTFT p90 >= 3x round-robin"] is True  # 4.5x
    assert got["shared-prefix x1.2 (seed-73): default TTFT p90 >= 3x round-robin"] is False  # 2x
    assert got["shared-prefix x1.2 (seed-73): default output tok/s >= 1.3x round-robin"] is False  # 1.2x
    assert got["shared-prefix x1.2: precise-local >= default"] is True
    report = write_reports(rows, out_dir=tmp_path)[0].read_text(encoding="utf-8")
    assert "## shared-prefix x1.2, seed-73 (" in report and "## shared-prefix x1.2 (" in report


def test_the_drawn_load_is_the_seeds_arrivals_over_the_nominal_expectation() -> None:
    from fleetgate.bench.live_report import drawn_load

    assert drawn_load(point("default", 1.2, requests=108)) == pytest.approx(1.2 * 108 / 100)  # rate 10/s for 10 s
    assert drawn_load(point("default", 1.0, workload="chat")) is None  # closed loop: no nominal arrivals
    assert drawn_load(point("default", 1.0, rate=0.0)) is None


def test_a_precise_gateways_kv_event_batches_and_wakes_are_read_from_its_metrics_and_printed() -> None:
    from prometheus_client import CollectorRegistry, Counter, generate_latest

    from fleetgate.bench.live_points import kv_event_counts_in
    from fleetgate.bench.live_routing import _point_line

    registry = CollectorRegistry()
    batches = Counter("fleetgate_router_kv_events_batches", "b", ["endpoint"], registry=registry)
    wakes = Counter("fleetgate_router_kv_events_wakes", "w", ["endpoint"], registry=registry)
    batches.labels("e0").inc(120)
    batches.labels("e1").inc(80)
    wakes.labels("e0").inc(10)
    wakes.labels("e1").inc(5)
    assert kv_event_counts_in(generate_latest(registry).decode()) == {"batches": 200.0, "wakes": 15.0}
    assert kv_event_counts_in("# an approximate gateway has neither\n") == {}
    row = point("precise-local", 1.5, kv_events={"batches": 200.0, "wakes": 15.0}, errors=0, cancelled=0, forced=0,
                elapsed_s=12.0)
    assert "KV events 200 batches in 15 wakes" in _point_line(row)
    assert "KV events" not in _point_line(point("default", 1.5, errors=0, cancelled=0, forced=0, elapsed_s=12.0))
