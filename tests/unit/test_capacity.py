"""Capacity math against the worked examples of the inference-optimization literature.

Sources (copies in ../shared): design/BENCHMARKS.md §6 and seeds/000_4fa4c07955f84e4a.txt ("LLM Inference
Optimization": KV-cache formula, Llama 2 70B example, "Problem 1: KV Cache Memory Planning"),
seeds/004_188a622e04bad1ff.txt ("Inference Optimization": weight memory by precision, KV of LLaMA 70B at
4096 x 32). GB = 10**9 bytes, as in those texts.
"""

from __future__ import annotations

import math

import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.engine.capacity import (
    GB,
    CapacityInputs,
    ModelArch,
    kv_bytes_per_token,
    plan_capacity,
    weight_bytes,
)
from fleetgate.engine.catalog import lookup, normalize

LLAMA_70B = ModelArch(parameters=70e9, layers=80, kv_heads=8, head_dim=128)


def _floor1(x: float) -> float:
    return math.floor(x * 10) / 10


def test_llama2_70b_kv_per_sequence_4k_fp16() -> None:
    # BENCHMARKS §6 / seed 000: 2 x 80 x 8 x 128 x 4096 x 2 bytes ~= 1.34 GB per sequence.
    per_seq = kv_bytes_per_token(arch=LLAMA_70B, kv_dtype="float16") * 4096
    assert per_seq == 2 * 80 * 8 * 128 * 4096 * 2
    assert round(per_seq / GB, 2) == 1.34


def test_llama2_70b_100_sequences_4k() -> None:
    # Seed 000: "With 100 concurrent sequences at 4K context, that is 134 GB just for KV cache".
    per_seq = kv_bytes_per_token(arch=LLAMA_70B, kv_dtype="float16") * 4096
    assert round(100 * per_seq / GB) == 134


def test_llama_70b_batch_32_4k_is_about_40_gb() -> None:
    # Seed 004: "LLaMA 70B, 4096 context, batch=32: KV cache = ~40 GB" (a rounded figure: exact is 42.9 GB).
    total = 32 * kv_bytes_per_token(arch=LLAMA_70B, kv_dtype="float16") * 4096
    assert total / GB == pytest.approx(40, rel=0.1)
    assert round(total / GB, 1) == 42.9


def test_llama3_70b_on_4x80gb_tp4_64x8k_barely_fits() -> None:
    # BENCHMARKS §6 / seed 000 Problem 1: 2.68 GB per sequence; 64 x 2.68 = 171.5 GB; /4 = 42.9 GB per GPU;
    # available per GPU 80 - 35 (weights) - 2 (overhead) = 43 GB -> barely fits.
    plan = plan_capacity(
        inputs=CapacityInputs(
            arch=LLAMA_70B,
            weight_dtype="float16",
            kv_cache_dtype="float16",
            tensor_parallel_size=4,
            gpu_memory_bytes=80 * GB,
            gpu_memory_utilization=1.0,
            overhead_bytes=2 * GB,
            max_model_len=8192,
            target_concurrency=64,
        )
    )
    assert plan.kv_bytes_per_sequence == 2 * 80 * 8 * 128 * 8192 * 2
    per_seq_gb = round(plan.kv_bytes_per_sequence / GB, 2)
    assert per_seq_gb == 2.68
    assert round(64 * per_seq_gb, 1) == 171.5  # the text multiplies the rounded per-sequence figure
    assert _floor1(64 * plan.kv_bytes_per_sequence / GB / 4) == 42.9
    assert plan.weight_bytes == 140 * GB
    assert plan.weight_bytes_per_gpu == 35 * GB
    assert plan.usable_bytes_per_gpu == 43 * GB
    assert plan.kv_bytes_needed_per_gpu == 64 * plan.kv_bytes_per_sequence // 4
    assert _floor1(plan.kv_bytes_needed_per_gpu / GB) == 42.9
    assert plan.fits and plan.meets_target
    assert 0 < plan.headroom_bytes_per_gpu <= 0.1 * GB  # "barely fits, about 0.1 GB of headroom"
    assert plan.max_concurrent_sequences == 64


