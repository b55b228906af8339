"""Measured engine throughput: the file GPU runs write and `fleetgate bench cost --throughput` reads.

One record per measured replica kind (model shape, dtype, quantization, KV dtype, GPU, GPUs per replica,
engine version). It holds what a cost model needs, in the same terms as the simulator's step-time model
(`fleetgate.sim.profile`), so a measured record can replace a simulated profile's constants:

- `prefill_tokens_per_s`: uncached prompt tokens one replica prefills per second (1 / `prefill_s_per_token`);
- `decode_tokens_per_s`: tokens one replica generates per second with `max_num_seqs` sequences decoding
  (`max_num_seqs / TPOT(max_num_seqs)`);
- `step_overhead_s`: the fixed part of a decode step (the intercept of TPOT against batch size).

With `TPOT(B) = step_overhead_s + decode_s_per_seq x B`, a replica's busy seconds for a workload are
`uncached_prompt_tokens / prefill_tokens_per_s + output_tokens / decode_tokens_per_s` at full batch, and
its GPU-seconds that times `gpus_per_replica`. `points` keeps the raw operating points the run measured
(tokens per second at each offered load), so anyone can check the constants against them or refit.

YAML or JSON (JSON is YAML), camelCase or snake_case keys:

    apiVersion: fleetgate.io/v1alpha1
    kind: ThroughputMeasurements
    records:
      - {model: llama-3.1-8b, dtype: bfloat16, gpu: nvidia-h100-80gb-hbm3, gpusPerReplica: 1,
         engine: vllm 0.26.0, maxNumSeqs: 128, prefillTokensPerS: 21000, decodeTokensPerS: 5200,
         stepOverheadS: 0.012, source: "scripts/gpu_routing_run.py on 2026-11-28", points: [...]}
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from fleetgate.core.config import load_model

API_VERSION: Literal["fleetgate.io/v1alpha1"] = "fleetgate.io/v1alpha1"
KIND: Literal["ThroughputMeasurements"] = "ThroughputMeasurements"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True, frozen=True)


class ThroughputPoint(_Model):
    """One measured operating point: engine counter deltas over a window at an offered load."""

    workload: str
    label: str = ""  # e.g. "round-robin @ 1.5x"
    seconds: float = Field(gt=0)
    replicas: int = Field(ge=1)
    offered_rps: float | None = None
    prompt_tokens: float = Field(ge=0)
    uncached_prompt_tokens: float = Field(ge=0)
    output_tokens: float = Field(ge=0)
    ttft_p50_s: float | None = None
    ttft_p90_s: float | None = None

    @property
    def output_tokens_per_s_per_replica(self) -> float:
        return self.output_tokens / self.seconds / self.replicas


class ThroughputRecord(_Model):
    model: str = Field(min_length=1, description="the model shape served, e.g. llama-3.1-8b")
    dtype: str = "bfloat16"
    quantization: str = "none"
    kv_cache_dtype: str = "auto"
    gpu: str = Field(min_length=1, description="the card as nvidia-smi names it, lower-case with dashes")
    gpus_per_replica: int = Field(default=1, ge=1)
    engine: str = ""
    max_num_seqs: int = Field(ge=1)
    prefill_tokens_per_s: float = Field(gt=0)
    decode_tokens_per_s: float = Field(gt=0)
    step_overhead_s: float = Field(ge=0)
    source: str = ""
    points: list[ThroughputPoint] = Field(default_factory=list)

    @property
    def prefill_s_per_token(self) -> float:
        return 1.0 / self.prefill_tokens_per_s

    @property
    def decode_s_per_seq(self) -> float:
        """The per-sequence slope of TPOT: (TPOT at full batch - overhead) / batch."""
        tpot_full = self.max_num_seqs / self.decode_tokens_per_s
        return max(1e-9, (tpot_full - self.step_overhead_s) / self.max_num_seqs)

    def gpu_seconds(self, *, uncached_prompt_tokens: float, output_tokens: float) -> float:
        """GPU-seconds of this work at full batch (see the module docstring)."""
        replica_s = uncached_prompt_tokens / self.prefill_tokens_per_s + output_tokens / self.decode_tokens_per_s
        return replica_s * self.gpus_per_replica

    def describe(self) -> str:
        quant = "" if self.quantization == "none" else f" {self.quantization}"
        engine = self.engine or "engine ?"
        return (f"{self.model} {self.dtype}{quant} on {self.gpus_per_replica}x {self.gpu} ({engine}): "
                f"prefill {self.prefill_tokens_per_s:,.0f} tok/s, decode {self.decode_tokens_per_s:,.0f} tok/s at "
                f"{self.max_num_seqs} sequences per replica")


class ThroughputFile(_Model):
    api_version: Literal["fleetgate.io/v1alpha1"] = API_VERSION
    kind: Literal["ThroughputMeasurements"] = KIND
    records: list[ThroughputRecord] = Field(min_length=1)

    def find(self, model: str, *, dtype: str | None = None, quantization: str | None = None
             ) -> ThroughputRecord | None:
        """The first record of `model` (and the dtype / quantization, when given); None when there is none."""
        for record in self.records:
            if record.model != model:
                continue
            if dtype is not None and record.dtype != dtype:
                continue
            if quantization is not None and record.quantization != quantization:
                continue
            return record
        return None


def load_throughput(path: str | Path) -> ThroughputFile:
    """Read and validate a throughput file (`fleetgate.core.errors.ConfigError` naming the field when wrong)."""
    return load_model(ThroughputFile, path)


def dump_throughput(data: ThroughputFile) -> str:
    """JSON text with camelCase keys (readable by `load_throughput`)."""
    return data.model_dump_json(by_alias=True, indent=2)
