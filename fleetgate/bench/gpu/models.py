"""Model directories for `--load-format dummy`: a real architecture's config.json, a tokenizer, no weights.

vLLM builds the model from config.json and fills it with random weights, which is right for memory,
speed and capacity (not for answers). The configs are in `models/*.json` beside this module, written
from the published config.json of each model with two changes: `vocab_size` is 262,144 and the special
token ids are Gemma's, because every directory gets the packaged Gemma 3 tokenizer (so embeddings and
lm_head are larger than the real models'; the plan reads these configs, not the real ones). Quantized
shapes carry a `quantization_config` (AWQ, GPTQ: 4-bit, group 128), which the dummy loader honours
(integer weights stay uninitialised, scales random: right for memory and kernels). The GPTQ one names its
quantized modules (`modules_in_block_to_quantize`, as GPTQModel checkpoints do): without it vLLM 0.26 reads
them from the checkpoint's safetensors, finds none in a directory without weights and loads every layer in
16 bits (15.76 GiB on the H100, the 4-bit plan 6.66 GiB; second call, 2026-11-27).

`prepare_models` writes `<root>/<name>/` for each config with the tokenizer files linked in.
`make_lora_adapter` writes a random PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors)
for a Llama-shaped model, so LoRA is exercised without a hub. `write_fallback_tokenizer` makes a
word-level tokenizer of the same vocabulary size when the Gemma tokenizer is not at hand (recorded in the
results: the figures do not depend on it, prompts are sent as token ids).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
VOCAB_SIZE = 262144


def model_config(name: str) -> dict[str, Any]:
    """The config.json of a packaged model shape (`models/<name>.json`)."""
    text = resources.files("fleetgate.bench.gpu").joinpath("models", f"{name}.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def shape_names() -> list[str]:
    folder = resources.files("fleetgate.bench.gpu").joinpath("models")
    return sorted(p.name.removesuffix(".json") for p in folder.iterdir() if p.name.endswith(".json"))


def prepare_models(*, root: Path, tokenizer_dir: Path, names: list[str] | None = None) -> dict[str, Path]:
    """`<root>/<name>/config.json` plus the tokenizer files (symlinked), for each shape; name -> directory."""
    out: dict[str, Path] = {}
    for name in names or shape_names():
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(model_config(name), indent=2) + "\n")
        for file in TOKENIZER_FILES:
            source, target = tokenizer_dir / file, folder / file
            if source.exists() and not target.exists():
                os.symlink(source.resolve(), target)
        out[name] = folder
    return out


def write_fallback_tokenizer(*, folder: Path, vocab_size: int = VOCAB_SIZE) -> Path:
    """A word-level tokenizer with `vocab_size` entries (ids 0-3: pad, eos, bos, unk), for when the Gemma
    tokenizer is missing. Built with `tokenizers`, which vLLM depends on."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder.mkdir(parents=True, exist_ok=True)
    vocab = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3}
    vocab.update({f"w{i}": i for i in range(4, vocab_size)})
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<bos>", "eos_token": "<eos>",
              "pad_token": "<pad>", "unk_token": "<unk>", "model_max_length": 131072}  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder


def unpack_tokenizer(*, archive: Path, folder: Path) -> Path:
    """Unpack the tokenizer archive made by scripts/gpu/pack_tokenizer.py into `folder`."""
    shutil.unpack_archive(str(archive), str(folder))
    return folder


def _shapes(config: Mapping[str, Any]) -> dict[str, tuple[int, int]]:
    """(in, out) features of each LoRA target projection of a Llama-shaped decoder layer."""
    hidden, inter = int(config["hidden_size"]), int(config["intermediate_size"])
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or hidden // heads)
    kv = int(config.get("num_key_value_heads", heads)) * head_dim
    q = heads * head_dim
    return {"q_proj": (hidden, q), "k_proj": (hidden, kv), "v_proj": (hidden, kv), "o_proj": (q, hidden),
            "gate_proj": (hidden, inter), "up_proj": (hidden, inter), "down_proj": (inter, hidden)}  # fmt: skip


def make_lora_adapter(*, folder: Path, base_config: Mapping[str, Any], rank: int, seed: int = 0) -> Path:
    """A random PEFT LoRA adapter of `rank` on every projection of every layer (float16 safetensors)."""
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)
    tensors: dict[str, Any] = {}
    shapes = _shapes(base_config)
    for layer in range(int(base_config["num_hidden_layers"])):
        for module, (fan_in, fan_out) in shapes.items():
            part = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
            prefix = f"base_model.model.model.layers.{layer}.{part}.{module}"
            tensors[f"{prefix}.lora_A.weight"] = (rng.standard_normal((rank, fan_in)) * 0.01).astype(np.float16)
            tensors[f"{prefix}.lora_B.weight"] = (rng.standard_normal((fan_out, rank)) * 0.01).astype(np.float16)
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    config = {
        "base_model_name_or_path": None, "peft_type": "LORA", "task_type": "CAUSAL_LM", "r": rank,
        "lora_alpha": 2 * rank, "lora_dropout": 0.0, "bias": "none", "target_modules": list(LORA_TARGETS),
        "fan_in_fan_out": False, "inference_mode": True, "modules_to_save": None, "use_rslora": False,
        "use_dora": False,
    }  # fmt: skip
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