def test_int8_kv_halves_kv_memory_per_gpu() -> None:
    # Seed 000 Problem 1, solution 1: INT8 KV cache halves KV memory (21.4 GB per GPU).
    def needed(kv_dtype: str) -> int:
        return plan_capacity(
            inputs=CapacityInputs(
                arch=LLAMA_70B,
                kv_cache_dtype=kv_dtype,
                tensor_parallel_size=4,
                gpu_memory_bytes=80 * GB,
                gpu_memory_utilization=1.0,
                max_model_len=8192,
                target_concurrency=64,
            )
        ).kv_bytes_needed_per_gpu

    assert needed("int8") * 2 == needed("float16")
    assert _floor1(needed("int8") / GB) == 21.4


@pytest.mark.parametrize(("dtype", "gb"), [("float32", 280), ("float16", 140), ("int8", 70), ("awq", 35), ("gptq", 35)])
def test_70b_weight_memory_by_precision(dtype: str, gb: int) -> None:
    # Seed 004 "MEMORY IMPACT (LLaMA 70B)": FP32 280 GB, FP16 140 GB, INT8 70 GB, INT4 35 GB.
    assert weight_bytes(arch=LLAMA_70B, dtype=dtype) == gb * GB


def test_7b_draft_model_fp16_is_about_14_gb() -> None:
    # Seed 000 speculative decoding: "The draft model consumes GPU memory (about 14 GB for 7B at FP16)".
    draft = ModelArch(parameters=7e9, layers=32, kv_heads=32, head_dim=128)
    assert weight_bytes(arch=draft, dtype="float16") == 14 * GB


def test_draft_model_adds_weights_and_kv() -> None:
    target = ModelArch(parameters=8e9, layers=32, kv_heads=8, head_dim=128)
    draft = ModelArch(parameters=1e9, layers=16, kv_heads=8, head_dim=64)
    base = CapacityInputs(arch=target, gpu_memory_bytes=24 * GB, max_model_len=4096)
    with_draft = CapacityInputs(arch=target, gpu_memory_bytes=24 * GB, max_model_len=4096, draft=draft)
    a, b = plan_capacity(inputs=base), plan_capacity(inputs=with_draft)
    assert b.weight_bytes - a.weight_bytes == 2 * GB
    assert b.kv_bytes_per_token - a.kv_bytes_per_token == 2 * 16 * 8 * 64 * 2
    assert b.max_concurrent_sequences < a.max_concurrent_sequences


def test_weights_that_do_not_fit_say_so() -> None:
    plan = plan_capacity(
        inputs=CapacityInputs(arch=LLAMA_70B, gpu_memory_bytes=80 * GB, max_model_len=4096, tensor_parallel_size=1)
    )
    assert not plan.fits
    assert plan.max_concurrent_sequences == 0
    assert "weights do not fit" in plan.reason
    assert "140.00 GB weights" in plan.reason


def test_kv_that_does_not_fit_gives_numbers() -> None:
    plan = plan_capacity(
        inputs=CapacityInputs(
            arch=LLAMA_70B,
            tensor_parallel_size=4,
            gpu_memory_bytes=80 * GB,
            gpu_memory_utilization=1.0,
            max_model_len=8192,
            target_concurrency=65,
        )
    )
    assert plan.fits  # vLLM starts and queues the 65th sequence
    assert not plan.meets_target
    assert plan.headroom_bytes_per_gpu < 0
    assert "not the target concurrency" in plan.reason and "at most 64 sequences" in plan.reason


def test_one_sequence_that_does_not_fit_is_not_a_fit() -> None:
    plan = plan_capacity(
        inputs=CapacityInputs(
            arch=LLAMA_70B,
            tensor_parallel_size=4,
            gpu_memory_bytes=80 * GB,
            gpu_memory_utilization=1.0,
            max_model_len=2_000_000,
        )
    )
    assert plan.usable_bytes_per_gpu > 0
    assert not plan.fits and not plan.meets_target
    assert plan.max_concurrent_sequences == 0
    assert "does not fit one sequence" in plan.reason


def test_fewer_kv_heads_than_gpus_replicates_heads() -> None:
    arch = ModelArch(parameters=1e9, layers=10, kv_heads=2, head_dim=64)
    assert kv_bytes_per_token(arch=arch, kv_dtype="float16", tensor_parallel_size=4) == kv_bytes_per_token(
        arch=arch, kv_dtype="float16", tensor_parallel_size=2
    )


