"""The modelled vLLM reserve (activations, CUDA graphs, non-torch) and fp8/int8 weight pricing in the plan.

The H100 figures of issue 23 (Llama-3.1-8B-shaped, 262,144-token vocabulary, gpuMemoryUtilization 0.9,
max length 8192) include calibration points of `VLLM_0_26_H100`: the tests on them guard the calibration,
they are not a held-out check. tests/unit/test_gpu_call1.py sets the plan beside every engine log of the
first H100 call, fitted and held-out configurations named apart.
"""

from __future__ import annotations

from typing import Any

import pytest

from fleetgate.bench.gpu.matrix import architecture
from fleetgate.core.errors import ConfigError
from fleetgate.engine.capacity import GB, GIB, ModelArch, weight_bytes
from fleetgate.engine.reserve import (
    VLLM_0_26_H100,
    ReserveInputs,
    capture_sizes,
    cuda_graph_count,
    model_runner,
    vllm_reserve,
)
from fleetgate.operator.profiles import Profiles
from fleetgate.operator.resolve import resolve
from fleetgate.operator.spec import parse_spec

LLAMA8B_262K = ModelArch(parameters=9_127_071_744, layers=32, kv_heads=8, head_dim=128, hidden_size=4096,
                         attention_heads=32, vocab_size=262_144, intermediate_size=14336)  # fmt: skip


def _plan(**engine: Any) -> Any:
    spec = {"model": {"source": "/models/llama-3.1-8b", "architecture": architecture("llama-3.1-8b")},
            "engine": {"maxModelLen": 8192, **engine},
            "resources": {"accelerator": "nvidia-h100-80gb", "gpus": 1}}  # fmt: skip
    plan = resolve(spec=parse_spec(spec), name="llama", profiles=Profiles()).plan
    assert plan is not None
    return plan


def test_capture_sizes_follow_vllm_026() -> None:
    sizes = capture_sizes(max_num_seqs=1024, max_num_batched_tokens=8192)
    assert sizes[:4] == [1, 2, 4, 8] and sizes[-1] == 512 and len(sizes) == 3 + 31 + 17
    assert capture_sizes(max_num_seqs=128, max_num_batched_tokens=2048)[-1] == 256
    # a step budget below the largest size caps the sizes and is itself captured
    assert capture_sizes(max_num_seqs=1024, max_num_batched_tokens=100)[-3:] == [88, 96, 100]
    # speculative tokens widen decode batches
    assert capture_sizes(max_num_seqs=64, max_num_batched_tokens=8192, num_speculative_tokens=4)[-1] == 512


def test_graph_count_two_modes_and_none_when_eager() -> None:
    assert cuda_graph_count(ReserveInputs(max_num_batched_tokens=8192, max_num_seqs=1024)) == 102
    assert cuda_graph_count(ReserveInputs(max_num_batched_tokens=2048, max_num_seqs=128)) == 35 + 19
    assert cuda_graph_count(ReserveInputs(max_num_batched_tokens=8192, max_num_seqs=1024, enforce_eager=True)) == 0


def test_model_runner_follows_vllm_026() -> None:
    # V1 for the speculative methods V2 lacks and for mixture-of-experts models; V2 otherwise
    assert model_runner(speculative_method=None, moe=False) == "v2"
    assert model_runner(speculative_method="eagle3", moe=False) == "v2"
    for method in ("ngram", "draft_model", "suffix", "medusa"):
        assert model_runner(speculative_method=method, moe=False) == "v1"
    assert model_runner(speculative_method=None, moe=True) == "v1"


def _reserve(arch: ModelArch = LLAMA8B_262K, tp: int = 1, **inputs: Any) -> Any:
    settings = {"max_num_batched_tokens": 8192, "max_num_seqs": 1024, **inputs}
    return vllm_reserve(arch=arch, inputs=ReserveInputs(**settings), tensor_parallel_size=tp)


def test_reserve_terms_scale_with_what_sizes_them() -> None:
    eager = _reserve(enforce_eager=True)
    compiled = _reserve()
    # V2 eager: the forward pass is the peak, whatever the rows; compiled: a fitted multiple of it
    assert _reserve(enforce_eager=True, max_num_seqs=64).activation_bytes == eager.activation_bytes
    assert compiled.activation_bytes == round(eager.activation_bytes * VLLM_0_26_H100.compiled_factor)
    small_step = _reserve(enforce_eager=True, max_num_batched_tokens=2048, max_num_seqs=128)
    assert small_step.activation_bytes < eager.activation_bytes / 3
    # V2 subtracts no CUDA graph estimate (it captures after sizing the KV cache); V1 does, unless eager
    assert compiled.cuda_graph_bytes == 0 and compiled.cuda_graphs == 0
    v1 = _reserve(speculative_method="ngram", num_speculative_tokens=4)
    assert v1.runner == "v1" and v1.cuda_graphs > 0 and v1.cuda_graph_bytes > 0
    assert _reserve(speculative_method="ngram", enforce_eager=True).cuda_graph_bytes == 0
    # the rejection sampler's rows: its peak grows with max_num_seqs, not with the draft
    spec_1024 = _reserve(speculative_method="draft_model", enforce_eager=True)
    spec_128 = _reserve(speculative_method="draft_model", enforce_eager=True, max_num_seqs=128)
    assert spec_1024.activation_bytes > 7 * spec_128.activation_bytes / 1.2 > eager.activation_bytes
    assert _reserve(speculative_method="ngram", enforce_eager=True).activation_bytes == spec_1024.activation_bytes
    tp2 = _reserve(tp=2)
    assert tp2.non_torch_bytes > compiled.non_torch_bytes and tp2.activation_bytes < compiled.activation_bytes
    assert compiled.total_bytes == compiled.activation_bytes + compiled.cuda_graph_bytes + compiled.non_torch_bytes


