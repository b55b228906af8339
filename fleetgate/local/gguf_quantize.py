"""Quantized checkpoints built from the GGUF's own blocks (`prepare-model --quantization w4a16-gguf|...`).

Schemes (keys of `GGUF_SCHEMES`), all compressed-tensors checkpoints served with `--quantization
fleetgate-ct` (`fleetgate.local.vllm_plugin`: vLLM CPU keeps tied embeddings in 16 bits otherwise):
- `w4a16-gguf`: every linear layer and the tied embedding in 4 bits, symmetric, groups of 32 aligned with
  the GGUF blocks, scales searched for the least squared error against the exact GGUF values.
- `gguf-e4`: linear layers in bf16 (the base directory's), the tied embedding in 4 bits as above. On CPU,
  vLLM holds a bf16 tied embedding twice (the lookup table and oneDNN's packed copy for the logits), so
  this is where most weight memory goes; the linear layers are the part 4 bits damage (greedy agreement).
- `gguf-e8`: linear layers in bf16, the embedding the GGUF's Q8_0 itself (int8, groups of 32, fp16
  scales: exact): the faithful reference.
Norms and everything not quantized come from the bfloat16 directory, whose tensors each GGUF weight is
checked against (a wrong name or layout fails the build instead of serving a scrambled model).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from fleetgate.local import gguf_blocks
from fleetgate.local.errors import ModelPrepError


@dataclass(frozen=True, kw_only=True, slots=True)
class GgufScheme:
    linear_bits: int | None  # None: linear layers stay bf16
    embedding_bits: int


GGUF_SCHEMES: MappingProxyType[str, GgufScheme] = MappingProxyType(
    {
        "w4a16-gguf": GgufScheme(linear_bits=4, embedding_bits=4),
        "gguf-e4": GgufScheme(linear_bits=None, embedding_bits=4),
        "gguf-e8": GgufScheme(linear_bits=None, embedding_bits=8),
    }
)
EMBEDDING = "model.embed_tokens.weight"
LINEARS = MappingProxyType(
    {
        "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
        "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
        "ffn_down": "mlp.down_proj",
    }
)  # fmt: skip
ROW_CHUNK = 8192  # rows quantized at a time (bounds the float32 temporaries)


def hf_name(gguf_name: str) -> str | None:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`; None for tensors not quantized."""
    if gguf_name == "token_embd.weight":
        return EMBEDDING
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[3] == "weight" and parts[2] in LINEARS:
        return f"model.layers.{parts[1]}.{LINEARS[parts[2]]}.weight"
    return None


def weights_args(bits: int, *, group: int = gguf_blocks.GROUP) -> dict[str, Any]:
    return {"num_bits": bits, "type": "int", "symmetric": True, "strategy": "group", "group_size": group,
            "dynamic": False, "actorder": None, "observer": "minmax", "block_structure": None}  # fmt: skip


def quantization_config(scheme: GgufScheme) -> dict[str, Any]:
    groups: dict[str, Any] = {
        "embedding": {
            "targets": ["re:.*embed_tokens$"],
            "weights": weights_args(scheme.embedding_bits),
            "input_activations": None,
            "output_activations": None,
            "format": "pack-quantized",
        }
    }
    if scheme.linear_bits is not None:
        groups["linear"] = {
            "targets": ["Linear"],
            "weights": weights_args(scheme.linear_bits),
            "input_activations": None,
            "output_activations": None,
            "format": "pack-quantized",
        }
    return {"quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
            "config_groups": groups, "ignore": ["lm_head"], "kv_cache_scheme": None, "sparsity_config": {}}  # fmt: skip


def quantize_int4(weight: Any) -> gguf_blocks.GroupInt:
    """`gguf_blocks.int4_groups` in row chunks."""
    import numpy as np

    parts = [gguf_blocks.int4_groups(weight[i : i + ROW_CHUNK]) for i in range(0, weight.shape[0], ROW_CHUNK)]
    return gguf_blocks.GroupInt(q=np.concatenate([p.q for p in parts]), scale=np.concatenate([p.scale for p in parts]))


def packed_tensors(prefix: str, groups: gguf_blocks.GroupInt, *, bits: int) -> dict[str, Any]:
    """compressed-tensors `pack-quantized`: 32/bits values per int32 along the rows; 4-bit scales in bf16
    (what vLLM's kernel reads), 8-bit ones (the Q8_0 blocks') kept in fp16."""
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32

    q = torch.from_numpy(groups.q)
    scale = torch.from_numpy(groups.scale)
    return {
        f"{prefix}.weight_packed": pack_to_int32(q, bits, packed_dim=1).contiguous(),
        f"{prefix}.weight_scale": scale.to(torch.bfloat16) if bits == 4 else scale.to(torch.float16),
        f"{prefix}.weight_shape": torch.tensor(list(q.shape), dtype=torch.int64),
    }


def _check_matches(name: str, exact: Any, base: Any) -> None:
    import numpy as np

    reference = base.float().numpy()
    if reference.shape != exact.shape:
        raise ModelPrepError(f"GGUF tensor for {name} is {exact.shape}, the bf16 model's is {reference.shape}")
    # bf16 keeps 8 significant bits: the conversion may differ from the exact value by half an ulp
    if not np.all(np.abs(reference - exact) <= np.abs(exact) * 2.0**-8 + 1e-30):
        raise ModelPrepError(f"GGUF tensor for {name} does not match the bf16 model's (name or layout mismatch)")


def build_checkpoint(*, gguf_path: Path, base: Path, out_dir: Path, scheme: str) -> int:
    """Write `scheme`'s checkpoint of `gguf_path` into `out_dir`; returns the tensors quantized."""
    from gguf import GGUFReader
    from safetensors.torch import load_file, save_file

    chosen = GGUF_SCHEMES[scheme]
    config = json.loads((base / "config.json").read_text(encoding="utf-8"))
    if not config.get("tie_word_embeddings", True):
        raise ModelPrepError("the GGUF schemes quantize a tied embedding; this model's lm_head is untied")
    tensors: dict[str, Any] = dict(load_file(str(base / "model.safetensors")))
    count = 0
    for tensor in GGUFReader(str(gguf_path)).tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        kind = tensor.tensor_type.name
        exact = gguf_blocks.dequantize(tensor.data, type_name=kind)
        _check_matches(name, exact, tensors[name])
        prefix = name.removesuffix(".weight")
        if name == EMBEDDING and chosen.embedding_bits == 8:
            if kind != "Q8_0":
                raise ModelPrepError(f"an exact int8 embedding needs a Q8_0 source, this GGUF's is {kind}")
            del tensors[name]
            groups = gguf_blocks.q8_0_blocks(tensor.data, rows=exact.shape[0], cols=exact.shape[1])
            tensors.update(packed_tensors(prefix, groups, bits=8))
        elif name == EMBEDDING or chosen.linear_bits == 4:
            del tensors[name]
            tensors.update(packed_tensors(prefix, quantize_int4(exact), bits=4))
        else:
            continue
        count += 1
    out_dir.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(out_dir / "model.safetensors"))
    config["quantization_config"] = quantization_config(chosen)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return count
