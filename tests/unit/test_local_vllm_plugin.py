"""The vLLM plugin's quantized tied embedding, against vLLM's real CPU kernel and torch references (no engine;
tests/e2e/test_up_quantized.py serves a checkpoint with it)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from fleetgate.local import gguf_blocks, schemes, vllm_plugin
from fleetgate.local.gguf_quantize import packed_tensors
from fleetgate.local.vllm_weights import parse_weight_bytes, weight_bytes_line

ROWS, COLS, GROUP = 96, 128, 32


@pytest.fixture(autouse=True)
def _single_process_parallel_state(monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM's parameters record their tensor-parallel rank; outside an engine there is one process, rank 0
    import vllm.model_executor.parameter as parameter

    monkeypatch.setattr(parameter, "get_tensor_model_parallel_rank", lambda: 0)
    monkeypatch.setattr(parameter, "get_tensor_model_parallel_world_size", lambda: 1)


def _groups(bits: int, seed: int = 0) -> gguf_blocks.GroupInt:
    rng = np.random.default_rng(seed)
    low, high = (-8, 7) if bits == 4 else (-127, 127)
    q = rng.integers(low, high + 1, size=(ROWS, COLS)).astype(np.int8)
    scale = rng.uniform(0.001, 0.05, size=(ROWS, COLS // GROUP)).astype(np.float32)
    scale = gguf_blocks._bf16(scale) if bits == 4 else scale.astype(np.float16)
    return gguf_blocks.GroupInt(q=q, scale=scale)


WNA16 = vllm_plugin.wna16_available()
needs_wna16 = pytest.mark.skipif(not WNA16, reason="this CPU's vLLM extension (AVX2 build) has no cpu_gemm_wna16; "
                                 "the int8 fallback's tests run instead")
# the 4-bit layouts: vLLM's WNA16 blocks where its kernel exists, and the int8 fallback (forced, so it runs everywhere)
LAYOUTS = [pytest.param(4, True, marks=needs_wna16, id="4-wna16"), pytest.param(4, False, id="4-int8-fallback"),
           pytest.param(8, True, id="8")]


def _loaded_layer(bits: int, groups: gguf_blocks.GroupInt, *, kernel: bool = True) -> tuple[torch.nn.Module, Any]:
    """A module given the method's weights, loaded from checkpoint tensors the way vLLM would, then processed.
    `kernel=False`: as on a CPU whose vLLM build lacks the WNA16 GEMM."""
    if kernel and bits == 4 and not WNA16:
        pytest.skip("no cpu_gemm_wna16 on this CPU")
    method = vllm_plugin.QuantizedTiedEmbedding(num_bits=bits, group_size=GROUP)
    layer = torch.nn.Module()

    def loader(param: torch.nn.Parameter, loaded: torch.Tensor) -> None:
        param.data.copy_(loaded)

    method.create_weights(layer, COLS, [ROWS], COLS, ROWS, torch.bfloat16, weight_loader=loader)
    for name, tensor in packed_tensors("e", groups, bits=bits).items():
        param = getattr(layer, name.split(".", 1)[1])
        param.weight_loader(param, tensor)
    if kernel:
        method.process_weights_after_loading(layer)
    else:
        from unittest import mock

        with mock.patch.object(vllm_plugin, "wna16_available", return_value=False):
            method.process_weights_after_loading(layer)
        assert method.layout == "int8"
    return layer, method


@pytest.mark.parametrize(("bits", "kernel"), LAYOUTS)
def test_lookup_returns_the_dequantized_rows(bits: int, kernel: bool) -> None:
    groups = _groups(bits)
    layer, method = _loaded_layer(bits, groups, kernel=kernel)
    ids = torch.tensor([[0, 17, 95], [16, 15, 8]])
    rows = method.embedding(layer, ids)
    assert rows.shape == (2, 3, COLS) and rows.dtype == torch.bfloat16
    expected = torch.from_numpy(groups.dequantize())[ids].to(torch.bfloat16)
    assert torch.equal(rows, expected)


@pytest.mark.parametrize(("bits", "kernel"), LAYOUTS)
def test_logits_equal_the_product_with_the_dequantized_matrix(bits: int, kernel: bool) -> None:
    groups = _groups(bits, seed=1)
    layer, method = _loaded_layer(bits, groups, kernel=kernel)
    x = torch.randn(3, COLS).to(torch.bfloat16)
    logits = method.apply(layer, x)
    assert logits.shape == (3, ROWS) and logits.dtype == torch.bfloat16
    reference = x.float() @ torch.from_numpy(groups.dequantize()).t()
    assert torch.allclose(logits.float(), reference, rtol=2e-2, atol=2e-2 * float(reference.abs().max()))


@needs_wna16
def test_the_wna16_layout_is_the_one_vllms_cpu_kernel_reads() -> None:
    from vllm import _custom_ops as ops

    groups = _groups(4, seed=2)
    packed = packed_tensors("e", groups, bits=4)["e.weight_packed"]
    assert torch.equal(vllm_plugin.unpack_rows(packed) - 8, torch.from_numpy(groups.q).int())
    blocked = vllm_plugin.to_wna16_blocks(packed)
    ids = torch.arange(ROWS)
    assert torch.equal(vllm_plugin.gather_blocked_rows(blocked, ids) - 8, torch.from_numpy(groups.q).int())
    scales = torch.from_numpy(groups.scale).to(torch.bfloat16).t().contiguous()
    eye = torch.eye(COLS, dtype=torch.bfloat16)  # x = I: the kernel returns the matrix it holds, transposed
    held = ops.cpu_gemm_wna16(input=eye, q_weight=blocked, scales=scales, zeros=None, bias=None, pack_factor=8,
                              isa_hint="vec")  # fmt: skip
    assert torch.equal(held.t().float(), torch.from_numpy(groups.dequantize()).to(torch.bfloat16).float())


def test_other_widths_and_misaligned_groups_are_refused() -> None:
    with pytest.raises(ValueError, match="6 bits"):
        vllm_plugin.QuantizedTiedEmbedding(num_bits=6, group_size=32)
    method = vllm_plugin.QuantizedTiedEmbedding(num_bits=4, group_size=48)
    with pytest.raises(ValueError, match="not a multiple of the group size 48"):
        method.create_weights(torch.nn.Module(), 64, [32], 64, 32, torch.bfloat16, weight_loader=None)


def test_lm_head_is_the_quantized_embedding_itself() -> None:
    layer, method = _loaded_layer(4, _groups(4), kernel=WNA16)  # what this CPU runs
    layer.quant_method = method
    head = torch.nn.Module()
    assert vllm_plugin.TiedHead().tie_weights(head, layer) is layer
    plain = torch.nn.Module()
    with pytest.raises(ValueError, match="only when the embedding is quantized"):
        vllm_plugin.TiedHead().tie_weights(head, plain)
    with pytest.raises(ValueError, match="must be tied"):
        vllm_plugin.TiedHead().apply(head, torch.zeros(1, COLS))


def test_the_plugin_claims_compressed_tensors_checkpoints_only_when_asked() -> None:
    vllm_plugin.register()
    vllm_plugin.register()  # idempotent: vLLM loads plugins in every process, sometimes twice
    from vllm.model_executor.layers.quantization import get_quantization_config

    config = get_quantization_config(vllm_plugin.NAME)
    assert vllm_plugin.NAME == schemes.PLUGIN_METHOD
    checkpoint = {"quant_method": "compressed-tensors"}
    assert config.override_quantization_method(checkpoint, vllm_plugin.NAME) == vllm_plugin.NAME
    assert config.override_quantization_method(checkpoint, "compressed-tensors") is None
    assert config.override_quantization_method({"quant_method": "awq"}, vllm_plugin.NAME) is None


def test_tied_storage_is_counted_once() -> None:
    model = torch.nn.Module()
    model.a = torch.nn.Linear(4, 8, bias=False)
    model.b = torch.nn.Linear(4, 8, bias=False)
    model.b.weight = model.a.weight
    assert vllm_plugin.model_tensor_bytes(model) == 8 * 4 * 4


def test_the_weight_line_round_trips() -> None:
    lines = [
        weight_bytes_line(tensor_bytes=12, rss_bytes=-3, anon_bytes=1),
        weight_bytes_line(tensor_bytes=5, rss_bytes=7, anon_bytes=-2),
    ]
    log = "x\n" + "\n".join(lines)
    assert parse_weight_bytes(log) == (5, 7, -2)
    assert parse_weight_bytes("no report") is None
