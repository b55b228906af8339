"""The measured-throughput file: engine throughput and time to first token per configuration and card.

Written by the GPU tier (`fleetgate bench engine --gpu`, `pytest -m gpu`) as `throughput.json`, read by
the cost report to price GPU replicas from measured figures instead of assumed ones. One file holds one
sweep on one machine. Schema `fleetgate.measured-throughput/v1` (JSON):

    {"schema": "fleetgate.measured-throughput/v1",
     "measured_at": "2026-11-27T14:05:00Z",      # UTC, ISO 8601
     "command": "...",                            # what produced it
     "vllm_version": "0.26.0",
     "entries": [{
        "name": "llama8b-fp8-kvfp8",             # the sweep configuration
        "model_shape": "llama-3.1-8b",           # the architecture (models/<shape>.json)
        "parameters": 9127071744,                 # of that config.json (vocabulary 262,144)
        "dtype": "bfloat16",                      # activations / unquantized weights
        "quantization": "fp8",                    # "none", "fp8", "awq_marlin", "gptq_marlin", ...
        "kv_cache_dtype": "fp8",                  # "auto" = the model dtype
        "card": "NVIDIA H100 80GB HBM3",          # nvidia-smi's name (or "cpu")
        "gpus": 1, "tensor_parallel_size": 1,
        "enforce_eager": false,                   # true: no CUDA graphs (not production speed)
        "speculative": null,                      # e.g. "ngram/4", "draft_model/4"
        "max_num_seqs": 1024, "max_num_batched_tokens": 8192,   # as the engine ran
        "points": [{"concurrency": 16, "requests": 32, "prompt_tokens": 1024, "output_tokens": 128,
                    "output_tokens_per_s": 2100.5, "ttft_p50_s": 0.11, "ttft_p90_s": 0.19}]
     }]}

`output_tokens` is per request (answers are exactly that long: `ignore_eos`); `output_tokens_per_s` is
every request's output over the level's wall time (all streams together). Readers should match on
(model_shape, quantization, kv_cache_dtype, card, gpus) and prefer entries with `enforce_eager` false.
`load` validates a file and `best_point` picks the figure for a concurrency.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

SCHEMA = "fleetgate.measured-throughput/v1"


class ThroughputFileError(ValueError):
    """The file is not a measured-throughput file of a known schema."""


@dataclass(frozen=True, kw_only=True, slots=True)
class ThroughputPoint:
    concurrency: int
    requests: int
    prompt_tokens: int
    output_tokens: int
    output_tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p90_s: float | None


@dataclass(frozen=True, kw_only=True, slots=True)
class ThroughputEntry:
    name: str
    model_shape: str
    parameters: int
    dtype: str
    quantization: str
    kv_cache_dtype: str
    card: str
    gpus: int
    tensor_parallel_size: int
    enforce_eager: bool
    speculative: str | None
    max_num_seqs: int
    max_num_batched_tokens: int
    points: tuple[ThroughputPoint, ...] = ()


@dataclass(frozen=True, kw_only=True, slots=True)
class ThroughputFile:
    measured_at: str
    command: str
    vllm_version: str
    entries: tuple[ThroughputEntry, ...] = field(default_factory=tuple)
    schema: str = SCHEMA

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    def matching(self, *, model_shape: str, quantization: str, kv_cache_dtype: str, card: str) -> list[ThroughputEntry]:
        return [e for e in self.entries if (e.model_shape, e.quantization, e.kv_cache_dtype, e.card)
                == (model_shape, quantization, kv_cache_dtype, card)]  # fmt: skip


def best_point(entry: ThroughputEntry, *, concurrency: int) -> ThroughputPoint | None:
    """The point measured at the highest concurrency not above `concurrency` (None if all are above)."""
    below = [p for p in entry.points if p.concurrency <= concurrency]
    return max(below, key=lambda p: p.concurrency) if below else None


def _fields(cls: type, data: Any, where: str) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise ThroughputFileError(f"{where}: expected an object")
    names = set(cls.__dataclass_fields__)  # type: ignore[attr-defined]
    unknown = set(data) - names
    if unknown:
        raise ThroughputFileError(f"{where}: unknown field(s) {sorted(unknown)}")
    return data


def parse(data: Any) -> ThroughputFile:
    top = _fields(ThroughputFile, data, "file")
    if top.get("schema") != SCHEMA:
        raise ThroughputFileError(f"file: schema {top.get('schema')!r} is not {SCHEMA!r}")
    entries = []
    for i, raw in enumerate(top.get("entries") or []):
        entry = dict(_fields(ThroughputEntry, raw, f"entries[{i}]"))
        raw_points = entry.pop("points", [])
        points = tuple(ThroughputPoint(**_fields(ThroughputPoint, p, f"entries[{i}].points")) for p in raw_points)
        try:
            entries.append(ThroughputEntry(**entry, points=points))
        except TypeError as exc:
            raise ThroughputFileError(f"entries[{i}]: {exc}") from None
    try:
        return ThroughputFile(measured_at=top["measured_at"], command=top["command"], vllm_version=top["vllm_version"],
                              entries=tuple(entries))  # fmt: skip
    except KeyError as exc:
        raise ThroughputFileError(f"file: missing {exc}") from None


def load(path: Path) -> ThroughputFile:
    try:
        return parse(json.loads(path.read_text()))
    except json.JSONDecodeError as exc:
        raise ThroughputFileError(f"{path}: not JSON: {exc}") from None
