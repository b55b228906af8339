"""`fleetgate up` serves a quantized checkpoint end to end: `engine.quantization: w8a8` prepares the int8
compressed-tensors model (once), vLLM CPU loads it, and the gateway answers a chat request with it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.real_engine

FLEETGATE = Path(sys.executable).with_name("fleetgate")


def test_up_check_answers_from_the_w8a8_model(tmp_path: Path) -> None:
    config = tmp_path / "up.yaml"
    config.write_text(f"engine:\n  quantization: w8a8\n  max_model_len: 512\n  log_dir: {tmp_path / 'logs'}\n")
    proc = subprocess.run(
        [str(FLEETGATE), "up", "--check", "--config", str(config), "--port", "0", "--engine-base-port", "0"],
        env={**os.environ, "PYTHONSAFEPATH": "1"}, cwd=tmp_path, capture_output=True, text=True, timeout=900,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    log = (tmp_path / "logs" / "engine-0.log").read_text(errors="replace")
    assert "gemma-3-270m-w8a8" in log and "CompressedTensorsW8A8Int8" in log, "not the quantized checkpoint"
    match = re.search(r"^A: (.+)$", proc.stdout, re.M)
    # int8 weights keep this answer (measured: greedy output "The capital of France is Paris.")
    assert match and "Paris" in match.group(1), proc.stdout
