"""`fleetgate bench cost --throughput A --throughput B --tier-entry large=SELECTOR`: a tier priced from an entry
of another precision or parallelism than its default (the 70B in fp8 on TP2 for the bf16 TP4 large tier),
several files pooled, and selectors that match nothing or several refused with one line and exit 2."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from fleetgate.bench import cost
from fleetgate.bench.cost_fleet import RunningFleet, default_deployments
from fleetgate.bench.cost_measured import apply_throughput, predicted_tps
from fleetgate.bench.measured_throughput import ThroughputEntry, ThroughputFile, ThroughputPoint
from fleetgate.bench.tier_entry import SelectorError, merge, parse_selector, parse_tier_entries
from fleetgate.sim.engine import EngineCounters, SimEngine
from fleetgate.sim.fleet import SimFleet

from .calibration_probe import probe_points

CARD = "NVIDIA H100 80GB HBM3"
# The 70B fp8 TP2 calibration probe of an engine with TTFT = 30 ms + 100 us x prompt and TPOT = 25 ms + 0.1 ms x B
PREFILL, OVERHEAD, SLOPE = 1e-4, 0.025, 1e-4
PROBE = probe_points(ttft0=0.03, prefill=PREFILL, overhead=OVERHEAD, slope=SLOPE, batches=(1, 16, 64))
LEVELS = (ThroughputPoint(concurrency=1, requests=3, prompt_tokens=1024, output_tokens=128, output_tokens_per_s=17.0,
                          ttft_p50_s=0.09, ttft_p90_s=0.12),
          ThroughputPoint(concurrency=16, requests=16, prompt_tokens=1024, output_tokens=128,
                          output_tokens_per_s=246.0, ttft_p50_s=0.75, ttft_p90_s=1.4))  # fmt: skip


def entry(name: str, points: tuple[ThroughputPoint, ...], **over: object) -> ThroughputEntry:
    fields: dict[str, object] = {
        "name": name, "model_shape": "llama-3.1-70b", "parameters": 70_553_706_496, "dtype": "bfloat16",
        "quantization": "fp8", "kv_cache_dtype": "auto", "card": CARD, "gpus": 2, "tensor_parallel_size": 2,
        "enforce_eager": False, "speculative": None, "max_num_seqs": 256, "max_num_batched_tokens": 8192,
        "points": points,
    }  # fmt: skip
    fields.update(over)
    return ThroughputEntry(**fields)  # type: ignore[arg-type]


SMALL = entry("llama-3.1-8b-calibration", PROBE, model_shape="llama-3.1-8b", quantization="none", gpus=1,
              tensor_parallel_size=1, max_num_seqs=128)  # fmt: skip
COMPILED = entry("llama70b-fp8-tp2", LEVELS + PROBE)
EAGER = entry("llama70b-fp8-tp2-eager", LEVELS, enforce_eager=True)


def file(*entries: ThroughputEntry, vllm: str = "0.26.0") -> ThroughputFile:
    return ThroughputFile(measured_at="2026-11-28T10:00:00Z", command="test", vllm_version=vllm, entries=entries)


def pooled() -> tuple:  # type: ignore[type-arg]
    """The routing run's file (small tier) and the knob sweep's (both 70B twins), as the CLI merges them."""
    return merge([("routing.json", file(SMALL)), ("sweep.json", file(COMPILED, EAGER, vllm="0.26.1"))])


def tiers(*values: str) -> dict:  # type: ignore[type-arg]
    return parse_tier_entries(values, tiers=["small", "large"])


def test_without_a_selector_the_fp8_tp2_entry_is_not_taken_for_the_bf16_tier() -> None:
    deployments = default_deployments(time_scale=1.0)
    (small, large), labels = apply_throughput(deployments, pooled())
    assert small.gpu_type == CARD and small.profile.prefill_s_per_token == pytest.approx(PREFILL)
    assert large == deployments[1] and labels["large"] == "simulated (profile bench-70b-tp4)"


def test_the_selected_fp8_tp2_entry_prices_the_large_tier_on_two_gpus_at_its_speed() -> None:
    deployments = default_deployments(time_scale=1.0)
    (small, large), labels = apply_throughput(deployments, pooled(), tier_entries=tiers("large=llama70b-fp8-tp2"))
    assert deployments[1].gpus_per_replica == 4  # the simulated bf16 TP4 tier it replaces
    assert large.gpus_per_replica == 2 and large.gpu_type == CARD and large.usd_per_gpu_hour == 4.00
    assert (large.profile.prefill_s_per_token, large.profile.step_overhead_s, large.profile.decode_s_per_seq) == (
        pytest.approx(PREFILL), pytest.approx(OVERHEAD), pytest.approx(SLOPE))  # fitted from its calibration probe
    # full batches priced no larger than the probe measured (64 streams), not the engine's limit of 256
    assert large.profile.max_num_seqs == 64 and large.replicas == deployments[1].replicas
    assert small.gpus_per_replica == 1 and small.profile.prefill_s_per_token == pytest.approx(PREFILL)
    label = labels["large"]
    assert label.startswith("measured (llama70b-fp8-tp2: llama-3.1-70b fp8 weights, TP2, 2x NVIDIA H100 80GB HBM3, "
                            "vLLM 0.26.1; chosen by --tier-entry large=llama70b-fp8-tp2; fitted: prefill 10,000 tok/s")
    assert label.endswith("$4.00/GPU-hour)") and "bfloat16" not in label
    assert "batches of at most 64 (the largest measured; the engine allows 256)" in label
    assert "vLLM 0.26.0" in labels["small"]  # each entry keeps its own file's vLLM version

    engine = SimEngine(profile=large.profile)  # the cost model: 2 GPUs x the entry's step times x the H100 price
    engine.counters = EngineCounters(prompt_tokens=50_000, prefix_hits=10_000, generation_tokens=6_000)
    fleet = RunningFleet(deployments=(large,), fleets={"large": SimFleet(urls=[], engines=[engine], model=large.model)})
    work = 40_000 * PREFILL + 6_000 * (SLOPE + OVERHEAD / 64)
    assert fleet.gpu_seconds()["large"] == pytest.approx(2 * work)
    assert fleet.dollars()["large"] == pytest.approx(2 * work * 4.00 / 3600)


def test_a_sweep_entry_without_the_probe_scales_to_its_busiest_level_and_says_eager() -> None:
    deployments = default_deployments(time_scale=1.0)
    (_, large), labels = apply_throughput(deployments, pooled(),
                                          tier_entries=tiers("large=llama-3.1-70b/fp8/tp2/eager"))  # fmt: skip
    assert large.gpus_per_replica == 2
    assert predicted_tps(large.profile, prompt_tokens=1024, output_tokens=128, concurrency=16) == pytest.approx(246.0)
    assert "fp8 weights, TP2, eager (no CUDA graphs), 2x NVIDIA H100" in labels["large"]
    assert "scaled x" in labels["large"] and "246 output tok/s at 16 streams of 1024+128 tokens" in labels["large"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (("large=llama70b-bf16-tp4",), "matches no entry with points"),
        (("large=llama-3.1-70b/fp8/tp2",), "matches 2 entries: llama70b-fp8-tp2 (file 2, sweep.json), "
                                           "llama70b-fp8-tp2-eager (file 2, sweep.json)"),
        (("large=llama-3.1-70b/fp8/tp4",), "matches no entry"),
        (("large=llama70b-fp8-tp2@1",), "matches no entry"),  # it is in the second file
        (("large=llama-3.1-8b-calibration",), "measured llama-3.1-8b, but the large tier serves llama-3.1-70b"),
    ],
)
def test_selectors_matching_no_entry_or_several_or_another_model_are_refused(values: tuple[str, ...],
                                                                              message: str) -> None:
    with pytest.raises(SelectorError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        apply_throughput(default_deployments(time_scale=1.0), pooled(), tier_entries=tiers(*values))
    assert "\n" not in str(info.value)


def test_duplicates_across_files_are_told_apart_by_file() -> None:
    data = merge([("a.json", file(COMPILED)), ("b.json", file(COMPILED, vllm="0.27.0"))])
    with pytest.raises(SelectorError, match="matches 2 entries"):
        apply_throughput(default_deployments(time_scale=1.0), data, tier_entries=tiers("large=llama70b-fp8-tp2"))
    second = tiers("large=llama70b-fp8-tp2@2")
    _, labels = apply_throughput(default_deployments(time_scale=1.0), data, tier_entries=second)
    assert "vLLM 0.27.0" in labels["large"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (("medium=llama70b-fp8-tp2",), "no tier 'medium'"),
        (("llama70b-fp8-tp2",), "expected TIER=SELECTOR"),
        (("large=a", "large=b"), "given twice"),
        (("large=",), "is empty"),
        (("large=llama-3.1-70b/fp8",), "SHAPE/QUANTIZATION/tpN"),
        (("large=x@0",), "position"),
    ],
)
def test_malformed_tier_entries_are_refused(values: tuple[str, ...], message: str) -> None:
    with pytest.raises(SelectorError, match=message):
        tiers(*values)


def test_selector_forms() -> None:
    shape = parse_selector("llama-3.1-70b/fp8/tp2/compiled@2")
    assert (shape.shape, shape.quantization, shape.tensor_parallel_size, shape.eager, shape.file_index) == (
        "llama-3.1-70b", "fp8", 2, False, 2)
    assert parse_selector("llama70b-fp8-tp2").name == "llama70b-fp8-tp2"


def _args(tmp_path: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    cost.add_arguments(parser)
    return parser.parse_args(["--out", str(tmp_path / "out"), *extra])


def test_the_command_merges_files_and_exits_2_with_one_line_on_a_bad_selector(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    routing, sweep = tmp_path / "routing.json", tmp_path / "sweep.json"
    routing.write_text(file(SMALL).to_json())
    sweep.write_text(file(COMPILED, EAGER).to_json())
    args = _args(tmp_path, "--throughput", str(routing), "--throughput", str(sweep),
                 "--tier-entry", "large=llama-3.1-70b/fp8/tp2")  # fmt: skip
    assert cost.run(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("fleetgate bench cost: --tier-entry large=llama-3.1-70b/fp8/tp2 matches 2 entries")
    assert "\n" not in err
    assert cost.run(_args(tmp_path, "--tier-entry", "large=llama70b-fp8-tp2")) == 2
    assert "--tier-entry needs --throughput" in capsys.readouterr().err
    assert cost.run(_args(tmp_path, "--throughput", str(tmp_path / "missing.json"))) == 2
    assert "missing.json" in capsys.readouterr().err
    # a good selection over both files gets as far as the run: both tiers measured, the large one on fp8 TP2
    good = _args(tmp_path, "--throughput", str(routing), "--throughput", str(sweep), "--tier-entry",
                 "large=llama70b-fp8-tp2", "--requests", "30", "--rate", "30", "--time-scale", "0.05",
                 "--configs", "naive")  # fmt: skip
    assert cost.run(good) == 0
    out = capsys.readouterr().out
    assert "engine throughput: measured\n" in out
    assert "  large tier: measured (llama70b-fp8-tp2: llama-3.1-70b fp8 weights, TP2, 2x NVIDIA H100" in out
    assert "  small tier: measured (llama-3.1-8b-calibration: llama-3.1-8b bfloat16, TP1, 1x NVIDIA H100" in out
    report = (tmp_path / "out").glob("*.json")
    assert any("llama70b-fp8-tp2" in p.read_text() and '"gpus_per_replica": 2' in p.read_text() for p in report)
