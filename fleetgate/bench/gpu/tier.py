"""Where the GPU tier runs and what it runs there, read from the environment (tests/gpu and the device script).

- `FLEETGATE_GPU_TIER`: `cpu` runs the tier's mechanics on vLLM CPU (a two-layer model: the dry run of the
  device script), `off` skips it; unset: CUDA when nvidia-smi lists a GPU and vLLM is importable.
- `FLEETGATE_GPU_ONLY` / `FLEETGATE_GPU_SKIP`: comma-separated configuration names.
- `FLEETGATE_GPU_MERGE`: an earlier call's results.jsonl (read by tests/gpu/conftest.py).
- `FLEETGATE_GEMMA_DIR`: a real Gemma 3 270M directory whose answer is checked (tests/gpu defaults to the
  one `fleetgate prepare-model` made, when present).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

from fleetgate.bench.gpu.matrix import MatrixChoice, SweepConfig, cpu_matrix, gpu_matrix


def tier_device() -> tuple[str | None, str]:
    """("cuda" | "cpu", "") when the tier runs here, else (None, why not)."""
    wanted = os.environ.get("FLEETGATE_GPU_TIER", "")
    if wanted == "off":
        return None, "FLEETGATE_GPU_TIER=off"
    if importlib.util.find_spec("vllm") is None:
        return None, "vLLM is not installed"
    if wanted == "cpu":
        return "cpu", ""
    if shutil.which("nvidia-smi") is None:
        return None, "no CUDA GPU here (nvidia-smi not found); FLEETGATE_GPU_TIER=cpu runs its mechanics on vLLM CPU"
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False).stdout
    if "GPU" not in listed:
        return None, "nvidia-smi lists no GPU"
    return "cuda", ""


def gemma_dir(*, prepared: Path | None = None) -> Path | None:
    """A real Gemma 3 270M directory: `FLEETGATE_GEMMA_DIR`, else `prepared` (where `fleetgate prepare-model`
    puts it; the caller names it, this layer does not import the local stack) when its weights are there."""
    named = os.environ.get("FLEETGATE_GEMMA_DIR")
    if named:
        return Path(named)
    return prepared if prepared is not None and (prepared / "model.safetensors").exists() else None


def _names(text: str) -> frozenset[str]:
    return frozenset(n.strip() for n in text.split(",") if n.strip())


def choice_from_env() -> MatrixChoice:
    return MatrixChoice(only=_names(os.environ.get("FLEETGATE_GPU_ONLY", "")),
                        skip=_names(os.environ.get("FLEETGATE_GPU_SKIP", "")))  # fmt: skip


def matrix_configs(*, gemma: Path | None) -> list[SweepConfig]:
    """Every configuration of this device's matrix (for naming tests; model paths are placeholders)."""
    device, _ = tier_device()
    text = str(gemma) if gemma else None
    if device == "cpu":
        return cpu_matrix(path=lambda s: f"/{s}", gemma_dir=text)
    return gpu_matrix(path=lambda s: f"/{s}", accelerator="nvidia-h100-80gb", gemma_dir=text)


def planned_configs(*, gemma: Path | None) -> list[SweepConfig]:
    """The configurations the tier runs here (FLEETGATE_GPU_ONLY / _SKIP applied)."""
    return choice_from_env().select(matrix_configs(gemma=gemma))
