"""`fleetgate up --embedder engine --check`: the semantic cache's encoder as a real vLLM CPU pooling engine
(all-MiniLM-L6-v2, float32), end to end. The LLM engine is simulated, so this test runs one real engine: a
question is stored, its paraphrase is served as a semantic hit that the engine's vectors decided, the gateway's
metrics show the engine answered with no lookup going on without it, and no engine process survives."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from .test_up_check import _processes_with

pytestmark = pytest.mark.real_engine

FLEETGATE = Path(sys.executable).with_name("fleetgate")


def test_up_with_the_encoder_engine_serves_a_paraphrase_from_the_cache(tmp_path: Path) -> None:
    config = tmp_path / "up.yaml"
    config.write_text(f"engine:\n  kind: sim\nencoder:\n  log_dir: {tmp_path / 'logs'}\n")
    marker = f"fleetgate-test-{uuid.uuid4().hex}"
    env = {**os.environ, "PYTHONSAFEPATH": "1", "FLEETGATE_TEST_MARKER": marker}
    proc = subprocess.run(
        [str(FLEETGATE), "up", "--check", "--embedder", "engine", "--config", str(config), "--port", "0",
         "--engine-base-port", "0"],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "-> hit-semantic; similarity=" in proc.stdout, proc.stdout
    assert re.search(r"encoder engine: [1-9]\d* requests answered, 0 lookups without it", proc.stdout), proc.stdout
    assert "cache encoder:   http://127.0.0.1:" in proc.stderr
    log = (tmp_path / "logs" / "encoder.log").read_text()
    assert "dtype=torch.float32" in log and "pooling_type=MEAN(source=sentence_transformers)" in log
    deadline = time.monotonic() + 10
    while (left := _processes_with(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"processes survived `fleetgate up --check --embedder engine`: {left}"
