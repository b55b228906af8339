"""Accelerator profiles: the operator-level mapping from `spec.resources.accelerator` to GPUs on nodes.

A profile names the GPU's memory (as `nvidia-smi` reports its total), the extended resource to request,
the node selector that lands pods on that GPU (GPU Feature Discovery's `nvidia.com/gpu.product` label by
default) and the tolerations GPU node pools carry. Platform teams override or add profiles with a YAML
file (`fleetgate operator --profiles FILE`): a mapping of name -> fields of `AcceleratorProfile`.

A CPU profile (no GPU memory) also carries the KV-cache space each engine gets (`kv_cache_space_gib`: the
pods receive it as `VLLM_CPU_KVCACHE_SPACE`, and the capacity plan uses it as the KV budget) and vLLM CPU's
block size (128 tokens, where CUDA uses 16). `max_num_batched_tokens` and `max_num_seqs` are vLLM's
defaults for that hardware when the spec sets none: they size what sliding-window layers keep per request,
the modelled activation and CUDA graph reserve, and decide whether vLLM would refuse a `maxNumSeqs`.
`overhead_bytes` left at None (the built-in GPU profiles) models vLLM's per-GPU reserve
(`fleetgate.engine.reserve`: activations, CUDA graphs, non-torch memory); a number is a flat allowance
instead. `kv_cache_dtypes` lists the
KV-cache dtypes the engine accepts there (None: any): vLLM CPU's attention backend takes only `auto` and the
fp8 variants (fp8 on x86 with AVX-512 or AMX; a pool without them should list only `auto`), and Hopper
GPUs take no fp8_e5m2 (vLLM 0.26 died on it on an H100), so a spec asking for another one is refused
before any pod is made.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fleetgate.core.errors import ConfigError
from fleetgate.engine.kv_blocks import CPU_BLOCK_SIZE, CUDA_BLOCK_SIZE, DEFAULT_MAX_NUM_BATCHED_TOKENS

MIB = 2**20
GPU_TOLERATION: Mapping[str, str] = MappingProxyType(
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
)
DEFAULT_ACCELERATOR = "nvidia-l4"
# vLLM's OpenAI-server defaults (`EngineArgs.get_batch_defaults`, 0.26 and 0.32).
DEFAULT_MAX_NUM_SEQS = 256
LARGE_GPU_MAX_NUM_BATCHED_TOKENS = 8192
LARGE_GPU_MAX_NUM_SEQS = 1024
CPU_MAX_NUM_SEQS = 128  # per CPU engine (world size 1)


@dataclass(frozen=True, kw_only=True)
class AcceleratorProfile:
    name: str
    gpu_memory_bytes: int  # per GPU; 0 for a CPU-only profile
    resource_name: str = "nvidia.com/gpu"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, str], ...] = (GPU_TOLERATION,)
    overhead_bytes: int | None = None  # flat per-GPU reserve; None: modelled (fleetgate.engine.reserve)
    kv_cache_space_gib: int = 0  # CPU only: GiB of KV cache per engine (VLLM_CPU_KVCACHE_SPACE)
    kv_block_size: int = CUDA_BLOCK_SIZE
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS
    max_num_seqs: int = DEFAULT_MAX_NUM_SEQS
    kv_cache_dtypes: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.gpu_memory_bytes < 0 or self.kv_cache_space_gib < 0:
            raise ConfigError(f"profile {self.name!r}: gpu_memory_bytes and kv_cache_space_gib must be >= 0")
        if self.kv_block_size < 1 or self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ConfigError(
                f"profile {self.name!r}: kv_block_size, max_num_batched_tokens and max_num_seqs must be >= 1"
            )
        if self.overhead_bytes is not None and self.overhead_bytes < 0:
            raise ConfigError(f"profile {self.name!r}: overhead_bytes must be >= 0")

    @property
    def is_gpu(self) -> bool:
        return self.gpu_memory_bytes > 0


# kvCacheDtype fp8_e5m2 on an H100: vLLM 0.26 found only its Triton attention backend for it, which quantizes
# queries for an fp8 KV cache and asserts e4m3, so the engine died at its first forward pass (AssertionError
# in Attention.forward; GPU tier, 2026-11-27, docs/reports/gpu-h100.md). vLLM 0.32 has the same assertion.
# Other GPUs are not restricted: not measured.
HOPPER_KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3")


def _gpu(name: str, mib: int, product: str, *, large: bool = False, hopper: bool = False) -> AcceleratorProfile:
    """`large`: vLLM's defaults for >= 70 GiB GPUs other than the A100 (8192 tokens, 1024 sequences).
    `hopper`: no fp8_e5m2 KV cache (measured on an H100, see HOPPER_KV_CACHE_DTYPES)."""
    return AcceleratorProfile(
        name=name,
        gpu_memory_bytes=mib * MIB,
        node_selector={"nvidia.com/gpu.product": product},
        max_num_batched_tokens=LARGE_GPU_MAX_NUM_BATCHED_TOKENS if large else DEFAULT_MAX_NUM_BATCHED_TOKENS,
        max_num_seqs=LARGE_GPU_MAX_NUM_SEQS if large else DEFAULT_MAX_NUM_SEQS,
        kv_cache_dtypes=HOPPER_KV_CACHE_DTYPES if hopper else None,
    )


BUILTIN_PROFILES: Mapping[str, AcceleratorProfile] = MappingProxyType(
    {
        p.name: p
        for p in (
            _gpu("nvidia-t4", 15360, "Tesla-T4"),
            _gpu("nvidia-l4", 23034, "NVIDIA-L4"),
            _gpu("nvidia-a10g", 23028, "NVIDIA-A10G"),
            _gpu("nvidia-l40s", 46068, "NVIDIA-L40S"),
            _gpu("nvidia-a100-40gb", 40960, "NVIDIA-A100-SXM4-40GB"),
            _gpu("nvidia-a100-80gb", 81920, "NVIDIA-A100-SXM4-80GB"),
            # vLLM raises its default batch to 8192 tokens and 1024 sequences on >= 70 GiB GPUs but the A100.
            _gpu("nvidia-h100-80gb", 81559, "NVIDIA-H100-80GB-HBM3", large=True, hopper=True),
            _gpu("nvidia-h200", 143771, "NVIDIA-H200", large=True, hopper=True),
            # The CPU engine image's default VLLM_CPU_KVCACHE_SPACE is 1 GiB.
            AcceleratorProfile(
                name="cpu",
                gpu_memory_bytes=0,
                resource_name="",
                tolerations=(),
                kv_cache_space_gib=1,
                kv_block_size=CPU_BLOCK_SIZE,
                max_num_seqs=CPU_MAX_NUM_SEQS,
                # vLLM 0.32 CPUAttentionBackend.supported_kv_cache_dtypes
                kv_cache_dtypes=("auto", "fp8", "fp8_e4m3", "fp8_e5m2"),
            ),
        )
    }
)


@dataclass(frozen=True, kw_only=True)
class Profiles:
    by_name: Mapping[str, AcceleratorProfile] = field(default_factory=lambda: BUILTIN_PROFILES)
    default: str = DEFAULT_ACCELERATOR

    def resolve(self, *, name: str | None) -> AcceleratorProfile:
        key = name or self.default
        try:
            return self.by_name[key]
        except KeyError:
            raise ConfigError(
                f"unknown accelerator profile {key!r}; known: {', '.join(sorted(self.by_name))}"
            ) from None


def load_profiles(*, path: Path | None, default: str = DEFAULT_ACCELERATOR) -> Profiles:
    """Built-in profiles, overridden and extended by a YAML file when given."""
    merged: dict[str, AcceleratorProfile] = dict(BUILTIN_PROFILES)
    if path is not None:
        import yaml

        data: Any = yaml.safe_load(path.read_text())
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: expected a mapping of profile name -> fields")
        for name, fields in data.items():
            if not isinstance(fields, dict):
                raise ConfigError(f"{path}: profile {name!r} must be a mapping")
            base = merged.get(name, AcceleratorProfile(name=name, gpu_memory_bytes=0))
            try:
                tolerations = tuple(fields.pop("tolerations", base.tolerations))
                if fields.get("kv_cache_dtypes") is not None:
                    fields["kv_cache_dtypes"] = tuple(fields["kv_cache_dtypes"])
                merged[name] = replace(base, **fields, tolerations=tolerations)
            except TypeError as exc:
                raise ConfigError(f"{path}: profile {name!r}: {exc}") from None
    if default not in merged:
        raise ConfigError(f"default accelerator profile {default!r} is not defined")
    return Profiles(by_name=MappingProxyType(merged), default=default)
