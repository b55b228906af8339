"""`fleetgate cache-eval` end to end on tiny hand-written sets (hashing embedder, no model files, no ../shared)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetgate.cli import main

PAIRS = [
    {"id": "p1", "a": "How do I rename a git branch?", "b": "how do i renmae a git branch", "same": True,
     "kind": "typo"},
    {"id": "p2", "a": "How do I enable dark mode?", "b": "How do I disable dark mode?", "same": False,
     "kind": "negation"},
    {"id": "p3", "a": "What is 15% of 80?", "b": "What is 25% of 80?", "same": False, "kind": "number"},
]
CONVERSATIONS = [
    {"id": "c1", "same": False, "kind": "context",
     "conv_a": [{"role": "user", "content": "I use Windows."}, {"role": "assistant", "content": "Noted."},
                {"role": "user", "content": "How do I take a screenshot?"}],
     "conv_b": [{"role": "user", "content": "I use macOS."}, {"role": "assistant", "content": "Noted."},
                {"role": "user", "content": "How do I take a screenshot?"}]},
]


def _write(folder: Path, suffix: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for kind, rows in (("pairs", PAIRS), ("conversations", CONVERSATIONS)):
        (folder / f"cache_{kind}.{suffix}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


def test_three_columns_with_the_frozen_set_absent_then_present(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    dev = _write(tmp_path / "dev", "dev")
    args = ["cache-eval", "--embedder", "hashing", "--entries", "0", "--data", str(dev), "--sweep", "0.5",
            "--confidences", "0.9"]
    assert main([*args, "--frozen", str(tmp_path / "missing")]) == 0
    out = capsys.readouterr().out
    assert "frozen  n/a" in out and "dev     100.0% / 100.0% (1/1 hits, 1 true)" in out
    assert "cv " in out and "cross-tenant hits: dev 0/3" in out

    frozen = _write(tmp_path / "frozen", "frozen")
    assert main([*args, "--frozen", str(frozen)]) == 0
    out = capsys.readouterr().out
    assert "frozen  100.0% / 100.0% (1/1 hits, 1 true)" in out and "frozen sweep, similarity threshold" in out
    assert "cross-tenant hits: dev 0/3, frozen 0/3" in out
    assert "frozen (in-sample: used for development and training)" in out


def test_one_column_per_frozen_set_found_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dev = _write(tmp_path / "dev", "dev")
    folder = tmp_path / "frozen"
    for name in ("frozen", "frozen2", "frozen3", "frozen4", "frozen5", "frozen9"):  # frozen9: made up, held out
        _write(folder, name)
    assert main(["cache-eval", "--embedder", "hashing", "--entries", "0", "--data", str(dev), "--sweep", "0.5",
                 "--confidences", "0.9", "--frozen", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "frozen9 100.0% / 100.0% (1/1 hits, 1 true)" in out and "frozen9 sweep, similarity threshold" in out
    assert "frozen5 (in-sample: used for development and training)" in out and "frozen9 (held out)" in out
    assert ("cross-tenant hits: dev 0/3, frozen 0/3, frozen2 0/3, frozen3 0/3, frozen4 0/3, frozen5 0/3, "
            "frozen9 0/3") in out
    # a held-out set never trains or folds
    assert "cv: out-of-fold over dev + train + frozen + frozen2 + frozen3 + frozen4 + frozen5, folds" in out
    # one hit proves little: the precision's one-sided 95% lower bound is 5% (0.05 ** (1 / 1))
    assert "frozen9 100.0% / 100.0% (1/1 hits, 1 true), precision >=   5.0% (95% one-sided)" in out


def test_a_fit_threshold_without_fit_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dev = _write(tmp_path / "dev", "dev")
    for extra in ([], ["--fit"]):
        threshold = "0.95" if not extra else "1.5"
        assert main(["cache-eval", "--embedder", "hashing", "--entries", "0", "--data", str(dev),
                     "--fit-threshold", threshold, *extra]) == 2
        assert "--fit-threshold needs --fit" in capsys.readouterr().err


def test_missing_dev_data_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache-eval", "--embedder", "hashing", "--entries", "0", "--data", str(tmp_path)]) == 2
    assert "not found" in capsys.readouterr().err


def test_the_latency_section_reports_each_load_level(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dev = _write(tmp_path / "dev", "dev")
    assert main(["cache-eval", "--embedder", "hashing", "--entries", "20", "--queries", "2", "--loads", "0.5",
                 "--data", str(dev), "--frozen", str(tmp_path / "missing"), "--sweep", "0.5",
                 "--confidences", "0.9"]) == 0
    out = capsys.readouterr().out
    assert "lookup latency with 20 entries in one partition" in out and "static prefilter off" in out
    assert "  single stream  lookup p50" in out and "  50%            lookup p50" in out
    assert "encoded 2/2" in out  # no prefilter with the hashing embedder: every lookup encodes
    assert "encoder index: flat" in out and "stages (ms, p50 / p99, n): " in out
