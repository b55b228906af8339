"""The GPU tier (`pytest -m gpu`): every engine knob on real vLLM, and the capacity plan against its log.

It runs wherever vLLM and a CUDA GPU are present and skips with the reason elsewhere, as the envtest
tier does (`fleetgate.bench.gpu.tier` reads the environment: FLEETGATE_GPU_TIER=cpu runs its mechanics
on vLLM CPU). The whole tier is one sweep (`fleetgate.bench.gpu.sweep`, also `fleetgate bench engine
--gpu`), run once per session by the `sweep` fixture; each test reads its configuration's record, so no
engine starts twice. `FLEETGATE_GPU_OUT` names where the sweep writes results.jsonl, throughput.json,
summary.md and the engine logs (default: a pytest temporary directory); `FLEETGATE_GPU_DEADLINE_S`
(default 540) is its hard limit; `FLEETGATE_GPU_TOKENIZER_ARCHIVE` the packed Gemma tokenizer
(scripts/gpu/pack_tokenizer.py; default build/gpu/gemma3-tokenizer.tar.xz); `FLEETGATE_GPU_MERGE` an
earlier call's results.jsonl to report beside this one; `FLEETGATE_GPU_PREFLIGHT` refusals|all|off.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fleetgate.bench.gpu.sweep import SweepOptions, SweepOutcome, run_sweep
from fleetgate.bench.gpu.tier import choice_from_env, gemma_dir, tier_device
from fleetgate.local.model_prep import model_dir

REPO = Path(__file__).resolve().parents[2]


def real_gemma() -> Path | None:
    """The real Gemma 3 270M: FLEETGATE_GEMMA_DIR, else the directory `fleetgate prepare-model` made."""
    return gemma_dir(prepared=model_dir())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    device, reason = tier_device()
    if device is not None:
        return
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(pytest.mark.skip(reason=f"GPU tier: {reason}"))


@pytest.fixture(scope="session")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> SweepOutcome:
    device, reason = tier_device()
    if device is None:
        pytest.skip(f"GPU tier: {reason}")
    out = Path(os.environ.get("FLEETGATE_GPU_OUT") or tmp_path_factory.mktemp("gpu-tier"))
    archive = os.environ.get("FLEETGATE_GPU_TOKENIZER_ARCHIVE") or str(REPO / "build/gpu/gemma3-tokenizer.tar.xz")
    options = SweepOptions(
        out=out, deadline_s=float(os.environ.get("FLEETGATE_GPU_DEADLINE_S", "540")), device=device,
        tokenizer_archive=Path(archive), gemma_dir=real_gemma(), choice=choice_from_env(),
        command="pytest -m gpu tests/gpu", preflight=os.environ.get("FLEETGATE_GPU_PREFLIGHT") or "refusals",
        merge=Path(os.environ["FLEETGATE_GPU_MERGE"]) if os.environ.get("FLEETGATE_GPU_MERGE") else None,
    )  # fmt: skip
    return run_sweep(options)
