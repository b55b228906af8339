"""Architecture facts for the capacity plan, read from a model's Hugging Face `config.json`.

The plan needs what sets memory use: the parameter count (weights), layers, KV heads and head size (KV
cache), hidden and intermediate sizes and the vocabulary (activations, 16-bit embeddings of quantized
checkpoints), sliding-window layers (Gemma 3's hybrid KV cache) and, for mixture-of-experts models, how
many experts each token visits. A config.json states all but the parameter count, which is computed here
for the decoder-only families below by summing every weight matrix:

- embeddings `V x H`, plus an lm_head of the same size unless `tie_word_embeddings`;
- per layer, attention: q `H x (heads x head_dim)`, k and v `H x (kv_heads x head_dim)` each, o the
  transpose of q; biases on q, k and v for Qwen2 (`attention_bias` elsewhere), and per-head q/k norms
  (`head_dim` each) for Gemma 3 and Qwen3;
- per layer, MLP: gate, up and down, `3 x H x I`; a mixture of experts has that per expert (with the
  expert's own intermediate size) plus a router `H x experts`, and Qwen2-MoE a shared expert with its gate;
- norms: 2 x H per layer (4 x H for Gemma 3), and the final norm.

Llama-3.1-8B gives 8,030,261,248, its model card's figure. `arch_facts` returns a `ModelArch`;
`parameter_count` the count alone. Unknown families raise `ConfigError` rather than guess.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fleetgate.core.errors import ConfigError
from fleetgate.engine.capacity import ModelArch

# model_type values whose weights follow the sum above.
DENSE_TYPES = frozenset({"llama", "mistral", "qwen2", "qwen3", "gemma3_text", "gemma3", "gemma2"})
MOE_TYPES = frozenset({"mixtral", "qwen2_moe", "qwen3_moe"})


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """Multimodal wrappers (Gemma 3 `Gemma3ForConditionalGeneration`) keep the language model in text_config."""
    inner = config.get("text_config")
    return inner if isinstance(inner, Mapping) else config


def _int(config: Mapping[str, Any], key: str, default: int | None = None) -> int:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigError(f"config.json: {key} must be a non-negative integer, got {value!r}")
    return value


def _head_dim(config: Mapping[str, Any]) -> int:
    explicit = config.get("head_dim")
    if isinstance(explicit, int) and explicit > 0:
        return explicit
    return _int(config, "hidden_size") // _int(config, "num_attention_heads")


def _attention_parameters(config: Mapping[str, Any], model_type: str) -> int:
    hidden, heads = _int(config, "hidden_size"), _int(config, "num_attention_heads")
    kv_heads, head_dim = _int(config, "num_key_value_heads", heads), _head_dim(config)
    q, kv = heads * head_dim, kv_heads * head_dim
    weights = hidden * q + 2 * hidden * kv + q * hidden
    bias = model_type in ("qwen2", "qwen2_moe") or bool(config.get("attention_bias"))
    if bias:
        weights += q + 2 * kv
    if model_type in ("gemma3_text", "gemma3", "qwen3", "qwen3_moe"):
        weights += 2 * head_dim  # q_norm and k_norm
    return weights


def _mlp_parameters(config: Mapping[str, Any], model_type: str) -> int:
    hidden = _int(config, "hidden_size")
    if model_type == "mixtral":
        experts = _int(config, "num_local_experts")
        return experts * 3 * hidden * _int(config, "intermediate_size") + hidden * experts
    if model_type in ("qwen2_moe", "qwen3_moe"):
        experts = _int(config, "num_experts")
        total = experts * 3 * hidden * _int(config, "moe_intermediate_size") + hidden * experts
        shared = _int(config, "shared_expert_intermediate_size", 0)
        if shared:
            total += 3 * hidden * shared + hidden  # the shared expert and its sigmoid gate
        return total
    return 3 * hidden * _int(config, "intermediate_size")


def parameter_count(config: Mapping[str, Any]) -> int:
    """Every weight of the decoder (embeddings, layers, norms, lm_head) for the families above."""
    text = _text_config(config)
    model_type = str(text.get("model_type", ""))
    if model_type not in DENSE_TYPES | MOE_TYPES:
        raise ConfigError(
            f"config.json: model_type {model_type!r} is not one whose parameters FleetGate can count "
            f"({', '.join(sorted(DENSE_TYPES | MOE_TYPES))}); give architecture.parametersBillions instead"
        )
    hidden, vocab, layers = _int(text, "hidden_size"), _int(text, "vocab_size"), _int(text, "num_hidden_layers")
    tied = bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))
    norms = (4 if model_type.startswith("gemma") else 2) * hidden
    per_layer = _attention_parameters(text, model_type) + _mlp_parameters(text, model_type) + norms
    return vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden


def _sliding(text: Mapping[str, Any]) -> tuple[int, int | None]:
    """(sliding-window layers, window) from `layer_types`, else Gemma 3's every-Nth-is-global pattern."""
    window = text.get("sliding_window")
    layer_types = text.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        count = sum(1 for t in layer_types if t == "sliding_attention")
        return (count, int(window)) if count and isinstance(window, int) else (0, None)
    pattern = text.get("sliding_window_pattern")
    if isinstance(pattern, int) and pattern > 1 and isinstance(window, int):
        layers = _int(text, "num_hidden_layers")
        return layers - layers // pattern, window
    return 0, None


def arch_facts(config: Mapping[str, Any]) -> ModelArch:
    """The `ModelArch` of a config.json (see the module docstring for what is read and computed)."""
    text = _text_config(config)
    sliding_layers, window = _sliding(text)
    model_type = str(text.get("model_type", ""))
    per_token = text.get("num_experts_per_tok") if model_type in MOE_TYPES else None
    intermediate_key = "moe_intermediate_size" if model_type in ("qwen2_moe", "qwen3_moe") else "intermediate_size"
    heads = _int(text, "num_attention_heads")
    return ModelArch(
        parameters=float(parameter_count(config)),
        layers=_int(text, "num_hidden_layers"),
        kv_heads=_int(text, "num_key_value_heads", heads),
        head_dim=_head_dim(text),
        hidden_size=_int(text, "hidden_size"),
        attention_heads=heads,
        vocab_size=_int(text, "vocab_size"),
        tied_embeddings=bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
        sliding_window_layers=sliding_layers,
        sliding_window=window,
        intermediate_size=_int(text, intermediate_key),
        experts_per_token=int(per_token) if isinstance(per_token, int) else None,
    )