def test_status_dict_is_camel_case_with_gb() -> None:
    plan = plan_capacity(
        inputs=CapacityInputs(arch=LLAMA_70B, gpu_memory_bytes=80 * GB, max_model_len=8, tensor_parallel_size=4)
    )
    status = plan.to_status()
    assert status["weightBytesPerGpu"] == 35 * GB
    assert status["weightGbPerGpu"] == "35.00"
    assert status["fits"] is True


@pytest.mark.parametrize(
    "bad",
    [
        {"tensor_parallel_size": 0},
        {"max_model_len": 0},
        {"gpu_memory_utilization": 1.2},
        {"weight_dtype": "int3"},
        {"kv_cache_dtype": "int2"},
    ],
)
def test_bad_inputs_raise(bad: dict[str, object]) -> None:
    kwargs: dict[str, object] = {"arch": LLAMA_70B, "gpu_memory_bytes": 80 * GB, "max_model_len": 4096, **bad}
    with pytest.raises(ConfigError):
        plan_capacity(inputs=CapacityInputs(**kwargs))  # type: ignore[arg-type]


def test_bad_architecture_raises() -> None:
    with pytest.raises(ConfigError, match="kv_heads"):
        ModelArch(parameters=1e9, layers=1, kv_heads=0, head_dim=64)


@pytest.mark.parametrize(
    ("ref", "key"),
    [
        ("hf://meta-llama/Llama-2-70b-chat-hf", "llama-2-70b"),
        ("meta-llama/Meta-Llama-3.1-8B-Instruct", "llama-3.1-8b"),
        ("hf://mistralai/Mistral-7B-Instruct-v0.3", "mistral-7b"),
        ("Qwen/Qwen2.5-7B-Instruct-AWQ", "qwen2.5-7b"),
        ("/models/gemma-3-270m-it", "gemma-3-270m"),
        ("hf://meta-llama/Meta-Llama-3-70B-Instruct", "meta-llama-3-70b"),
    ],
)
def test_catalog_matches_common_references(ref: str, key: str) -> None:
    assert normalize(ref) == key
    assert lookup(ref) is not None


def test_catalog_unknown_model_is_none() -> None:
    assert lookup("hf://acme/secret-model-13b") is None


def test_catalog_llama2_70b_facts_match_the_worked_example() -> None:
    arch = lookup("meta-llama/Llama-2-70b-hf")
    assert arch is not None
    assert (arch.layers, arch.kv_heads, arch.head_dim) == (80, 8, 128)


def test_awq_keeps_embeddings_and_lm_head_in_16_bits_and_counts_scales() -> None:
    """Qwen2.5-7B-Instruct-AWQ's checkpoint is about 5.5 GB, not parameters x 0.5 byte (3.81 GB)."""
    from fleetgate.engine.capacity import weight_bytes
    from fleetgate.engine.catalog import lookup

    arch = lookup("hf://Qwen/Qwen2.5-7B-Instruct-AWQ")
    assert arch is not None
    awq = weight_bytes(arch=arch, dtype="awq_marlin") / 1e9
    assert 5.3 < awq < 5.8, awq
    assert abs(weight_bytes(arch=arch, dtype="bfloat16") / 1e9 - 15.24) < 0.01  # 16-bit: unchanged
    tied = lookup("Qwen/Qwen2.5-0.5B-Instruct-AWQ")
    assert tied is not None and tied.tied_embeddings  # one 16-bit embedding matrix, not two
    assert weight_bytes(arch=tied, dtype="awq") < weight_bytes(arch=tied, dtype="float16")


@pytest.mark.parametrize(
    ("model", "tp", "ok"),
    [("llama-3.1-70b", 3, False), ("llama-3.1-70b", 4, True), ("llama-3.1-70b", 16, True),
     ("qwen2.5-7b", 2, True), ("qwen2.5-7b", 8, False), ("qwen2.5-0.5b", 4, False), ("gemma-3-270m", 4, True),
     ("gemma-3-270m", 3, False), ("qwen2.5-1.5b", 3, False)],
)  # fmt: skip
def test_tensor_parallel_must_divide_attention_and_kv_heads(model: str, tp: int, ok: bool) -> None:
    from fleetgate.engine.capacity import tensor_parallel_problem
    from fleetgate.engine.catalog import lookup

    arch = lookup(model)
    assert arch is not None
    assert (tensor_parallel_problem(arch=arch, tensor_parallel_size=tp) is None) is ok
