"""`fleetgate bench cost --throughput`: tiers with a measured entry run and are priced at the measured speed."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgate.bench.cost_fleet import RunningFleet, default_deployments
from fleetgate.bench.cost_measured import apply_throughput, candidates, gpu_price, measured_profile, predicted_tps
from fleetgate.bench.measured_throughput import ThroughputEntry, ThroughputFile, ThroughputPoint, load
from fleetgate.sim.engine import EngineCounters, SimEngine
from fleetgate.sim.fleet import SimFleet

from .calibration_probe import probe_points

CARD = "NVIDIA H100 80GB HBM3"
# A calibration entry measured on an engine with TTFT = 20 ms + 50 us x prompt tokens and TPOT = 12 ms + 0.2 ms x B
PREFILL, OVERHEAD, SLOPE = 5e-5, 0.012, 2e-4
CALIBRATION = probe_points(ttft0=0.02, prefill=PREFILL, overhead=OVERHEAD, slope=SLOPE, batches=(1, 16, 64, 128))
SWEEP = (ThroughputPoint(concurrency=1, requests=3, prompt_tokens=1024, output_tokens=128, output_tokens_per_s=90.0,
                         ttft_p50_s=0.06, ttft_p90_s=0.07),
         ThroughputPoint(concurrency=64, requests=128, prompt_tokens=1024, output_tokens=128,
                         output_tokens_per_s=3065.0, ttft_p50_s=0.58, ttft_p90_s=1.27))


def entry(name: str, points: tuple[ThroughputPoint, ...], **over: object) -> ThroughputEntry:
    fields: dict[str, object] = {"name": name, "model_shape": "llama-3.1-8b", "parameters": 9_127_071_744,
                                 "dtype": "bfloat16", "quantization": "none", "kv_cache_dtype": "auto", "card": CARD,
                                 "gpus": 1, "tensor_parallel_size": 1, "enforce_eager": False, "speculative": None,
                                 "max_num_seqs": 128, "max_num_batched_tokens": 8192, "points": points}
    fields.update(over)
    return ThroughputEntry(**fields)  # type: ignore[arg-type]


def file(*entries: ThroughputEntry) -> ThroughputFile:
    return ThroughputFile(measured_at="2026-11-28T10:00:00Z", command="test", vllm_version="0.26.0",
                          entries=entries)


def test_a_calibration_entry_gives_the_step_time_constants_themselves() -> None:
    base = default_deployments(time_scale=1.0)[0].profile
    profile, how = measured_profile(entry("llama-3.1-8b-calibration", CALIBRATION), base)
    assert profile.prefill_s_per_token == pytest.approx(PREFILL)
    assert profile.step_overhead_s == pytest.approx(OVERHEAD)
    assert profile.decode_s_per_seq == pytest.approx(SLOPE)
    assert profile.max_num_seqs == 128 and how.startswith("fitted: prefill 20,000 tok/s")


def test_a_sweep_entry_scales_the_profile_to_its_measured_throughput() -> None:
    base = default_deployments(time_scale=1.0)[0].profile
    profile, how = measured_profile(entry("llama8b-bf16", SWEEP, max_num_seqs=1024), base)
    assert predicted_tps(profile, prompt_tokens=1024, output_tokens=128, concurrency=64) == pytest.approx(3065.0)
    ratio = profile.prefill_s_per_token / base.prefill_s_per_token
    assert profile.decode_s_per_seq / base.decode_s_per_seq == pytest.approx(ratio)  # one factor for all three
    assert "3,065 output tok/s at 64 streams of 1024+128 tokens" in how


def test_the_measured_tier_takes_the_card_and_its_price_the_other_stays_simulated() -> None:
    deployments = default_deployments(time_scale=1.0)
    data = file(entry("llama8b-bf16-eager", SWEEP, enforce_eager=True), entry("llama-3.1-8b-calibration", CALIBRATION),
                entry("llama8b-fp8", SWEEP, quantization="fp8"))
    assert [e.name for e in candidates(data, "llama-3.1-8b")] == ["llama-3.1-8b-calibration", "llama8b-bf16-eager"]
    (small, large), labels = apply_throughput(deployments, data)
    assert small.gpu_type == CARD and small.usd_per_gpu_hour == 4.00 and small.gpus_per_replica == 1
    assert small.profile.prefill_s_per_token == pytest.approx(PREFILL)
    assert labels["small"].startswith("measured (llama-3.1-8b-calibration: llama-3.1-8b bfloat16, TP1, 1x NVIDIA H100")
    assert "vLLM 0.26.0" in labels["small"] and "$4.00/GPU-hour" in labels["small"]
    assert large == deployments[1]
    assert labels["large"] == "simulated (profile bench-70b-tp4)"


def test_measured_gpu_seconds_follow_the_measured_constants() -> None:
    (small, _), _ = apply_throughput(default_deployments(time_scale=1.0), file(entry("cal", CALIBRATION)))
    engine = SimEngine(profile=small.profile)
    engine.counters = EngineCounters(prompt_tokens=30_000, prefix_hits=10_000, generation_tokens=8_000)
    fleet = RunningFleet(deployments=(small,), fleets={"small": SimFleet(urls=[], engines=[engine], model=small.model)})
    expected = 20_000 * PREFILL + 8_000 * (SLOPE + OVERHEAD / 128)
    assert fleet.work_seconds()["small"] == pytest.approx(expected)
    assert fleet.dollars()["small"] == pytest.approx(expected * 4.00 / 3600)


def test_a_card_without_a_known_price_needs_one() -> None:
    data = file(entry("cal", CALIBRATION, card="Some New Accelerator"))
    with pytest.raises(ValueError, match="--usd-per-gpu-hour"):
        apply_throughput(default_deployments(time_scale=1.0), data)
    (small, _), labels = apply_throughput(default_deployments(time_scale=1.0), data, usd_per_gpu_hour=3.0)
    assert small.usd_per_gpu_hour == 3.0 and "$3.00/GPU-hour" in labels["small"]


def test_prices_by_card_name_and_files_round_trip(tmp_path: Path) -> None:
    assert gpu_price("NVIDIA H100 80GB HBM3") == 4.00
    assert gpu_price("NVIDIA H200") == 5.00
    assert gpu_price("NVIDIA L4") == 0.80
    assert gpu_price("cpu") is None
    path = tmp_path / "throughput.json"
    path.write_text(file(entry("cal", CALIBRATION)).to_json())
    assert load(path).entries[0].points == CALIBRATION
