"""GGUF blocks -> group-wise integers: exact for Q8_0/Q5_0 (checked against the `gguf` package's own
quantizer and dequantizer on synthetic blocks), bounded error for 4-bit groups of Q4_K/Q6_K sources."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from fleetgate.local import gguf_blocks
from fleetgate.local.gguf_quantize import EMBEDDING, GGUF_SCHEMES, hf_name, quantization_config


def _weights(rows: int, cols: int, seed: int) -> Any:
    rng = np.random.default_rng(seed)
    # heavy-tailed values with per-row magnitudes, like real weights; a few exact zeros and extremes
    w = rng.standard_t(4, size=(rows, cols)).astype(np.float32) * rng.uniform(0.001, 0.2, size=(rows, 1))
    w[0, :32] = 0.0
    w[1, 5] = 40.0
    return w.astype(np.float32)


@pytest.mark.parametrize(("kind", "convert"), [("Q8_0", gguf_blocks.q8_0_blocks), ("Q5_0", gguf_blocks.q5_0_blocks)])
def test_q8_0_and_q5_0_blocks_convert_to_int8_groups_bit_for_bit(kind: str, convert: Any) -> None:
    rows, cols = 48, 256
    raw = quantize(_weights(rows, cols, seed=1), GGMLQuantizationType[kind])
    reference = gguf_blocks.dequantize(raw, type_name=kind)
    groups = convert(raw, rows=rows, cols=cols)
    assert groups.q.dtype == np.int8 and groups.q.shape == (rows, cols)
    assert groups.scale.dtype == np.float16 and groups.scale.shape == (rows, cols // 32)
    limit = 127 if kind == "Q8_0" else 16
    assert int(np.abs(groups.q).max()) <= limit
    ours = groups.dequantize()
    assert ours.dtype == np.float32
    assert np.array_equal(ours.view(np.uint32), reference.view(np.uint32))  # bit for bit, zeros' signs included


def test_a_byte_count_that_is_not_whole_blocks_is_refused() -> None:
    raw = quantize(_weights(4, 64, seed=2), GGMLQuantizationType.Q8_0)
    with pytest.raises(ValueError, match="not 4x96 weights"):
        gguf_blocks.q8_0_blocks(raw, rows=4, cols=96)
    with pytest.raises(ValueError, match="blocks of 22 bytes"):
        gguf_blocks.q5_0_blocks(raw, rows=4, cols=64)


def _k_quant_bytes(kind: str, rows: int, cols: int, seed: int) -> Any:
    """Random but valid Q4_K / Q6_K super-blocks (the `gguf` package cannot quantize to them)."""
    rng = np.random.default_rng(seed)
    size = {"Q4_K": 144, "Q6_K": 210}[kind]
    blocks = rng.integers(0, 256, size=(rows * cols // 256, size), dtype=np.uint8)
    d = rng.uniform(1e-4, 1e-2, size=(blocks.shape[0], 2)).astype(np.float16).view(np.uint8)
    if kind == "Q4_K":
        blocks[:, 0:4] = d  # d and dmin lead the block
    else:
        blocks[:, 208:210] = d[:, :2]  # d ends the block
    return blocks.reshape(rows, -1)


@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K"])
def test_4bit_groups_of_k_quant_sources_stay_within_half_a_step(kind: str) -> None:
    rows, cols = 16, 512
    exact = gguf_blocks.dequantize(_k_quant_bytes(kind, rows, cols, seed=3), type_name=kind)
    assert np.isfinite(exact).all()
    groups = gguf_blocks.int4_groups(exact)
    assert groups.q.min() >= -8 and groups.q.max() <= 7
    scale = groups.scale
    assert np.array_equal(gguf_blocks._bf16(scale), scale)  # stored as bf16 without further rounding
    error = np.abs(groups.dequantize() - exact).reshape(rows, cols // 32, 32)
    # within the grid, round to nearest: half a step; the chosen scale covers at least 80% of max|w|
    amax = np.abs(exact).reshape(rows, cols // 32, 32).max(-1)
    assert (error.max(-1) <= np.maximum(scale / 2, amax - 7 * scale) * (1 + 1e-6)).all()
    relative = np.sqrt((error**2).mean()) / np.sqrt((exact**2).mean())
    assert relative < 0.2, relative


def test_scale_search_is_never_worse_than_max_over_8() -> None:
    w = _weights(64, 128, seed=4)
    searched = gguf_blocks.int4_groups(w)
    grouped = w.reshape(64, 4, 32)
    plain = gguf_blocks._bf16(np.maximum(np.abs(grouped).max(-1) / 8, 1e-12))
    naive = np.clip(np.rint(grouped / plain[..., None]), -8, 7) * plain[..., None]
    err_searched = ((searched.dequantize().reshape(64, 4, 32) - grouped) ** 2).sum(-1)
    err_naive = ((naive - grouped) ** 2).sum(-1)
    assert (err_searched <= err_naive * (1 + 1e-6)).all()
    assert err_searched.sum() < err_naive.sum()


def test_bf16_rounding_is_to_nearest_even() -> None:
    values = np.array([1.0, 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-8, 3.14159], dtype=np.float32)
    assert gguf_blocks._bf16(values).tolist() == [1.0, 1.0, 1.0 + 2.0**-6, 3.140625]


def test_gguf_names_map_to_the_hf_layout() -> None:
    assert hf_name("token_embd.weight") == EMBEDDING
    assert hf_name("blk.17.attn_output.weight") == "model.layers.17.self_attn.o_proj.weight"
    assert hf_name("blk.0.ffn_down.weight") == "model.layers.0.mlp.down_proj.weight"
    assert hf_name("blk.0.attn_norm.weight") is None and hf_name("output_norm.weight") is None


def test_quantization_config_describes_the_embedding_as_a_compressed_tensors_group() -> None:
    config = quantization_config(GGUF_SCHEMES["w4a16-gguf"])
    assert config["quant_method"] == "compressed-tensors"
    embedding, linear = config["config_groups"]["embedding"], config["config_groups"]["linear"]
    assert embedding["targets"] == ["re:.*embed_tokens$"] and linear["targets"] == ["Linear"]
    assert embedding["weights"]["num_bits"] == 4 and linear["weights"]["group_size"] == 32
    only_embedding = quantization_config(GGUF_SCHEMES["gguf-e8"])
    assert set(only_embedding["config_groups"]) == {"embedding"}
    assert only_embedding["config_groups"]["embedding"]["weights"]["num_bits"] == 8
