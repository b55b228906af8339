"""The capacity plan beside what vLLM logged for the same spec: figure by figure, with the error in percent.

Compared per GPU: weights (vLLM's `Model loading took X GiB` counts LoRA slots and a draft model with the
weights, so the plan's LoRA bytes are added), the KV budget (`Available KV cache memory`), KV-cache
tokens, maximum concurrency at max_model_len, and the reserve terms (peak activation, the CUDA graph
estimate vLLM subtracts, non-torch memory). Error = (plan - vLLM) / vLLM x 100. vLLM rounds GiB to two
decimals, so for small figures (a few hundredths of a GiB) the percentage is coarse.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from fleetgate.engine.capacity import CapacityPlan
from fleetgate.engine.vllm_log import GIB, EngineLogReport

TOLERANCE_PCT = 5.0
# The figures the target (within +-5%) is about.
TARGET_METRICS = ("weights", "kv_tokens", "max_concurrency")


@dataclass(frozen=True, kw_only=True, slots=True)
class Figure:
    plan: float
    vllm: float
    error_pct: float | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _figure(plan: float | None, vllm: float | None) -> Figure | None:
    if plan is None or vllm is None:
        return None
    error = (plan - vllm) / vllm * 100 if vllm else None
    return Figure(plan=plan, vllm=vllm, error_pct=round(error, 2) if error is not None else None)


def compare(*, plan: CapacityPlan, log: EngineLogReport) -> dict[str, Figure]:
    """Each figure both sides report (missing ones are left out)."""
    weights = plan.weight_bytes_per_gpu + (plan.lora_bytes_per_gpu or 0)
    pairs: dict[str, tuple[float | None, float | None]] = {
        "weights": (weights / GIB, log.weights_gib),
        "kv_tokens": (float(plan.kv_cache_tokens), float(log.kv_tokens) if log.kv_tokens is not None else None),
        "max_concurrency": (plan.max_concurrency, log.max_concurrency),
        "kv_memory": (plan.usable_bytes_per_gpu / GIB, log.available_kv_gib),
        "activation": (_gib(plan.activation_bytes_per_gpu), log.activation_gib),
        "cuda_graphs": (_gib(plan.cuda_graph_bytes_per_gpu), log.cuda_graph_estimate_gib),
        "non_torch": (_gib(plan.non_torch_bytes_per_gpu), log.non_torch_gib),
    }
    out = {}
    for name, (planned, seen) in pairs.items():
        figure = _figure(planned, seen)
        if figure is not None:
            out[name] = figure
    return out


def _gib(value: int | None) -> float | None:
    return value / GIB if value is not None else None


def within_target(figures: dict[str, Figure], *, tolerance_pct: float = TOLERANCE_PCT) -> dict[str, bool]:
    """For each target metric present: |error| <= tolerance."""
    return {
        name: figures[name].error_pct is not None and abs(figures[name].error_pct or 0.0) <= tolerance_pct
        for name in TARGET_METRICS
        if name in figures
    }
