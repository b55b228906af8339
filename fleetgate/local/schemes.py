"""The local model's weight quantization schemes and the vLLM `--quantization` method each needs.

Names only, no imports: `model_prep` (which prepares a scheme's checkpoint), `quantize` (which writes the
round-to-nearest ones), `vllm_command` (which starts an engine on one) and the CLI all read them here, so
none of them imports another for a constant (and the CLI needs no torch import to list the choices).
"""

from __future__ import annotations

from typing import Final

# Made by `gptq_recipe.py` in a quantizer environment of its own (llmcompressor's pins clash with vLLM's).
GPTQ_SCHEME: Final = "w4a16-gptq"
# Built from the GGUF's own blocks by `fleetgate.local.gguf_quantize` (keys of its GGUF_SCHEMES).
GGUF_QUANTIZATIONS: Final = ("w4a16-gguf", "gguf-e4", "gguf-e8")
# Round to nearest, made in-process by `fleetgate.local.quantize` (keys of its SCHEMES), then the others.
QUANTIZATIONS: Final = ("w4a16", "w8a8", GPTQ_SCHEME, *GGUF_QUANTIZATIONS)
# vLLM's `--quantization` value for checkpoints written by compressed-tensors.
VLLM_METHOD: Final = "compressed-tensors"
# ... and for those whose tied embedding is quantized too (`fleetgate.local.vllm_plugin.NAME`).
PLUGIN_METHOD: Final = "fleetgate-ct"


def vllm_method(scheme: str) -> str | None:
    """vLLM's `--quantization` for a checkpoint of `prepare-model --quantization scheme` (None: bf16)."""
    if scheme == "none":
        return None
    return PLUGIN_METHOD if scheme in GGUF_QUANTIZATIONS else VLLM_METHOD
