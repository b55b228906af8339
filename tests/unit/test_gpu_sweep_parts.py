"""The sweep's preflight beside the engines and its merge with an earlier call, without vLLM.

The first H100 call spent 119 s of 500 in vLLM's config check before any engine started; the preflight now
runs in a thread while the GPUs work, only on what needs it, and holds nothing back. A later call reports
over both calls: the earlier records keep vLLM's figures and are compared with the current plan.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from fleetgate.bench.gpu.matrix import SweepConfig, gpu_matrix
from fleetgate.bench.gpu.merge import load_previous, merge
from fleetgate.bench.gpu.sweep import Preflight, preflight_configs
from fleetgate.operator.profiles import Profiles

CALL1 = Path(__file__).resolve().parents[2] / "docs" / "reports" / "data" / "gpu-h100-call1.jsonl"


def _matrix() -> list[SweepConfig]:
    return gpu_matrix(path=lambda s: f"/models/{s}", accelerator="nvidia-h100-80gb")


def test_preflight_checks_only_what_the_operator_refuses_at_vllms_config_stage() -> None:
    configs = _matrix()
    assert [c.name for c in preflight_configs(configs, "refusals")] == ["refused-maxnumseqs", "refused-tp3-qwen"]
    assert preflight_configs(configs, "off") == [] and len(preflight_configs(configs, "all")) == len(configs)


def test_preflight_runs_beside_the_caller_and_answers_within_its_wait() -> None:
    configs = preflight_configs(_matrix(), "refusals")

    def slow(*, configs: list[SweepConfig], **_: Any) -> dict[str, dict[str, Any]]:
        time.sleep(0.5)
        return {c.name: {"ok": False} for c in configs}

    start = time.monotonic()
    check = Preflight(configs=configs, run=slow)
    assert time.monotonic() - start < 0.2  # the caller goes on at once (the GPUs start engines)
    assert check.checks("refused-maxnumseqs") and not check.checks("llama8b-bf16")
    assert check.verdicts(0.05) == {}  # not done yet: nothing, and no wait beyond what was allowed
    assert set(check.verdicts(5.0)) == {"refused-maxnumseqs", "refused-tp3-qwen"}
    assert Preflight(configs=[], run=slow).verdicts(0.0) == {}  # nothing to check: no thread


def test_merge_takes_what_ran_here_and_the_earlier_call_for_the_rest() -> None:
    configs = _matrix()
    header, previous = load_previous(CALL1)
    current = {
        "llama8b-lora-eager": {"name": "llama8b-lora-eager", "status": "served"},
        "gemma3-12b-eager": {"name": "gemma3-12b-eager", "status": "not_run", "reason": "deadline"},
        "llama8b-draft-eager": {"name": "llama8b-draft-eager", "status": "not_run", "reason": "deadline"},
    }
    merged = merge(configs=configs, current=current, previous=previous, previous_call=header["started_at"],
                   profiles=Profiles())  # fmt: skip
    assert merged["llama8b-lora-eager"] == current["llama8b-lora-eager"]  # ran here: this call's record
    assert merged["gemma3-12b-eager"]["status"] == "not_run"  # the earlier call did not run it either
    draft = merged["llama8b-draft-eager"]  # not run here: the first call's, compared with today's plan
    assert draft["call"] == "2026-11-27T15:19:22+00:00" and draft["status"] == "served" and draft["plan_recomputed"]
    assert abs(draft["comparison"]["kv_tokens"]["error_pct"]) < 1.0  # it was +14.75% with the first plan
    assert previous["llama8b-draft-eager"]["comparison"]["kv_tokens"]["error_pct"] == 14.75
    assert list(merged)[:3] == ["refused-maxnumseqs", "refused-lora-vocab", "refused-tp3-qwen"]  # matrix order
