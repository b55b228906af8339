"""LoRA on a vocabulary above 258,048 tokens: vLLM refuses to start ("When using LoRA, vocab size must be
<= 258048", vLLM 0.26 and 0.32 `lora/layers/logits_processor.py`, seen on vLLM CPU with a 262,144-token
Llama-shaped model), so the operator refuses the spec; a tied embedding (Gemma 3) is let through."""

from __future__ import annotations

from typing import Any

import pytest

from fleetgate.bench.gpu.matrix import architecture
from fleetgate.core.errors import ConfigError
from fleetgate.operator.profiles import Profiles
from fleetgate.operator.resolve import resolve
from fleetgate.operator.spec import parse_spec


def _spec(shape: str, **engine: Any) -> Any:
    return parse_spec({"model": {"source": f"/models/{shape}", "architecture": architecture(shape)},
                       "engine": engine, "resources": {"accelerator": "nvidia-h100-80gb", "gpus": 1}})  # fmt: skip


def test_lora_on_a_262k_vocabulary_with_its_own_lm_head_is_refused() -> None:
    with pytest.raises(ConfigError, match="vLLM refuses LoRA above 258048 tokens"):
        resolve(spec=_spec("llama-3.1-8b", maxAdapters=2), name="llama", profiles=Profiles())


def test_the_same_model_without_lora_or_with_its_real_vocabulary_is_fine() -> None:
    assert resolve(spec=_spec("llama-3.1-8b"), name="llama", profiles=Profiles()).plan is not None
    assert resolve(spec=_spec("llama-3.1-8b-vocab128k", maxAdapters=2), name="llama", profiles=Profiles()).plan


def test_tied_embeddings_are_let_through() -> None:
    # Gemma 3 (262,144 tokens, tied) computes logits from its embedding: vLLM has no lm_head to wrap.
    assert resolve(spec=_spec("gemma-3-12b", maxAdapters=2), name="gemma", profiles=Profiles()).plan is not None
