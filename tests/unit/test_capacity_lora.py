"""LoRA slots in the capacity plan: the formula by hand, what they take from the KV cache, TP sharding, status."""

from __future__ import annotations

import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.engine.capacity import (
    GB,
    GIB,
    LORA_TARGET_MODULES,
    CapacityInputs,
    LoraSlots,
    ModelArch,
    lora_bytes,
    plan_capacity,
)
from fleetgate.engine.catalog import lookup

LLAMA_8B = lookup("meta-llama/Llama-3.1-8B-Instruct")


def _inputs(**changes: object) -> CapacityInputs:
    assert LLAMA_8B is not None
    base: dict[str, object] = {"arch": LLAMA_8B, "gpu_memory_bytes": 80 * GB, "max_model_len": 8192}
    return CapacityInputs(**{**base, **changes})  # type: ignore[arg-type]


def test_llama_8b_eight_rank_64_slots_by_hand() -> None:
    # 8 slots x rank 64 x hidden 4096 x (A + B) x 32 layers x 7 modules x 2 bytes = 1.88 GB
    slots = LoraSlots(max_loras=8, max_lora_rank=64)
    assert LLAMA_8B is not None and LLAMA_8B.hidden_size == 4096 and LORA_TARGET_MODULES == 7
    assert lora_bytes(arch=LLAMA_8B, slots=slots) == 8 * 64 * 4096 * 2 * 32 * 7 * 2 == 1_879_048_192


def test_slots_scale_linearly_with_adapters_rank_and_dtype() -> None:
    assert LLAMA_8B is not None
    one = lora_bytes(arch=LLAMA_8B, slots=LoraSlots(max_loras=1, max_lora_rank=16))
    assert lora_bytes(arch=LLAMA_8B, slots=LoraSlots(max_loras=4, max_lora_rank=16)) == 4 * one
    assert lora_bytes(arch=LLAMA_8B, slots=LoraSlots(max_loras=1, max_lora_rank=64)) == 4 * one
    assert lora_bytes(arch=LLAMA_8B, slots=LoraSlots(max_loras=1, max_lora_rank=16, dtype_bytes=4.0)) == 2 * one


def test_lora_slots_come_out_of_the_kv_cache() -> None:
    without = plan_capacity(inputs=_inputs())
    slots = LoraSlots(max_loras=8, max_lora_rank=64)
    with_lora = plan_capacity(inputs=_inputs(lora=slots))
    assert with_lora.lora_bytes == with_lora.lora_bytes_per_gpu == 1_879_048_192
    assert without.usable_bytes_per_gpu - with_lora.usable_bytes_per_gpu == with_lora.lora_bytes_per_gpu
    assert with_lora.kv_cache_blocks < without.kv_cache_blocks
    assert "1.88 GB LoRA slots" in with_lora.reason
    assert without.lora_bytes is None and "LoRA" not in without.reason


def test_tensor_parallel_shards_half_of_the_slots() -> None:
    tp1 = plan_capacity(inputs=_inputs(lora=LoraSlots(max_loras=4, max_lora_rank=32)))
    tp4 = plan_capacity(inputs=_inputs(lora=LoraSlots(max_loras=4, max_lora_rank=32), tensor_parallel_size=4))
    assert tp4.lora_bytes == tp1.lora_bytes
    assert tp1.lora_bytes is not None and tp4.lora_bytes_per_gpu == -(-tp1.lora_bytes * 5 // 8)  # (1 + 1/4) / 2


def test_slots_that_eat_the_kv_cache_do_not_fit() -> None:
    plan = plan_capacity(
        inputs=_inputs(gpu_memory_bytes=24 * GB, lora=LoraSlots(max_loras=64, max_lora_rank=512))
    )  # 64 x 512: 60 GB of slots on a 24 GB card
    assert not plan.fits and "weights do not fit" in plan.reason and "LoRA slots" in plan.reason


def test_explicit_kv_budget_cpu_is_not_reduced_but_slots_are_shown() -> None:
    budget = 4 * GIB
    plan = plan_capacity(inputs=_inputs(kv_cache_bytes=budget, lora=LoraSlots(max_loras=2, max_lora_rank=16)))
    assert plan.usable_bytes_per_gpu == budget and plan.lora_bytes_per_gpu is not None


def test_status_shows_the_lora_term() -> None:
    status = plan_capacity(inputs=_inputs(lora=LoraSlots(max_loras=8, max_lora_rank=64))).to_status()
    assert (status["maxAdapters"], status["maxLoraRank"]) == (8, 64)
    assert status["loraBytesPerGpu"] == 1_879_048_192 and status["loraGbPerGpu"] == "1.88"
    plain = plan_capacity(inputs=_inputs()).to_status()
    assert not {"maxAdapters", "loraBytes", "loraGbPerGpu"} & set(plain)


def test_unknown_hidden_size_is_explained() -> None:
    arch = ModelArch(parameters=1e9, layers=4, kv_heads=2, head_dim=64)
    with pytest.raises(ConfigError, match="hiddenSize"):
        plan_capacity(inputs=_inputs(arch=arch, lora=LoraSlots(max_loras=1, max_lora_rank=8)))
