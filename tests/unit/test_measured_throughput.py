"""The measured-throughput file the GPU tier writes for the cost report: schema, validation, lookup."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetgate.bench.measured_throughput import (
    SCHEMA,
    ThroughputEntry,
    ThroughputFile,
    ThroughputFileError,
    ThroughputPoint,
    best_point,
    load,
    parse,
)


def _entry(**over: object) -> ThroughputEntry:
    points = (ThroughputPoint(concurrency=1, requests=3, prompt_tokens=1024, output_tokens=128,
                              output_tokens_per_s=150.0, ttft_p50_s=0.03, ttft_p90_s=0.04),
              ThroughputPoint(concurrency=64, requests=128, prompt_tokens=1024, output_tokens=128,
                              output_tokens_per_s=3000.0, ttft_p50_s=0.9, ttft_p90_s=1.6))  # fmt: skip
    fields = {"name": "llama8b-fp8-kvfp8", "model_shape": "llama-3.1-8b", "parameters": 9_127_071_744,
              "dtype": "bfloat16", "quantization": "fp8", "kv_cache_dtype": "fp8", "card": "NVIDIA H100 80GB HBM3",
              "gpus": 1, "tensor_parallel_size": 1, "enforce_eager": False, "speculative": None,
              "max_num_seqs": 1024, "max_num_batched_tokens": 8192, "points": points, **over}  # fmt: skip
    return ThroughputEntry(**fields)  # type: ignore[arg-type]


def test_round_trip_through_a_file(tmp_path: Path) -> None:
    written = ThroughputFile(measured_at="2026-11-27T14:00:00Z", command="pytest -m gpu", vllm_version="0.26.0",
                             entries=(_entry(),))  # fmt: skip
    path = tmp_path / "throughput.json"
    path.write_text(written.to_json())
    assert json.loads(path.read_text())["schema"] == SCHEMA
    assert load(path) == written
    assert written.matching(model_shape="llama-3.1-8b", quantization="fp8", kv_cache_dtype="fp8",
                            card="NVIDIA H100 80GB HBM3") == [written.entries[0]]  # fmt: skip
    assert written.matching(model_shape="llama-3.1-8b", quantization="none", kv_cache_dtype="auto", card="x") == []


def test_best_point_is_the_highest_concurrency_not_above() -> None:
    entry = _entry()
    assert best_point(entry, concurrency=16) == entry.points[0]
    assert best_point(entry, concurrency=64) == entry.points[1]
    assert best_point(_entry(points=()), concurrency=8) is None


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(schema="fleetgate.measured-throughput/v0"), "schema"),
        (lambda d: d["entries"][0].update(colour="blue"), "unknown field"),
        (lambda d: d["entries"][0].pop("card"), "entries\\[0\\]"),
        (lambda d: d.pop("command"), "missing"),
        (lambda d: d["entries"][0]["points"][0].update(latency=1), "unknown field"),
    ],
)
def test_malformed_files_are_refused_with_the_place(mutate: object, message: str) -> None:
    data = json.loads(ThroughputFile(measured_at="t", command="c", vllm_version="v", entries=(_entry(),)).to_json())
    mutate(data)  # type: ignore[operator]
    with pytest.raises(ThroughputFileError, match=message):
        parse(data)


def test_not_json(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text("{nope")
    with pytest.raises(ThroughputFileError, match="not JSON"):
        load(path)
