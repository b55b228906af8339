"""Constants of a simulated engine: KV capacity, batching limits and the step-time model.

Step time (seconds of simulated engine time) for one continuous-batching step:

    step_s = step_overhead_s + prefill_s_per_token * new_prefill_tokens
             + decode_s_per_seq * decoding_seqs   (only when at least one sequence decodes)

`new_prefill_tokens` counts *uncached* prompt tokens only, so time to first token is queueing plus
prefill of the uncached part; the decode term makes time per output token grow with the running
batch. `time_scale` stretches simulated seconds into wall seconds (0.1 runs 10x faster).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType


@dataclass(frozen=True, slots=True)
class SimProfile:
    name: str = "vllm-cpu-gemma3-270m"
    model: str = "gemma-3-270m"
    chars_per_token: int = 4  # deterministic approximate tokeniser: fixed-width character chunks
    block_size: int = 16  # tokens per KV block (vLLM's default)
    num_blocks: int = 1024  # KV capacity in blocks (16,384 tokens)
    max_num_seqs: int = 16  # continuous batching: max running sequences
    max_batched_tokens: int = 4096  # prefill token budget per step (one long prompt always fits)
    step_overhead_s: float = 0.078
    prefill_s_per_token: float = 0.0019
    decode_s_per_seq: float = 0.002
    default_max_tokens: int = 32
    time_scale: float = 1.0
    # Answers of a natural length drawn per prompt in [lo, hi] tokens (finish_reason "stop" when it is
    # below max_tokens), instead of always running to max_tokens ("length"). None: always max_tokens.
    natural_tokens: tuple[int, int] | None = None
    # Start each answer with `[answer:<12 hex digest of the prompt>]` so benchmarks can tell which
    # prompt an answer (e.g. one replayed by a cache) was produced for.
    answer_tag: bool = False

    def with_(self, **changes: object) -> SimProfile:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size


PROFILES: Mapping[str, SimProfile] = MappingProxyType(
    {
        # Fitted to vLLM CPU (vllm-cpu 0.32, Gemma 3 270M bf16, --enforce-eager) on a 2-core machine under
        # heavy contention by `fleetgate sim --calibrate`: prefill ~1.9 ms/token, decode step ~78 ms + 2 ms/seq.
        "vllm-cpu-gemma3-270m": SimProfile(),
        # A mid-size model on one datacentre GPU: prefill ~8k tok/s, ~25 ms decode steps.
        "gpu-8b": SimProfile(
            name="gpu-8b",
            model="llama-3.1-8b",
            num_blocks=2048,
            max_num_seqs=64,
            max_batched_tokens=8192,
            step_overhead_s=0.02,
            prefill_s_per_token=0.000125,
            decode_s_per_seq=0.0002,
        ),
    }
)


def get_profile(name: str) -> SimProfile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown simulator profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
