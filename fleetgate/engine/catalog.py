"""Built-in architecture facts of common open models, for capacity plans without a config.json.

Figures come from each model's published `config.json` (num_hidden_layers, num_key_value_heads, head_dim
or hidden_size / num_attention_heads, hidden_size, vocab_size, tie_word_embeddings, num_attention_heads
where it is not hidden_size / head_dim) and model card (parameter count). `lookup` matches a
model reference (`hf://org/name`, `org/name`, a local path) by its last path segment, case-insensitive,
ignoring common packaging suffixes (-Instruct, -chat-hf, -AWQ, -GPTQ, -FP8, -it, ...).
"""

from __future__ import annotations

import re
from types import MappingProxyType

from fleetgate.engine.capacity import ModelArch

_B = 10**9


def _arch(
    params_b: float, layers: int, kv_heads: int, head_dim: int, hidden: int, vocab: int, *, tied: bool = False,
    heads: int | None = None,
) -> ModelArch:
    return ModelArch(
        parameters=params_b * _B, layers=layers, kv_heads=kv_heads, head_dim=head_dim, hidden_size=hidden,
        vocab_size=vocab, tied_embeddings=tied, attention_heads=heads,
    )  # fmt: skip


CATALOG: MappingProxyType[str, ModelArch] = MappingProxyType(
    {
        "llama-2-7b": _arch(6.74, 32, 32, 128, 4096, 32000),
        "llama-2-13b": _arch(13.0, 40, 40, 128, 5120, 32000),
        "llama-2-70b": _arch(68.98, 80, 8, 128, 8192, 32000),
        "meta-llama-3-8b": _arch(8.03, 32, 8, 128, 4096, 128256),
        "meta-llama-3-70b": _arch(70.55, 80, 8, 128, 8192, 128256),
        "llama-3.1-8b": _arch(8.03, 32, 8, 128, 4096, 128256),
        "llama-3.1-70b": _arch(70.55, 80, 8, 128, 8192, 128256),
        "llama-3.3-70b": _arch(70.55, 80, 8, 128, 8192, 128256),
        "llama-3.2-1b": _arch(1.24, 16, 8, 64, 2048, 128256, tied=True),
        "llama-3.2-3b": _arch(3.21, 28, 8, 128, 3072, 128256, tied=True),
        "mistral-7b": _arch(7.24, 32, 8, 128, 4096, 32768),
        "mixtral-8x7b": _arch(46.7, 32, 8, 128, 4096, 32000),
        "qwen2.5-0.5b": _arch(0.49, 24, 2, 64, 896, 151936, tied=True),
        "qwen2.5-1.5b": _arch(1.54, 28, 2, 128, 1536, 151936, tied=True),
        "qwen2.5-7b": _arch(7.62, 28, 4, 128, 3584, 152064),
        "qwen2.5-14b": _arch(14.7, 48, 8, 128, 5120, 152064),
        "qwen2.5-32b": _arch(32.5, 64, 8, 128, 5120, 152064),
        "qwen2.5-72b": _arch(72.7, 80, 8, 128, 8192, 152064),
        "gemma-3-270m": _arch(0.268, 18, 1, 256, 640, 262144, tied=True, heads=4),
        "gemma-3-1b": _arch(1.0, 26, 1, 256, 1152, 262144, tied=True, heads=4),
    }
)

_SUFFIX = re.compile(
    r"(-(instruct|chat|hf|it|base|awq|gptq|fp8|int4|int8|gguf|q4_k_m|v0\.\d|\d{4}))+$",
)
_ALIASES: MappingProxyType[str, str] = MappingProxyType(
    {
        "llama-3-8b": "meta-llama-3-8b",
        "llama-3-70b": "meta-llama-3-70b",
        "meta-llama-3.1-8b": "llama-3.1-8b",
        "meta-llama-3.1-70b": "llama-3.1-70b",
    }
)


def normalize(model: str) -> str:
    """`hf://meta-llama/Llama-2-7b-chat-hf` -> `llama-2-7b`."""
    name = model.rstrip("/").rsplit("/", 1)[-1].lower()
    previous = None
    while previous != name:
        previous = name
        name = _SUFFIX.sub("", name)
    return _ALIASES.get(name, name)


def lookup(model: str) -> ModelArch | None:
    """Architecture facts for a model reference, or None when the catalog does not know it."""
    return CATALOG.get(normalize(model))
