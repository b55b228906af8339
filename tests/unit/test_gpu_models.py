"""Model directories of the GPU tier: config.json + tokenizer links, a PEFT LoRA adapter of the right shapes,
and the fallback tokenizer of the same vocabulary size."""

from __future__ import annotations

import json
from pathlib import Path

from safetensors.numpy import load_file

from fleetgate.bench.gpu.models import (
    LORA_TARGETS,
    make_lora_adapter,
    model_config,
    prepare_models,
    write_fallback_tokenizer,
)


def test_directories_hold_the_config_and_link_the_tokenizer(tmp_path: Path) -> None:
    tokenizer = write_fallback_tokenizer(folder=tmp_path / "tok", vocab_size=1000)
    dirs = prepare_models(root=tmp_path / "models", tokenizer_dir=tokenizer, names=["llama-3.1-8b", "gemma-3-12b"])
    assert json.loads((dirs["gemma-3-12b"] / "config.json").read_text()) == model_config("gemma-3-12b")
    link = dirs["llama-3.1-8b"] / "tokenizer.json"
    assert link.is_symlink() and link.resolve() == (tokenizer / "tokenizer.json").resolve()


def test_lora_adapter_matches_the_base_shapes(tmp_path: Path) -> None:
    base = model_config("llama-3.1-8b-vocab128k")
    folder = make_lora_adapter(folder=tmp_path / "adapter", base_config=base, rank=8)
    config = json.loads((folder / "adapter_config.json").read_text())
    assert (config["peft_type"], config["r"], tuple(config["target_modules"])) == ("LORA", 8, LORA_TARGETS)
    tensors = load_file(str(folder / "adapter_model.safetensors"))
    assert len(tensors) == base["num_hidden_layers"] * len(LORA_TARGETS) * 2
    layer = "base_model.model.model.layers.31"
    assert tensors[f"{layer}.self_attn.k_proj.lora_A.weight"].shape == (8, 4096)
    assert tensors[f"{layer}.self_attn.k_proj.lora_B.weight"].shape == (1024, 8)  # 8 KV heads x 128
    assert tensors[f"{layer}.mlp.down_proj.lora_A.weight"].shape == (8, 14336)


def test_fallback_tokenizer_has_the_vocabulary_size(tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    folder = write_fallback_tokenizer(folder=tmp_path / "tok", vocab_size=5000)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    assert tokenizer.get_vocab_size() == 5000
    assert tokenizer.encode("w10 w4999 hello").ids == [10, 4999, 3]  # unknown words map to <unk>
