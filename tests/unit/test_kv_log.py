"""Parsing vLLM's start-up KV-capacity line (the format of vLLM 0.32's `update_kv_cache_capacity`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgate.local.kv_log import KvCapacity, read_kv_capacity, wait_for_kv_capacity

LINE = (
    "(EngineCore pid=1270) INFO 11-24 09:31:40 [kv_cache_utils.py:2327] CPU KV cache size: 163,271 tokens, "
    "Maximum concurrency for 4,096 tokens per request: 39.86x"
)


def test_reads_tokens_length_and_concurrency() -> None:
    text = "INFO loading weights\n" + LINE + "\nINFO kv cache group sizes (128, 128)\n"
    assert read_kv_capacity(text) == KvCapacity(device="CPU", tokens=163_271, max_model_len=4096, max_concurrency=39.86)


def test_no_line_yet_is_none() -> None:
    assert read_kv_capacity("INFO Loading weights took 2.44 seconds\n") is None


def test_wait_reports_a_dead_engine_instead_of_hanging(tmp_path: Path) -> None:
    log = tmp_path / "engine.log"
    log.write_text("Traceback: boom\n")
    with pytest.raises(RuntimeError, match="exited"):
        wait_for_kv_capacity(log_path=log, timeout_s=5, alive=lambda: False, poll_s=0.01)
    log.write_text(LINE)
    assert wait_for_kv_capacity(log_path=log, timeout_s=5, alive=lambda: False).tokens == 163_271
