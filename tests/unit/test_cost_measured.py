"""`fleetgate bench cost --throughput`: tiers with a measured record run and are priced at the measured speed."""

from __future__ import annotations

import pytest

from fleetgate.bench.cost_fleet import RunningFleet, default_deployments
from fleetgate.bench.cost_measured import apply_throughput, gpu_price
from fleetgate.engine.throughput import ThroughputFile, ThroughputRecord
from fleetgate.sim.engine import EngineCounters, SimEngine
from fleetgate.sim.fleet import SimFleet


def record(**changes: object) -> ThroughputRecord:
    values: dict[str, object] = {"model": "llama-3.1-8b", "gpu": "nvidia-h100-80gb-hbm3", "engine": "vllm 0.26.0",
                                 "max_num_seqs": 128, "prefill_tokens_per_s": 20_000.0, "decode_tokens_per_s": 4_000.0,
                                 "step_overhead_s": 0.012}
    values.update(changes)
    return ThroughputRecord.model_validate(values)


def test_the_measured_tier_takes_the_records_constants_gpu_and_price_the_other_stays_simulated() -> None:
    deployments = default_deployments(time_scale=1.0)
    out, labels = apply_throughput(deployments, ThroughputFile(records=[record()]))
    small, large = out
    assert small.profile.prefill_s_per_token == pytest.approx(1 / 20_000)
    assert small.profile.step_overhead_s == 0.012 and small.profile.max_num_seqs == 128
    # TPOT at 128 sequences = 128 / 4000 = 32 ms = 12 ms + 128 x slope
    assert small.profile.decode_s_per_seq == pytest.approx((0.032 - 0.012) / 128)
    assert small.gpu_type == "nvidia-h100-80gb-hbm3" and small.usd_per_gpu_hour == 4.00
    assert labels["small"].startswith("measured (llama-3.1-8b bfloat16 on 1x nvidia-h100-80gb-hbm3")
    assert large == deployments[1]
    assert labels["large"] == "simulated (profile bench-70b-tp4)"


def test_measured_gpu_seconds_follow_the_record() -> None:
    deployments = default_deployments(time_scale=1.0)
    (small, _), _ = apply_throughput(deployments, ThroughputFile(records=[record()]))
    engine = SimEngine(profile=small.profile)
    engine.counters = EngineCounters(prompt_tokens=30_000, prefix_hits=10_000, generation_tokens=8_000)
    fleet = RunningFleet(deployments=(small,), fleets={"small": SimFleet(urls=[], engines=[engine], model=small.model)})
    # the cost model's per-output cost: decode slope + overhead / batch = 1 / decode_tokens_per_s
    expected = 20_000 / 20_000 + 8_000 / 4_000
    assert fleet.work_seconds()["small"] == pytest.approx(expected)
    assert record().gpu_seconds(uncached_prompt_tokens=20_000, output_tokens=8_000) == pytest.approx(expected)
    assert fleet.dollars()["small"] == pytest.approx(expected * 4.00 / 3600)


def test_a_card_without_a_known_price_needs_one() -> None:
    data = ThroughputFile(records=[record(gpu="some-new-accelerator")])
    with pytest.raises(ValueError, match="--usd-per-gpu-hour"):
        apply_throughput(default_deployments(time_scale=1.0), data)
    (small, _), labels = apply_throughput(default_deployments(time_scale=1.0), data, usd_per_gpu_hour=3.0)
    assert small.usd_per_gpu_hour == 3.0 and "$3.00/GPU-hour" in labels["small"]


def test_prices_by_card_name() -> None:
    assert gpu_price("NVIDIA H100 80GB HBM3") == 4.00
    assert gpu_price("nvidia-h200") == 5.00
    assert gpu_price("nvidia-l4") == 0.80
    assert gpu_price("tpu") is None
