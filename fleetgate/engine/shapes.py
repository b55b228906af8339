"""Model *shapes* for engines run with `--load-format dummy`: a real architecture's `config.json`, no weights.

vLLM builds the model from `config.json` alone and fills it with random weights, which is right for
capacity, memory, throughput, latency and routing (prefix caching works on token ids) and wrong for
quality. Without a model hub, the tokenizer is one we have (the packaged Gemma 3 tokenizer), so
`vocab_size` is set to its 262,144 entries and the special token ids to Gemma's. Architecture figures are
the published ones (Llama 3.1 8B: 32 layers, hidden 4096, 32 query heads, 8 KV heads, MLP 14,336,
RoPE theta 500,000 with llama3 scaling, 128k context). The larger vocabulary adds about 2.1 GB of
embedding and LM-head weights to the original 16 GB in bf16.

`write_dummy_model(dest, shape=..., tokenizer_dir=...)` writes a model directory vLLM can serve:
the shape's `config.json` plus the tokenizer files copied (or, for `tokenizer.json.xz`, decompressed).
"""

from __future__ import annotations

import json
import lzma
import shutil
from pathlib import Path
from types import MappingProxyType
from typing import Any

GEMMA_VOCAB = 262_144
GEMMA_SPECIAL = {"bos_token_id": 2, "eos_token_id": 1, "pad_token_id": 0}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja")

_LLAMA_31_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "initializer_range": 0.02,
    "max_position_embeddings": 131072,
    "mlp_bias": False,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "pretraining_tp": 1,
    "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "use_cache": True,
    "vocab_size": GEMMA_VOCAB,
    **GEMMA_SPECIAL,
}

SHAPES: MappingProxyType[str, MappingProxyType[str, Any]] = MappingProxyType(
    {"llama-3.1-8b": MappingProxyType(_LLAMA_31_8B)}
)


def shape_config(shape: str) -> dict[str, Any]:
    try:
        return json.loads(json.dumps(dict(SHAPES[shape])))  # a deep, plain copy
    except KeyError:
        raise ValueError(f"unknown model shape {shape!r}; known: {', '.join(sorted(SHAPES))}") from None


def write_dummy_model(dest: Path, *, shape: str, tokenizer_dir: Path) -> Path:
    """Write `dest/config.json` for `shape` and the tokenizer files found in `tokenizer_dir` (a missing
    `tokenizer.json` may come as `tokenizer.json.xz`). Raises FileNotFoundError without a tokenizer."""
    config = shape_config(shape)
    dest.mkdir(parents=True, exist_ok=True)
    found = False
    for name in TOKENIZER_FILES:
        src = tokenizer_dir / name
        packed = tokenizer_dir / f"{name}.xz"
        if src.is_file():
            shutil.copyfile(src, dest / name)
        elif packed.is_file():
            with lzma.open(packed) as fin, open(dest / name, "wb") as fout:
                shutil.copyfileobj(fin, fout)
        else:
            continue
        found = found or name == "tokenizer.json"
    if not found:
        raise FileNotFoundError(f"no tokenizer.json (or tokenizer.json.xz) in {tokenizer_dir}")
    (dest / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return dest
