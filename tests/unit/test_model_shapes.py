"""Model shapes for `--load-format dummy`: the architecture's config with the Gemma tokenizer beside it."""

from __future__ import annotations

import json
import lzma
from pathlib import Path

import pytest

from fleetgate.engine.shapes import GEMMA_VOCAB, shape_config, write_dummy_model


def test_llama_31_8b_has_the_published_architecture_and_the_gemma_vocabulary() -> None:
    config = shape_config("llama-3.1-8b")
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["intermediate_size"]) == (32, 4096, 32, 8, 14336)
    assert config["vocab_size"] == GEMMA_VOCAB == 262_144
    assert (config["bos_token_id"], config["eos_token_id"]) == (2, 1)
    config["vocab_size"] = 1  # a copy: the shape itself is untouched
    assert shape_config("llama-3.1-8b")["vocab_size"] == GEMMA_VOCAB


def test_unknown_shape_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"known: llama-3\.1-8b"):
        shape_config("llama-9")


def test_writes_the_config_and_unpacks_a_compressed_tokenizer(tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    tok.mkdir()
    (tok / "tokenizer.json.xz").write_bytes(lzma.compress(b'{"model": {"type": "BPE"}}'))
    (tok / "tokenizer_config.json").write_text('{"tokenizer_class": "GemmaTokenizer"}')
    out = write_dummy_model(tmp_path / "model", shape="llama-3.1-8b", tokenizer_dir=tok)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "tokenizer.json", "tokenizer_config.json"]
    assert json.loads((out / "tokenizer.json").read_text()) == {"model": {"type": "BPE"}}
    assert json.loads((out / "config.json").read_text())["model_type"] == "llama"


def test_no_tokenizer_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no tokenizer\.json"):
        write_dummy_model(tmp_path / "model", shape="llama-3.1-8b", tokenizer_dir=tmp_path)
