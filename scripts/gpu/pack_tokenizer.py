"""Pack the Gemma 3 tokenizer for the GPU machine: build/gpu/gemma3-tokenizer.tar.xz (~3.5 MB).

The GPU tier's model directories (`--load-format dummy`) use the packaged Gemma 3 270M tokenizer. The GPU
machine has no fleetgate install and no hub, so the tokenizer travels as this small archive (a `carry`
path of the device run). It is taken from the model directory `fleetgate prepare-model` made (prepared
here first if missing); its tokenizer_config.json names the generic fast tokenizer class, which every
transformers version vLLM supports loads from tokenizer.json alone.

    PYTHONSAFEPATH=1 .venv/bin/python scripts/gpu/pack_tokenizer.py [--out build/gpu/gemma3-tokenizer.tar.xz]
"""

from __future__ import annotations

import argparse
import json
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "gpu" / "gemma3-tokenizer.tar.xz")
    args = parser.parse_args()
    from fleetgate.local.model_prep import prepare_model

    source = prepare_model()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "tokenizer.json").write_bytes((source / "tokenizer.json").read_bytes())
        config = json.loads((source / "tokenizer_config.json").read_text())
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
        config.pop("backend", None)
        (folder / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        template = source / "chat_template.jinja"
        if template.exists():
            (folder / "chat_template.jinja").write_text(template.read_text())
        args.out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(args.out, "w:xz", preset=9) as tar:
            for file in sorted(folder.iterdir()):
                tar.add(file, arcname=file.name)
    print(f"{args.out}: {args.out.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