def test_cuda_sees_less_than_nvidia_smi_and_the_plan_uses_what_cuda_sees() -> None:
    plan = _plan(gpuMemoryUtilization=0.9, enforceEager=True)
    gpu = Profiles().resolve(name="nvidia-h100-80gb").gpu_memory_bytes
    reserve = plan.reserve_bytes_per_gpu
    expected = int((gpu - VLLM_0_26_H100.driver_reserved_bytes) * 0.9) - plan.weight_bytes_per_gpu - reserve
    assert abs(plan.usable_bytes_per_gpu - expected) <= 1
    # 79.18 GiB: what vLLM logged as the H100's total on the first GPU call
    assert (gpu - VLLM_0_26_H100.driver_reserved_bytes) / GIB == pytest.approx(79.18, abs=0.005)


def test_reserve_needs_a_hidden_size() -> None:
    with pytest.raises(ConfigError, match="hidden size"):
        vllm_reserve(arch=ModelArch(parameters=1e9, layers=4, kv_heads=1, head_dim=64),
                     inputs=ReserveInputs(max_num_batched_tokens=2048, max_num_seqs=256))  # fmt: skip


def test_fp8_and_int8_keep_embeddings_and_lm_head_in_16_bits() -> None:
    embeddings = 2 * 262_144 * 4096
    expected = (LLAMA8B_262K.parameters - embeddings) * 1 + embeddings * 2
    for method in ("fp8", "int8", "compressed-tensors"):
        assert weight_bytes(arch=LLAMA8B_262K, dtype=method) == round(expected)
    tied = ModelArch(parameters=1e9, layers=4, kv_heads=1, head_dim=64, hidden_size=1000, vocab_size=1000,
                     tied_embeddings=True)  # fmt: skip
    assert weight_bytes(arch=tied, dtype="fp8") == round((1e9 - 1e6) + 2e6)
    # without the vocabulary every parameter is priced at one byte, as before
    bare = ModelArch(parameters=8e9, layers=32, kv_heads=8, head_dim=128)
    assert weight_bytes(arch=bare, dtype="fp8") == 8 * GB


@pytest.mark.parametrize(
    ("engine", "weights_gib", "kv_tokens", "concurrency"),
    [
        ({}, 17.05, 424_864, 51.86),  # issue 23, bf16
        ({"quantization": "fp8", "kvCacheDtype": "fp8"}, 10.56, 955_584, 116.65),  # issue 23, fp8 + fp8 KV
    ],
)
def test_calibration_points_of_issue_23(engine: dict[str, str], weights_gib: float, kv_tokens: int,
                                        concurrency: float) -> None:  # fmt: skip
    plan = _plan(gpuMemoryUtilization=0.9, **engine)
    assert plan.weight_bytes_per_gpu / GIB == pytest.approx(weights_gib, rel=0.01)
    assert plan.kv_cache_tokens == pytest.approx(kv_tokens, rel=0.01)
    assert plan.max_concurrency == pytest.approx(concurrency, rel=0.01)
    assert plan.reserve_bytes_per_gpu == (plan.activation_bytes_per_gpu + plan.cuda_graph_bytes_per_gpu
                                          + plan.non_torch_bytes_per_gpu)  # fmt: skip


def test_status_shows_the_reserve_split_and_a_flat_fallback_is_named() -> None:
    status = _plan().to_status()
    split = {"reserveBytesPerGpu", "activationBytesPerGpu", "cudaGraphBytesPerGpu", "nonTorchBytesPerGpu"}
    assert split <= set(status)
    spec = {"model": {"source": "/models/x", "architecture": {"parametersBillions": 8, "layers": 32, "kvHeads": 8,
                                                              "headDim": 128}},
            "resources": {"accelerator": "nvidia-h100-80gb", "gpus": 1}}  # fmt: skip
    resolved = resolve(spec=parse_spec(spec), name="x", profiles=Profiles())
    assert resolved.plan is not None and resolved.plan.reserve_bytes_per_gpu == 2 * GB
    assert "set architecture.hiddenSize" in resolved.plan_note
