"""`build_checkpoint` on a synthetic GGUF (written with the `gguf` package) and a matching bf16 directory:
what each scheme writes, and the refusal of a GGUF that does not match the bf16 model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize
from safetensors.torch import load_file, save_file

from fleetgate.local import gguf_blocks
from fleetgate.local.errors import ModelPrepError
from fleetgate.local.gguf_quantize import build_checkpoint

VOCAB, HIDDEN, OUT = 64, 128, 96
Q_PROJ = "model.layers.0.self_attn.q_proj"


def _write(tmp_path: Path, *, tie: bool = True, scramble: bool = False) -> tuple[Path, Path, Any]:
    rng = np.random.default_rng(0)
    embed = quantize(rng.normal(0, 0.05, (VOCAB, HIDDEN)).astype(np.float32), GGMLQuantizationType.Q8_0)
    q_proj = quantize(rng.normal(0, 0.05, (OUT, HIDDEN)).astype(np.float32), GGMLQuantizationType.Q5_0)
    gguf_path = tmp_path / "tiny.gguf"
    writer = GGUFWriter(str(gguf_path), "gemma3")
    writer.add_tensor("token_embd.weight", embed, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.add_tensor("blk.0.attn_q.weight", q_proj, raw_dtype=GGMLQuantizationType.Q5_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    base = tmp_path / "bf16"
    base.mkdir()
    embed_values = gguf_blocks.dequantize(embed, type_name="Q8_0")
    q_values = gguf_blocks.dequantize(q_proj, type_name="Q5_0")
    if scramble:  # e.g. a transposed or permuted layout
        q_values = q_values[::-1].copy()
    save_file(
        {
            "model.embed_tokens.weight": torch.from_numpy(embed_values).to(torch.bfloat16),
            f"{Q_PROJ}.weight": torch.from_numpy(q_values).to(torch.bfloat16),
            "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        },
        str(base / "model.safetensors"),
    )
    (base / "config.json").write_text(json.dumps({"tie_word_embeddings": tie, "hidden_size": HIDDEN}))
    return gguf_path, base, (embed, embed_values, q_values)


def test_gguf_e8_keeps_the_q8_0_embedding_exactly_and_the_linears_in_bf16(tmp_path: Path) -> None:
    gguf_path, base, (_, embed_values, _) = _write(tmp_path)
    out = tmp_path / "out"
    assert build_checkpoint(gguf_path=gguf_path, base=base, out_dir=out, scheme="gguf-e8") == 1
    tensors = load_file(str(out / "model.safetensors"))
    assert "model.embed_tokens.weight" not in tensors
    packed, scale = tensors["model.embed_tokens.weight_packed"], tensors["model.embed_tokens.weight_scale"]
    assert packed.dtype == torch.int32 and packed.shape == (VOCAB, HIDDEN // 4)
    assert scale.dtype == torch.float16
    shifts = torch.arange(0, 32, 8, dtype=torch.int32)
    q = (((packed.unsqueeze(-1) >> shifts) & 255).reshape(VOCAB, HIDDEN) - 128).to(torch.int8)
    rebuilt = gguf_blocks.GroupInt(q=q.numpy(), scale=scale.numpy()).dequantize()
    assert np.array_equal(rebuilt, embed_values)  # the GGUF's values, not bf16's rounding of them
    assert tensors[f"{Q_PROJ}.weight"].dtype == torch.bfloat16 and tensors["model.norm.weight"].dtype == torch.bfloat16
    config = json.loads((out / "config.json").read_text())
    assert config["hidden_size"] == HIDDEN
    assert set(config["quantization_config"]["config_groups"]) == {"embedding"}


def test_w4a16_gguf_packs_linears_and_embedding_in_4_bits(tmp_path: Path) -> None:
    gguf_path, base, (_, embed_values, q_values) = _write(tmp_path)
    out = tmp_path / "out"
    assert build_checkpoint(gguf_path=gguf_path, base=base, out_dir=out, scheme="w4a16-gguf") == 2
    tensors = load_file(str(out / "model.safetensors"))
    for prefix, exact in (("model.embed_tokens", embed_values), (Q_PROJ, q_values)):
        packed, scale = tensors[f"{prefix}.weight_packed"], tensors[f"{prefix}.weight_scale"]
        assert packed.shape == (exact.shape[0], HIDDEN // 8) and scale.dtype == torch.bfloat16
        assert tensors[f"{prefix}.weight_shape"].tolist() == list(exact.shape)
        shifts = torch.arange(0, 32, 4, dtype=torch.int32)
        q = ((packed.unsqueeze(-1) >> shifts) & 15).reshape(exact.shape[0], HIDDEN) - 8
        rebuilt = gguf_blocks.GroupInt(q=q.numpy().astype(np.int8), scale=scale.float().numpy()).dequantize()
        assert np.abs(rebuilt - exact).max() <= np.abs(exact).max() / 8  # within a 4-bit step of the GGUF
    assert set(json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]) == {
        "embedding",
        "linear",
    }


def test_a_gguf_that_does_not_match_the_bf16_model_is_refused(tmp_path: Path) -> None:
    gguf_path, base, _ = _write(tmp_path, scramble=True)
    with pytest.raises(ModelPrepError, match="does not match the bf16 model"):
        build_checkpoint(gguf_path=gguf_path, base=base, out_dir=tmp_path / "out", scheme="gguf-e8")


def test_an_untied_model_is_refused(tmp_path: Path) -> None:
    gguf_path, base, _ = _write(tmp_path, tie=False)
    with pytest.raises(ModelPrepError, match="untied"):
        build_checkpoint(gguf_path=gguf_path, base=base, out_dir=tmp_path / "out", scheme="gguf-e4")
    assert not (tmp_path / "out").exists()  # refused before any work
