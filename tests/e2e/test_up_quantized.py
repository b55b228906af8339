"""`fleetgate up` serves a quantized checkpoint end to end: `engine.quantization: gguf-e4` prepares the model
with the 4-bit tied embedding built from the GGUF's blocks (once), vLLM CPU loads it through FleetGate's
plugin (`--quantization fleetgate-ct`), and the gateway answers a chat request with it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fleetgate.local.vllm_weights import WEIGHT_BYTES_ENV, parse_weight_bytes

pytestmark = pytest.mark.real_engine

FLEETGATE = Path(sys.executable).with_name("fleetgate")
# Gemma 3 270M's embedding: 262,144 x 640 values, 2 bytes each in bf16.
BF16_EMBEDDING_BYTES = 262_144 * 640 * 2
BF16_MODEL_PARAM_BYTES = 268_000_000 * 2  # all of Gemma 3 270M's parameters in bf16


def test_up_check_answers_from_the_4bit_embedding_model(tmp_path: Path) -> None:
    config = tmp_path / "up.yaml"
    config.write_text(
        f"engine:\n  quantization: gguf-e4\n  max_model_len: 512\n  log_dir: {tmp_path / 'logs'}\n"
        f"  env: {{{WEIGHT_BYTES_ENV}: '1'}}\n"
    )
    proc = subprocess.run(
        [str(FLEETGATE), "up", "--check", "--config", str(config), "--port", "0", "--engine-base-port", "0"],
        env={**os.environ, "PYTHONSAFEPATH": "1"}, cwd=tmp_path, capture_output=True, text=True, timeout=1200,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = (tmp_path / "logs" / "engine-0.log").read_text(errors="replace")
    assert "gemma-3-270m-gguf-e4" in log and "'quantization': 'fleetgate-ct'" in log, "not the plugin's checkpoint"
    reported = parse_weight_bytes(log)
    assert reported is not None, "the plugin did not report the loaded weights"
    layout = re.search(r"tied embedding of 4-bit values held as (\w+)", log)
    assert layout, "the plugin did not say which layout serves the embedding"
    if layout.group(1) == "wna16":
        # the tensors the engine holds are less than the bf16 embedding alone: it is not kept in 16 bits
        assert reported[0] < BF16_EMBEDDING_BYTES, reported
    else:  # an AVX2-only CPU: vLLM's build there has no WNA16 GEMM, the 4-bit values are held as int8 slices
        assert layout.group(1) == "int8", layout.group(0)
        # less than the model's parameters in bf16 (268M; the engine holds ~570 MB with a bf16 embedding, 412 MB so)
        assert reported[0] < BF16_MODEL_PARAM_BYTES, reported
    match = re.search(r"^A: (.+)$", proc.stdout, re.M)
    # bf16 answers "The capital of France is Paris."; the 4-bit embedding keeps it
    assert match and "Paris" in match.group(1), proc.stdout
