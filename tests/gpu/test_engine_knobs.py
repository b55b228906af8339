"""Each engine knob starts and serves on real vLLM, or is refused by validation; the plan matches vLLM's log.

One record per configuration of the sweep (tests/gpu/conftest.py). A configuration the sweep had no time
for is skipped with that reason, never counted as passed. The plan is also checked against the logs of an
earlier call merged in (FLEETGATE_GPU_MERGE): those records keep vLLM's figures and get today's plan.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetgate.bench.cost_measured import fitted_constants
from fleetgate.bench.gpu.compare import TOLERANCE_PCT
from fleetgate.bench.gpu.load import CALIBRATION_BATCHES, CALIBRATION_LENGTHS
from fleetgate.bench.gpu.sweep import SweepOutcome
from fleetgate.bench.gpu.tier import gemma_dir, matrix_configs, planned_configs
from fleetgate.bench.measured_throughput import load
from fleetgate.local.model_prep import model_dir

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(1200)]

CONFIGS = {c.name: c for c in planned_configs(gemma=gemma_dir(prepared=model_dir()))}
SERVING = [n for n, c in CONFIGS.items() if c.expect == "serve"]
REFUSED = [n for n, c in CONFIGS.items() if c.expect == "invalid"]
EVERY_SERVING = [c.name for c in matrix_configs(gemma=gemma_dir(prepared=model_dir())) if c.expect == "serve"]


def _record(sweep: SweepOutcome, name: str) -> dict[str, Any]:
    record = sweep.results.get(name)
    if record is None:
        pytest.skip(f"{name}: not part of this sweep")
    if record.get("status") == "not_run":
        pytest.skip(f"{name}: not run: {record.get('reason')}")
    return record


@pytest.mark.parametrize("name", SERVING)
def test_knob_starts_and_serves(sweep: SweepOutcome, name: str) -> None:
    record = _record(sweep, name)
    why = record.get("failure") or record.get("invalid_message") or record.get("preflight")
    assert record["status"] == "served", f"{name}: {record['status']}: {why}"
    assert record["serve"] == {"http": 200, "completion_tokens": 8}
    if CONFIGS[name].lora_rank is not None:
        assert record["lora"]["ok"], record["lora"]
    if CONFIGS[name].sense_check:
        assert record["sense"]["ok"], record["sense"]
    for level in record.get("bench", []):
        assert level["ok"] == level["requests"] > 0, level
        assert level["output_tokens_per_s"] > 0
    if CONFIGS[name].calibrate:  # the cost report fits the large tier's step times from these
        probe = record.get("calibration") or []
        expected = ["ttft"] * len(CALIBRATION_LENGTHS) + ["decode"] * len(CALIBRATION_BATCHES)
        assert [lv["probe"] for lv in probe] == expected, probe
        assert all(lv["ok"] == lv["requests"] > 0 for lv in probe), probe


@pytest.mark.parametrize("name", REFUSED)
def test_refused_by_validation_as_vllm_would(sweep: SweepOutcome, name: str) -> None:
    """The operator refuses the spec with an Invalid status; where vLLM refuses it in its config check, the
    preflight shows vLLM refusing the arguments the operator would have rendered. (Refusals vLLM makes only
    while loading the model, `refused_at="start"`, are shown by the engine logs in docs/reports/gpu-h100.md.)"""
    record = _record(sweep, name)
    assert record["status"] == "invalid", record
    assert record["operator_phase"] == "Invalid"
    if CONFIGS[name].refused_at != "config":
        return
    verdict = record.get("preflight")
    if verdict is None:
        pytest.skip(f"{name}: refused by validation; vLLM's own verdict was not obtained (preflight off or timed out)")
    assert not verdict["ok"], f"vLLM accepts what the operator refuses: {record['invalid_message']}"


@pytest.mark.parametrize("name", EVERY_SERVING)
def test_plan_within_tolerance(sweep: SweepOutcome, name: str) -> None:
    record = (sweep.merged or sweep.results).get(name)
    if record is None or record.get("status") == "not_run":
        pytest.skip(f"{name}: not measured in this call or a merged one")
    if not record.get("vllm_log"):
        pytest.skip(f"{name}: vLLM logged no capacity figures ({record.get('status')})")
    within = record.get("within_5pct")
    if not within:
        pytest.skip(f"{name}: no capacity plan or no KV figures in vLLM's log")
    misses = {k: record["comparison"][k] for k, ok in within.items() if not ok}
    assert not misses, f"{name}: plan vs vLLM beyond {TOLERANCE_PCT}%: {misses}"


def test_throughput_file_holds_every_measured_configuration(sweep: SweepOutcome) -> None:
    # The file covers this call and the calls merged into it (--merge), as the summary does.
    records = sweep.merged or sweep.results
    measured = {n for n, r in records.items() if r.get("status") == "served" and r.get("bench")}
    if not measured:
        pytest.skip("no configuration was measured")
    data = load(sweep.out / "throughput.json")
    assert {e.name for e in data.entries} == measured
    for entry in data.entries:
        assert entry.points and all(p.output_tokens_per_s > 0 for p in entry.points)
        if entry.name in CONFIGS and CONFIGS[entry.name].calibrate and records[entry.name].get("calibration"):
            assert fitted_constants(entry) is not None, f"{entry.name}: the probe's points give no fit"


def test_real_gemma_answers_sensibly(sweep: SweepOutcome) -> None:
    if "gemma3-270m-real" not in CONFIGS:
        pytest.skip(
            "no real Gemma 3 270M in this sweep: its weights are not here (FLEETGATE_GEMMA_DIR, or "
            "`fleetgate prepare-model`) or it was not selected"
        )
    record = _record(sweep, "gemma3-270m-real")
    assert record["status"] == "served" and record["sense"]["ok"], record.get("sense") or record.get("failure")
