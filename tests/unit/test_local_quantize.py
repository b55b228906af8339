"""Quantized checkpoints: real compressed-tensors on a tiny random Gemma 3 (no model download), and the
prepare-model / engine wiring around it. Serving one on the real engine is in tests/e2e."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fleetgate.local import model_prep
from fleetgate.local.config import EngineConfig
from fleetgate.local.errors import ModelPrepError
from fleetgate.local.quant_bench import agreement
from fleetgate.local.quantize import SCHEMES, quantize_checkpoint
from fleetgate.local.schemes import VLLM_METHOD
from fleetgate.local.vllm_command import engine_args


@pytest.fixture(scope="module")
def tiny_gemma(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1, head_dim=64, sliding_window=32, max_position_embeddings=256,
    )  # fmt: skip
    path = tmp_path_factory.mktemp("tiny-gemma")
    Gemma3ForCausalLM(config).to(torch.bfloat16).save_pretrained(path)
    return path


def _tensors(path: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return dict(load_file(str(path / "model.safetensors")))


def test_scheme_keys_match_the_cli_choices() -> None:
    from fleetgate.local.gguf_quantize import GGUF_SCHEMES

    assert (*SCHEMES, model_prep.GPTQ_SCHEME, *GGUF_SCHEMES) == model_prep.QUANTIZATIONS
    assert tuple(GGUF_SCHEMES) == model_prep.GGUF_QUANTIZATIONS


def test_gptq_without_a_quantizer_python_says_how_to_get_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(model_prep.QUANTIZER_PYTHON_ENV, raising=False)
    with pytest.raises(ModelPrepError, match=r"own environment.*pip install .*llmcompressor.*--quantizer-python"):
        model_prep.prepare_model(cache_dir=tmp_path, quantization="w4a16-gptq")


def test_w4a16_packs_eight_weights_per_int32_with_group_scales(tiny_gemma: Path, tmp_path: Path) -> None:
    import torch

    assert quantize_checkpoint(source=tiny_gemma, out_dir=tmp_path, scheme="w4a16") == 2 * 7  # q k v o gate up down
    config = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == VLLM_METHOD and config["format"] == "pack-quantized"
    assert config["config_groups"]["group_0"]["weights"]["num_bits"] == 4
    assert config["config_groups"]["group_0"]["weights"]["group_size"] == 128
    assert "lm_head" in config["ignore"]
    tensors = _tensors(tmp_path)
    original = _tensors(tiny_gemma)
    name = "model.layers.0.mlp.up_proj"
    packed, scale = tensors[f"{name}.weight_packed"], tensors[f"{name}.weight_scale"]
    assert isinstance(packed, torch.Tensor) and isinstance(scale, torch.Tensor)
    weight = original[f"{name}.weight"]
    assert isinstance(weight, torch.Tensor)
    assert packed.dtype == torch.int32 and packed.shape == (weight.shape[0], weight.shape[1] // 8)
    assert scale.shape == (weight.shape[0], weight.shape[1] // 128)
    # symmetric 4-bit: the largest magnitude of each group maps to 7.5 steps of its scale
    groups = weight.float().reshape(weight.shape[0], -1, 128).abs().amax(-1)
    assert torch.allclose(scale.float(), groups / 7.5, rtol=1e-2)


def test_w8a8_stores_int8_weights_with_channel_scales(tiny_gemma: Path, tmp_path: Path) -> None:
    import torch

    quantize_checkpoint(source=tiny_gemma, out_dir=tmp_path, scheme="w8a8")
    config = json.loads((tmp_path / "config.json").read_text())["quantization_config"]
    assert config["format"] == "int-quantized"
    assert config["config_groups"]["group_0"]["input_activations"]["dynamic"] is True
    tensors = _tensors(tmp_path)
    weight = tensors["model.layers.1.self_attn.o_proj.weight"]
    scale = tensors["model.layers.1.self_attn.o_proj.weight_scale"]
    original = _tensors(tiny_gemma)["model.layers.1.self_attn.o_proj.weight"]
    assert isinstance(weight, torch.Tensor) and isinstance(scale, torch.Tensor) and isinstance(original, torch.Tensor)
    assert weight.dtype == torch.int8 and scale.shape == (weight.shape[0], 1)
    # dequantized weights stay within half a step of the originals
    error = (weight.float() * scale.float() - original.float()).abs()
    assert bool((error <= scale.float() * 0.5 + 1e-3).all())
    assert tensors["model.embed_tokens.weight"].dtype == torch.bfloat16  # type: ignore[union-attr]


def test_unknown_scheme_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ModelPrepError, match=r"unknown quantization 'int3'.*w4a16"):
        model_prep.prepare_model(cache_dir=tmp_path, quantization="int3")


def test_quantized_dir_is_named_for_the_scheme(tmp_path: Path) -> None:
    assert model_prep.model_dir(cache_dir=tmp_path, quantization="w4a16") == tmp_path / "models" / "gemma-3-270m-w4a16"


def test_engine_serves_a_quantized_checkpoint_with_compressed_tensors(tmp_path: Path) -> None:
    argv = engine_args(config=EngineConfig(quantization="w8a8"), model_path=tmp_path, port=1).to_argv()
    assert argv[argv.index("--quantization") + 1] == "compressed-tensors"
    # a quantized tied embedding needs FleetGate's plugin reading of compressed-tensors
    argv = engine_args(config=EngineConfig(quantization="w4a16-gguf"), model_path=tmp_path, port=1).to_argv()
    assert argv[argv.index("--quantization") + 1] == "fleetgate-ct"
    assert "--quantization" not in engine_args(config=EngineConfig(), model_path=tmp_path, port=1).to_argv()


def test_greedy_agreement_counts_up_to_the_first_divergence() -> None:
    assert agreement(["a", "b", "c", "d"], ["a", "b", "c", "d"]) == 1.0
    assert agreement(["a", "b", "c", "d"], ["a", "x", "c", "d"]) == 0.25
    assert agreement(["a", "b"], []) == 0.0
