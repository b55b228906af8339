"""GGUF weight blocks -> group-wise integer weights (the arithmetic of `prepare-model --quantization gguf-*`).

The packaged model is itself quantized (Q4_K_M): the embedding is Q8_0, most attention and MLP input
projections Q5_0, the attention outputs Q4_K, the MLP down projections Q4_K/Q6_K. The bfloat16 model is
their dequantization. Re-quantizing those bf16 values blindly (round to nearest over groups of 128) lays
a second, coarser grid over the first and loses information, so here the groups follow the source blocks:
- `q8_0_blocks` / `q5_0_blocks`: Q8_0 (fp16 `d`, 32 int8) and Q5_0 (fp16 `d`, 32 five-bit `q`, value
  d*(q-16)) are exactly int8 with one fp16 scale per group of 32: `GroupInt.dequantize` equals GGUF's own
  dequantization bit for bit (`d*q` of an fp16 and a small integer is exact in float32).
- `int4_groups`: 4-bit symmetric (-8..7) groups of 32 aligned with the source blocks, from the exact
  float32 GGUF values; each group's scale is searched (`SCALE_STEPS` candidates around max|w|/8, rounded
  to bf16 as stored) for the least squared error, instead of min/max round to nearest.
- `dequantize`: any GGUF type (Q4_K, Q6_K, F32, ...) to float32 through the `gguf` package.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

GROUP = 32
Q8_0_BYTES = 34  # fp16 d + 32 int8
Q5_0_BYTES = 22  # fp16 d + uint32 high bits + 16 bytes of low nibbles
SCALE_STEPS = np.linspace(0.80, 1.20, 21, dtype=np.float32)


@dataclass(frozen=True, kw_only=True, slots=True)
class GroupInt:
    """Integers `q` (rows, cols) with one scale per `group` consecutive columns: w = scale * q."""

    q: Any  # numpy int8 (rows, cols)
    scale: Any  # numpy float16 or float32 (rows, cols // group)
    group: int = GROUP

    def dequantize(self) -> Any:
        rows, cols = self.q.shape
        grouped = self.q.reshape(rows, cols // self.group, self.group).astype(np.float32)
        return (grouped * self.scale.astype(np.float32)[..., None]).reshape(rows, cols)


def _blocks(raw: Any, *, block_bytes: int, rows: int, cols: int) -> Any:
    data = np.ascontiguousarray(raw, dtype=np.uint8).reshape(-1)
    if cols % GROUP or data.size != rows * (cols // GROUP) * block_bytes:
        raise ValueError(f"{data.size} bytes are not {rows}x{cols} weights in blocks of {block_bytes} bytes")
    return data.reshape(rows, cols // GROUP, block_bytes)


def q8_0_blocks(raw: Any, *, rows: int, cols: int) -> GroupInt:
    """Q8_0 bytes -> int8 groups of 32 with the blocks' fp16 scales (exact)."""
    blocks = _blocks(raw, block_bytes=Q8_0_BYTES, rows=rows, cols=cols)
    scale = blocks[..., :2].copy().view(np.float16)[..., 0]
    q = blocks[..., 2:].copy().view(np.int8).reshape(rows, cols)
    return GroupInt(q=q, scale=scale)


def q5_0_blocks(raw: Any, *, rows: int, cols: int) -> GroupInt:
    """Q5_0 bytes -> int8 (-16..15) groups of 32 with the blocks' fp16 scales (exact)."""
    blocks = _blocks(raw, block_bytes=Q5_0_BYTES, rows=rows, cols=cols)
    scale = blocks[..., :2].copy().view(np.float16)[..., 0]
    high = blocks[..., 2:6].copy().view(np.uint32)  # (rows, groups, 1): bit j = high bit of element j
    low = blocks[..., 6:]  # byte j: element j in the low nibble, element j+16 in the high nibble
    nibbles = np.concatenate([low & 0x0F, low >> 4], axis=-1).astype(np.int16)  # (rows, groups, 32)
    bits = ((high >> np.arange(GROUP, dtype=np.uint32)) & 1).astype(np.int16)
    q = (nibbles | (bits << 4)) - 16
    return GroupInt(q=q.astype(np.int8).reshape(rows, cols), scale=scale)


def int4_groups(weight: Any, *, group: int = GROUP) -> GroupInt:
    """Symmetric 4-bit groups with least-squares-searched bf16-representable scales (float32 scales out)."""
    w = np.asarray(weight, dtype=np.float32)
    rows, cols = w.shape
    grouped = w.reshape(rows, cols // group, group)
    amax = np.abs(grouped).max(axis=-1)
    best_err = np.full(amax.shape, np.inf, dtype=np.float32)
    best_scale = np.zeros_like(amax)
    for step in SCALE_STEPS:
        scale = _bf16(np.maximum(amax * step / 8.0, np.float32(1e-12)))
        q = np.clip(np.rint(grouped / scale[..., None]), -8, 7)
        err = np.square(q * scale[..., None] - grouped).sum(axis=-1)
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
    q = np.clip(np.rint(grouped / best_scale[..., None]), -8, 7).astype(np.int8).reshape(rows, cols)
    return GroupInt(q=q, scale=best_scale, group=group)


def _bf16(values: Any) -> Any:
    """Round float32 to the nearest bfloat16 (ties to even), kept as float32."""
    bits = np.asarray(values, dtype=np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)


def dequantize(raw: Any, *, type_name: str) -> Any:
    """Any GGUF tensor's bytes -> float32, with the `gguf` package's reference dequantization."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    return np.asarray(gguf_dequantize(raw, GGMLQuantizationType[type_name]), dtype=np.float32)
