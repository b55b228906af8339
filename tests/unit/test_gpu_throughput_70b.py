"""The compiled 70B fp8 TP2 of the GPU tier in the cost report: its sweep record (load levels and calibration
probe) becomes a throughput entry from which `fleetgate bench cost --tier-entry large=llama70b-fp8-tp2` fits
the large tier's step times on two GPUs; without the probe (an earlier call's record) it scales instead; and the
whole configuration is planned to fit one device call."""

from __future__ import annotations

from typing import Any

import pytest

from fleetgate.bench.cost_fleet import default_deployments
from fleetgate.bench.cost_measured import apply_throughput, fitted_constants
from fleetgate.bench.gpu.load import CALIBRATION_BATCHES, CALIBRATION_LENGTHS
from fleetgate.bench.gpu.matrix import gpu_matrix
from fleetgate.bench.gpu.report import throughput_file
from fleetgate.bench.gpu.schedule import Estimator
from fleetgate.bench.tier_entry import parse_tier_entries
from fleetgate.operator.profiles import Profiles

CARD = "NVIDIA H100 80GB HBM3"
PREFILL, INTERCEPT, OVERHEAD, SLOPE = 8e-5, 0.03, 0.022, 1.5e-4  # the engine the records below describe


def _level(probe: str | None, concurrency: int, requests: int, prompt: int, output: int, **figures: Any) -> dict:
    level = {"concurrency": concurrency, "requests": requests, "ok": requests, "prompt_tokens": prompt,
             "output_tokens": output * requests, "duration_s": 1.0, "output_tokens_per_s": 0.0,
             "ttft_p50_s": None, "ttft_p90_s": None, "error": None, "tpot_p50_s": None, **figures}  # fmt: skip
    return level if probe is None else {"probe": probe, **level}


LEVELS = [_level(None, 1, 3, 1024, 128, output_tokens_per_s=30.0, ttft_p50_s=0.11),
          _level(None, 16, 32, 1024, 128, output_tokens_per_s=420.0, ttft_p50_s=0.5),
          _level(None, 64, 128, 1024, 128, output_tokens_per_s=1250.0, ttft_p50_s=1.1)]  # fmt: skip
PROBE = ([_level("ttft", 1, 3, n, 1, ttft_p50_s=INTERCEPT + PREFILL * n) for n in CALIBRATION_LENGTHS]
         + [_level("decode", b, 3 * b, 64, 32, tpot_p50_s=OVERHEAD + SLOPE * b) for b in CALIBRATION_BATCHES])


def _file(record: dict[str, Any]) -> Any:
    configs = [c for c in gpu_matrix(path=lambda s: f"/models/{s}", accelerator="nvidia-h100-80gb")
               if c.name == "llama70b-fp8-tp2"]
    return throughput_file(configs=configs, results={"llama70b-fp8-tp2": record}, card=CARD, vllm_version="0.26.0",
                           command="device_run.py --only llama70b-fp8-tp2", profiles=Profiles())  # fmt: skip


def test_the_sweep_record_with_its_probe_fits_the_large_tier_on_two_gpus() -> None:
    data = _file({"status": "served", "bench": LEVELS, "calibration": PROBE})
    (entry,) = data.entries
    assert (entry.quantization, entry.tensor_parallel_size, entry.gpus, entry.enforce_eager) == ("fp8", 2, 2, False)
    assert len(entry.points) == 3 + 6
    assert fitted_constants(entry) == (pytest.approx(PREFILL), pytest.approx(OVERHEAD), pytest.approx(SLOPE))
    selectors = parse_tier_entries(["large=llama70b-fp8-tp2"], tiers=["small", "large"])
    (_, large), labels = apply_throughput(default_deployments(time_scale=1.0), data, tier_entries=selectors)
    assert large.gpus_per_replica == 2 and large.profile.decode_s_per_seq == pytest.approx(SLOPE)
    assert "fitted: prefill 12,500 tok/s, TPOT 22.0 ms + 0.150 ms x batch" in labels["large"]


def test_a_record_without_the_probe_or_with_a_failed_level_falls_back_to_scaling() -> None:
    failed = [dict(lv, ok=lv["requests"] - 1) if lv["probe"] == "decode" and lv["concurrency"] < 64 else lv
              for lv in PROBE]  # only one decode batch left (64 streams, as the busiest level): no slope
    for record in ({"status": "served", "bench": LEVELS}, {"status": "served", "bench": LEVELS, "calibration": failed}):
        data = _file(record)
        assert fitted_constants(data.entries[0]) is None
        selectors = parse_tier_entries(["large=llama-3.1-70b/fp8/tp2"], tiers=["small", "large"])
        (_, large), labels = apply_throughput(default_deployments(time_scale=1.0), data, tier_entries=selectors)
        assert large.gpus_per_replica == 2
        assert "scaled x" in labels["large"]
        assert "1,250 output tok/s at 64 streams of 1024+128 tokens" in labels["large"]


def test_the_compiled_70b_with_its_probe_is_planned_to_fit_one_device_call() -> None:
    """device_run.py --deadline-s 400 leaves the sweep ~370 s; the 70B's estimate must fit it from a cold start."""
    (config,) = [c for c in gpu_matrix(path=lambda s: f"/models/{s}", accelerator="nvidia-h100-80gb")
                 if c.name == "llama70b-fp8-tp2"]
    assert config.calibrate and config.compiled and config.gpus == 2 and config.levels == (1, 16, 64)
    assert Estimator().seconds(config) < 340
