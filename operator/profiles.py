"""Accelerator profiles: the operator-level mapping from `spec.resources.accelerator` to GPUs on nodes.

A profile names the GPU's memory (as `nvidia-smi` reports its total), the extended resource to request,
the node selector that lands pods on that GPU (GPU Feature Discovery's `nvidia.com/gpu.product` label by
default) and the tolerations GPU node pools carry. Platform teams override or add profiles with a YAML
file (`fleetgate operator --profiles FILE`): a mapping of name -> fields of `AcceleratorProfile`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fleetgate.core.errors import ConfigError

MIB = 2**20
GPU_TOLERATION: Mapping[str, str] = MappingProxyType(
    {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
)
DEFAULT_ACCELERATOR = "nvidia-l4"


@dataclass(frozen=True, kw_only=True)
class AcceleratorProfile:
    name: str
    gpu_memory_bytes: int  # per GPU; 0 for a CPU-only profile
    resource_name: str = "nvidia.com/gpu"
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, str], ...] = (GPU_TOLERATION,)
    overhead_bytes: int = 2 * 10**9  # activations, CUDA graphs, NCCL buffers: kept out of the KV budget

    @property
    def is_gpu(self) -> bool:
        return self.gpu_memory_bytes > 0


def _gpu(name: str, mib: int, product: str) -> AcceleratorProfile:
    return AcceleratorProfile(name=name, gpu_memory_bytes=mib * MIB, node_selector={"nvidia.com/gpu.product": product})


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
            _gpu("nvidia-h100-80gb", 81559, "NVIDIA-H100-80GB-HBM3"),
            _gpu("nvidia-h200", 143771, "NVIDIA-H200"),
            AcceleratorProfile(name="cpu", gpu_memory_bytes=0, resource_name="", tolerations=()),
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
                merged[name] = replace(base, **fields, tolerations=tolerations)
            except TypeError as exc:
                raise ConfigError(f"{path}: profile {name!r}: {exc}") from None
    if default not in merged:
        raise ConfigError(f"default accelerator profile {default!r} is not defined")
    return Profiles(by_name=MappingProxyType(merged), default=default)
