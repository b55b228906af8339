"""A vLLM plugin: quantized *tied* token embeddings on vLLM's CPU backend (`--quantization fleetgate-ct`).

Why: Gemma 3 270M's 262k x 640 embedding is 63% of its parameters and doubles as `lm_head`. vLLM 0.32
keeps it in 16 bits on CPU: its compressed-tensors embedding method gathers rows with a Triton (GPU)
kernel, has no matmul for `lm_head`, and `ParallelLMHead.tie_weights` expects a plain `weight`. This
plugin registers `fleetgate-ct`, compressed-tensors plus one embedding method whose single copy of
the quantized matrix serves both the lookup and the logits:
- 4-bit, symmetric, one scale per group of `g` columns (the checkpoint's `weight_packed`, eight values
  per int32, `weight_scale`): at load time repacked once into the layout of vLLM's CPU WNA16 GEMM
  (`cpu_gemm_wna16`, blocks of 16 vocabulary rows), which computes the logits; the lookup unpacks the
  gathered rows from that same layout in torch. vLLM's CPU wheel ships one extension per ISA and only the
  AVX-512 build has that GEMM: on an AVX2-only CPU the 4-bit values are held as int8 slices and served by the
  8-bit path below instead (the same values and scales, so the same logits; twice the 4-bit bytes, half of bf16).
- 8-bit, symmetric, groups of `g` (`weight_packed`, four values per int32, `weight_scale` fp16: the
  GGUF's Q8_0 blocks, exact): unpacked at load time into int8 `g`-column slices; logits = sum over
  slices of torch's weight-only int8 GEMM (`_weight_int8pack_mm`, one scale per row and slice); the
  lookup gathers rows.
Everything else is vLLM's compressed-tensors. Loaded by vLLM through the `vllm.general_plugins` entry
point in every vLLM process; it changes nothing unless a model is served with `--quantization fleetgate-ct`.
Only vLLM (and the tests) import this module, so it imports torch and vLLM at the top.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

from fleetgate.local.vllm_weights import WEIGHT_BYTES_ENV, weight_bytes_line

NAME = "fleetgate-ct"
BLOCK_ROWS = 16  # rows per block of vLLM's CPU WNA16 weight layout
PACK = 8  # 4-bit values per int32


def register() -> None:
    """Entry point (`vllm.general_plugins`): make `--quantization fleetgate-ct` known to vLLM.

    With `$FLEETGATE_LOG_WEIGHT_BYTES=1` (set by `fleetgate bench engine --compare`), the CPU worker
    also logs the bytes of the loaded model's tensors: vLLM CPU logs no weight memory of its own.
    """
    import os

    from vllm.model_executor.layers.quantization import QUANTIZATION_METHODS, register_quantization_config

    if NAME not in QUANTIZATION_METHODS:
        register_quantization_config(NAME)(config_class())
    if os.environ.get(WEIGHT_BYTES_ENV) == "1":
        _log_weight_bytes_after_load()


def model_tensor_bytes(model: torch.nn.Module) -> int:
    """Bytes of the parameters and buffers of `model`, each storage counted once (tied weights)."""
    seen: dict[int, int] = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        storage = tensor.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def _log_weight_bytes_after_load() -> None:
    from vllm.v1.worker.cpu_model_runner import CPUModelRunner

    if getattr(CPUModelRunner.load_model, "_fleetgate", False):
        return
    original = CPUModelRunner.load_model

    def load_model(self: Any, *args: Any, **kwargs: Any) -> None:
        rss, anon = _resident_bytes()
        original(self, *args, **kwargs)
        # Tensor bytes miss weights that a kernel moved into its own buffers (oneDNN's bf16 and int8
        # GEMMs keep prepacked copies); the worker's RSS growth over the load counts those too.
        rss_after, anon_after = _resident_bytes()
        line = weight_bytes_line(
            tensor_bytes=model_tensor_bytes(self.model), rss_bytes=rss_after - rss, anon_bytes=anon_after - anon
        )
        print(line, flush=True)

    load_model._fleetgate = True  # type: ignore[attr-defined]
    CPUModelRunner.load_model = load_model  # type: ignore[method-assign]


def config_class() -> type:
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig,
    )
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding

    class FleetgateCompressedTensorsConfig(CompressedTensorsConfig):
        """compressed-tensors, with the tied embedding served by `QuantizedTiedEmbedding`."""

        def get_name(self) -> str:  # type: ignore[override]
            return NAME

        @classmethod
        def override_quantization_method(cls, hf_quant_cfg: Any, user_quant: Any, hf_config: Any = None) -> Any:
            # The checkpoint says compressed-tensors; `--quantization fleetgate-ct` picks this reading of it.
            if user_quant == NAME and hf_quant_cfg.get("quant_method") == "compressed-tensors":
                return NAME
            return None

        def get_quant_method(self, layer: torch.nn.Module, prefix: str) -> Any:
            if isinstance(layer, ParallelLMHead):
                return TiedHead()
            if isinstance(layer, VocabParallelEmbedding):
                scheme = self.get_scheme_dict(layer, layer_name=prefix)
                weights: Any = scheme.get("weights") if scheme else None
                if weights is None:
                    return None
                return QuantizedTiedEmbedding(num_bits=int(weights.num_bits), group_size=int(weights.group_size))
            return super().get_quant_method(layer, prefix)

    return FleetgateCompressedTensorsConfig


# --- the 4-bit layout: checkpoint (rows, cols/8) int32 -> vLLM CPU WNA16 blocks -----------------------------


def unpack_rows(packed: torch.Tensor, *, bits: int = 4) -> torch.Tensor:
    """(rows, cols*bits/32) int32, value i of a word in bits i*bits.. -> (rows, cols) int32, unsigned."""
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    return ((packed.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(packed.shape[0], -1)


def to_wna16_blocks(packed: torch.Tensor) -> torch.Tensor:
    """The checkpoint's row-packed 4-bit matrix -> the blocked layout `cpu_gemm_wna16` reads.

    vLLM's layout: the (cols, rows) matrix packed eight rows per int32, then blocks of 16 rows made
    contiguous: block b, column k holds two words with rows 16b..16b+7 and 16b+8..16b+15.
    """
    values = unpack_rows(packed)  # (rows, cols)
    rows, cols = values.shape
    by_col = values.t().reshape(cols, rows // PACK, PACK)  # (cols, rows/8, 8)
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    words = (by_col << shifts).sum(dim=-1, dtype=torch.int32)  # (cols, rows/8); disjoint bits: sum == or
    return words.view(cols, rows // BLOCK_ROWS, 2).permute(1, 0, 2).reshape(rows // BLOCK_ROWS, 2 * cols).contiguous()


def gather_blocked_rows(blocked: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of a `to_wna16_blocks` matrix as (len(ids), cols) int32 in 0..15."""
    cols = blocked.shape[1] // 2
    words = blocked[ids // BLOCK_ROWS].view(-1, cols, 2)  # (n, cols, 2)
    half = ((ids % BLOCK_ROWS) // PACK).view(-1, 1, 1).expand(-1, cols, 1)
    word = words.gather(2, half).squeeze(2)  # (n, cols)
    shift = ((ids % PACK) * 4).to(torch.int32).view(-1, 1)
    return (word >> shift) & 15


class QuantizedTiedEmbedding(QuantizeMethodBase):
    """A quantized embedding whose one copy also computes the logits (see the module docstring)."""

    def __init__(self, *, num_bits: int, group_size: int) -> None:
        if num_bits not in (4, 8):
            raise ValueError(f"{NAME}: embeddings of {num_bits} bits are not handled (4 or 8)")
        self.num_bits = num_bits
        self.group_size = group_size
        self.dtype = torch.bfloat16
        self.layout = "wna16" if num_bits == 4 else "int8"  # 4-bit falls back to "int8" without the WNA16 GEMM

    def create_weights(
        self, layer: Any, input_size_per_partition: int, output_partition_sizes: list[int],
        input_size: int, output_size: int, params_dtype: torch.dtype, **extra: Any,
    ) -> None:  # fmt: skip
        from vllm.model_executor.parameter import BasevLLMParameter, GroupQuantScaleParameter, PackedvLLMParameter

        loader = extra["weight_loader"]
        rows, cols = sum(output_partition_sizes), input_size_per_partition
        if cols % self.group_size:
            raise ValueError(f"{NAME}: hidden size {cols} is not a multiple of the group size {self.group_size}")
        groups = cols // self.group_size
        layer.hidden_size = cols
        self.dtype = params_dtype
        per_word = 32 // self.num_bits
        weight = PackedvLLMParameter(
            input_dim=1, output_dim=0, packed_dim=1, packed_factor=per_word, weight_loader=loader,
            data=torch.empty(rows, cols // per_word, dtype=torch.int32),
        )  # fmt: skip
        layer.register_parameter("weight_packed", weight)
        layer.register_parameter(
            "weight_shape", BasevLLMParameter(data=torch.empty(2, dtype=torch.int64), weight_loader=loader)
        )
        scale_dtype = params_dtype if self.num_bits == 4 else torch.float16  # Q8_0 scales are fp16: kept exact
        scale = GroupQuantScaleParameter(
            output_dim=0, input_dim=1, weight_loader=loader, data=torch.empty(rows, groups, dtype=scale_dtype)
        )
        layer.register_parameter("weight_scale", scale)

    def process_weights_after_loading(self, layer: Any) -> None:
        if self.num_bits == 4 and not wna16_available():
            self.layout = "int8"
        # the engine log says which layout serves the embedding (tests/e2e/test_up_quantized.py reads it)
        print(f"{NAME}: tied embedding of {self.num_bits}-bit values held as {self.layout}", flush=True)
        if self.layout == "wna16":
            layer.weight_packed.data = to_wna16_blocks(layer.weight_packed.data)
            layer.weight_scale.data = layer.weight_scale.data.t().contiguous()  # (groups, rows)
        else:  # int8 (rows, cols) -> (groups, rows, g): each slice contiguous for the int8 GEMM
            offset = 8 if self.num_bits == 4 else 128  # the checkpoint's unsigned codes around zero
            values = (unpack_rows(layer.weight_packed.data, bits=self.num_bits) - offset).to(torch.int8)
            rows = values.shape[0]
            grouped = values.view(rows, -1, self.group_size).permute(1, 0, 2).contiguous()
            layer.weight_packed.data = grouped
            layer.weight_scale.data = layer.weight_scale.data.t().contiguous()  # (groups, rows)

    def embedding(self, layer: Any, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1)
        scales = layer.weight_scale[:, flat].t().float()  # (n, groups)
        if self.layout == "wna16":
            values = (gather_blocked_rows(layer.weight_packed, flat) - 8).float()
        else:
            values = layer.weight_packed[:, flat, :].permute(1, 0, 2).reshape(flat.numel(), -1).float()
        rows = values.view(flat.numel(), -1, self.group_size) * scales.unsqueeze(-1)
        return rows.reshape(*ids.shape, -1).to(self.dtype)

    def apply(self, layer: Any, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.layout == "wna16":
            from vllm import _custom_ops as ops

            return ops.cpu_gemm_wna16(
                input=x, q_weight=layer.weight_packed, scales=layer.weight_scale, zeros=None, bias=bias,
                pack_factor=PACK, isa_hint=_isa_hint(),
            )  # fmt: skip
        g = self.group_size
        weight = layer.weight_packed  # (groups, rows, g) int8 after loading
        out = torch.zeros(x.shape[0], weight.shape[1], dtype=torch.float32)
        for i in range(weight.shape[0]):
            part = x[:, i * g : (i + 1) * g].contiguous()
            out += torch.ops.aten._weight_int8pack_mm(part, weight[i], layer.weight_scale[i].to(x.dtype))
        out = out.to(x.dtype)
        return out if bias is None else out + bias


class TiedHead(QuantizeMethodBase):
    """`lm_head` of a model whose quantized embedding is tied to it: it owns no weights of its own."""

    def create_weights(self, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> None:
        return None

    def tie_weights(self, layer: torch.nn.Module, embed_tokens: torch.nn.Module) -> torch.nn.Module:
        method = getattr(embed_tokens, "quant_method", None)
        if not isinstance(method, QuantizedTiedEmbedding):
            raise ValueError(f"{NAME} serves tied embeddings only when the embedding is quantized")
        # The lm_head module *is* the embedding from here on: same parameters, same method.
        return embed_tokens

    def process_weights_after_loading(self, layer: torch.nn.Module) -> None:
        return None

    def apply(self, layer: torch.nn.Module, *args: Any, **kwargs: Any) -> torch.Tensor:
        raise ValueError(f"{NAME}: lm_head must be tied to a quantized embedding (tie_word_embeddings)")


def _resident_bytes() -> tuple[int, int]:
    """(RSS, anonymous RSS) of this process once garbage and the C allocator's free pages are handed back."""
    import contextlib
    import ctypes
    import gc

    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: RSS may then include freed load buffers
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    found: dict[str, int] = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "RssAnon"):
                found[key] = int(value.split()[0]) * 1024
    return found.get("VmRSS", 0), found.get("RssAnon", 0)


def wna16_available() -> bool:
    """Whether the vLLM CPU extension loaded for this CPU has the WNA16 GEMM (its AVX-512 build does, AVX2 not)."""
    from vllm import _custom_ops  # noqa: F401  (loads the extension built for this CPU's ISA)

    return hasattr(torch.ops._C, "cpu_gemm_wna16")


def _isa_hint() -> str:
    return "amx" if torch.cpu._is_amx_tile_supported() else "vec"
