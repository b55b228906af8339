"""Capacity plan: will a model fit on its GPUs, and how many sequences can run at once?

Pure arithmetic on model architecture facts and deployment knobs, the way the inference-optimization
literature does it (all sizes in bytes; GB = 10**9 bytes as in those worked examples):

- weights            = parameters x bytes per weight            (dtype or quantization, `WEIGHT_BYTES`);
                       4-bit checkpoints (AWQ, GPTQ, ...) keep the embeddings and lm_head in 16 bits and
                       add a 16-bit scale and a 4-bit zero point per group of 128 weights, so with
                       `vocab_size` known: (parameters - embedding parameters) x (0.5 + 2.5/128)
                       + embedding parameters x 2 (Qwen2.5-7B-AWQ: 5.6 GB, not 3.8 GB)
- weights per GPU    = weights / tensor_parallel_size            (tensor parallelism shards every matrix)
- KV bytes per token = 2 x layers x kv_heads x head_dim x kv bytes   (K and V, every layer, every KV head)
- KV per token/GPU   = 2 x layers x max(1, kv_heads / TP) x head_dim x kv bytes
                       (heads are split across GPUs; with fewer KV heads than GPUs vLLM replicates them)
- KV per sequence    = KV per token x max_model_len              (the worst case a scheduler must admit)
- usable per GPU     = GPU memory x gpu_memory_utilization - weights per GPU - overhead
                       (overhead: activations, CUDA graphs, NCCL buffers; a flat per-GPU allowance)
- max sequences      = floor(usable per GPU / KV per sequence per GPU)
- fits               = usable >= KV of one sequence at max length (else vLLM refuses to start)
- meets_target       = usable >= KV needed per GPU for the target concurrency (max_num_seqs) at max length

A speculative-decoding draft model adds its own weights and its own KV per token to the same GPUs.
Inputs: `ModelArch` (parameters, layers, kv_heads, head_dim) and `CapacityInputs`; output: `CapacityPlan`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from fleetgate.core.errors import ConfigError

GB = 10**9
GIB = 2**30

# Bytes per weight by dtype or quantization method (4-bit methods: 0.5 byte; scales and zero points ignored).
WEIGHT_BYTES: dict[str, float] = {
    "float32": 4.0,
    "float": 4.0,
    "float16": 2.0,
    "half": 2.0,
    "bfloat16": 2.0,
    "auto": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "experts_int8": 1.0,
    "compressed-tensors": 1.0,
    "awq": 0.5,
    "awq_marlin": 0.5,
    "gptq": 0.5,
    "gptq_marlin": 0.5,
    "int4": 0.5,
    "bitsandbytes": 0.5,
    "gguf": 0.5,
    "moe_wna16": 0.5,
    "mxfp4": 0.5,
    "modelopt_fp4": 0.5,
    "modelopt": 1.0,
    "torchao": 1.0,
}
# Bytes per KV element by KV-cache dtype ("auto" = the model dtype, taken as 16-bit).
KV_BYTES: dict[str, float] = {
    "auto": 2.0,
    "float16": 2.0,
    "bfloat16": 2.0,
    "float32": 4.0,
    "fp8": 1.0,
    "fp8_e4m3": 1.0,
    "fp8_e5m2": 1.0,
    "int8": 1.0,
}


@dataclass(frozen=True, kw_only=True, slots=True)
class ModelArch:
    """Architecture facts that set memory use (from the model's config.json)."""

    parameters: float
    layers: int
    kv_heads: int
    head_dim: int
    hidden_size: int | None = None
    attention_heads: int | None = None  # num_attention_heads, when hidden_size / head_dim is not it
    vocab_size: int | None = None
    tied_embeddings: bool = False  # tie_word_embeddings: lm_head shares the embedding matrix

    def query_heads(self) -> int | None:
        """num_attention_heads: given, else hidden_size / head_dim when that divides, else unknown."""
        if self.attention_heads is not None:
            return self.attention_heads
        if self.hidden_size and self.hidden_size % self.head_dim == 0:
            return self.hidden_size // self.head_dim
        return None

    def __post_init__(self) -> None:
        if self.parameters <= 0:
            raise ConfigError(f"model architecture: parameters must be > 0, got {self.parameters}")
        for name in ("layers", "kv_heads", "head_dim"):
            if getattr(self, name) < 1:
                raise ConfigError(f"model architecture: {name} must be >= 1, got {getattr(self, name)}")


@dataclass(frozen=True, kw_only=True, slots=True)
class CapacityInputs:
    arch: ModelArch
    weight_dtype: str = "float16"  # a dtype, or the quantization method when the model is quantized
    kv_cache_dtype: str = "auto"
    tensor_parallel_size: int = 1
    gpu_memory_bytes: int
    gpu_memory_utilization: float = 0.9
    overhead_bytes: int = 2 * GB
    max_model_len: int
    target_concurrency: int | None = None  # sequences at max_model_len that must fit (vLLM max_num_seqs)
    draft: ModelArch | None = None
    draft_weight_dtype: str = "float16"


@dataclass(frozen=True, kw_only=True, slots=True)
class CapacityPlan:
    weight_bytes: int
    weight_bytes_per_gpu: int
    kv_bytes_per_token: int
    kv_bytes_per_token_per_gpu: int
    kv_bytes_per_sequence: int
    kv_bytes_per_sequence_per_gpu: int
    usable_bytes_per_gpu: int
    max_concurrent_sequences: int
    target_concurrency: int | None
    kv_bytes_needed_per_gpu: int
    headroom_bytes_per_gpu: int
    fits: bool  # weights and one sequence at max length fit: vLLM can start
    meets_target: bool  # the target concurrency at max length fits too
    reason: str

    def to_status(self) -> dict[str, object]:
        """camelCase dict for an InferenceService status, sizes also in GB for people."""
        raw = asdict(self)
        out: dict[str, object] = {_camel(k): v for k, v in raw.items() if v is not None}
        for key in ("weight_bytes_per_gpu", "kv_bytes_per_sequence", "usable_bytes_per_gpu", "kv_bytes_needed_per_gpu"):
            out[_camel(key.replace("bytes", "gb"))] = f"{raw[key] / GB:.2f}"
        return out


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def bytes_per_weight(dtype: str) -> float:
    try:
        return WEIGHT_BYTES[dtype]
    except KeyError:
        raise ConfigError(
            f"capacity: unknown weight dtype/quantization {dtype!r}; known: {sorted(WEIGHT_BYTES)}"
        ) from None


def bytes_per_kv(dtype: str) -> float:
    try:
        return KV_BYTES[dtype]
    except KeyError:
        raise ConfigError(f"capacity: unknown KV-cache dtype {dtype!r}; known: {sorted(KV_BYTES)}") from None


# Per-weight overhead of group-quantized 4-bit checkpoints: a 16-bit scale and a 4-bit zero point per 128.
GROUP_QUANT_OVERHEAD = 2.5 / 128


def weight_bytes(*, arch: ModelArch, dtype: str) -> int:
    per_weight = bytes_per_weight(dtype)
    if per_weight == 0.5 and arch.vocab_size and arch.hidden_size:
        embedding = arch.vocab_size * arch.hidden_size * (1 if arch.tied_embeddings else 2)
        quantized = max(0.0, arch.parameters - embedding)
        return round(quantized * (per_weight + GROUP_QUANT_OVERHEAD) + embedding * 2)
    return round(arch.parameters * per_weight)


def tensor_parallel_problem(*, arch: ModelArch, tensor_parallel_size: int) -> str | None:
    """Why vLLM would refuse this tensor parallel size for the model, or None.

    vLLM shards attention heads evenly: num_attention_heads % TP == 0; KV heads are split when there are
    at least TP of them (kv_heads % TP == 0) and replicated otherwise (TP % kv_heads == 0)."""
    tp = tensor_parallel_size
    if tp <= 1:
        return None
    heads = arch.query_heads()
    if heads is not None and heads % tp:
        return f"tensorParallelSize {tp} does not divide the model's {heads} attention heads"
    kv = arch.kv_heads
    if (kv >= tp and kv % tp) or (kv < tp and tp % kv):
        return (
            f"tensorParallelSize {tp} and the model's {kv} KV heads do not divide "
            f"(vLLM needs {kv} % {tp} == 0, or {tp} % {kv} == 0 to replicate them)"
        )
    return None


def kv_bytes_per_token(*, arch: ModelArch, kv_dtype: str, tensor_parallel_size: int = 1) -> int:
    """KV bytes per token on one GPU (the whole model's when tensor_parallel_size is 1)."""
    heads_per_gpu = max(1.0, arch.kv_heads / tensor_parallel_size)
    return round(2 * arch.layers * heads_per_gpu * arch.head_dim * bytes_per_kv(kv_dtype))


def plan_capacity(*, inputs: CapacityInputs) -> CapacityPlan:
    tp = inputs.tensor_parallel_size
    if tp < 1:
        raise ConfigError(f"capacity: tensor_parallel_size must be >= 1, got {tp}")
    if inputs.max_model_len < 1:
        raise ConfigError(f"capacity: max_model_len must be >= 1, got {inputs.max_model_len}")
    if not 0 < inputs.gpu_memory_utilization <= 1:
        raise ConfigError(f"capacity: gpu_memory_utilization must be in (0, 1], got {inputs.gpu_memory_utilization}")

    weights = weight_bytes(arch=inputs.arch, dtype=inputs.weight_dtype)
    kv_token = kv_bytes_per_token(arch=inputs.arch, kv_dtype=inputs.kv_cache_dtype)
    kv_token_gpu = kv_bytes_per_token(arch=inputs.arch, kv_dtype=inputs.kv_cache_dtype, tensor_parallel_size=tp)
    if inputs.draft is not None:
        weights += weight_bytes(arch=inputs.draft, dtype=inputs.draft_weight_dtype)
        kv_token += kv_bytes_per_token(arch=inputs.draft, kv_dtype=inputs.kv_cache_dtype)
        kv_token_gpu += kv_bytes_per_token(arch=inputs.draft, kv_dtype=inputs.kv_cache_dtype, tensor_parallel_size=tp)
    weights_gpu = math.ceil(weights / tp)
    kv_seq = kv_token * inputs.max_model_len
    kv_seq_gpu = kv_token_gpu * inputs.max_model_len
    usable = math.floor(inputs.gpu_memory_bytes * inputs.gpu_memory_utilization) - weights_gpu - inputs.overhead_bytes
    max_seqs = max(0, usable // kv_seq_gpu)
    wanted = inputs.target_concurrency if inputs.target_concurrency is not None else 1
    needed = wanted * kv_seq_gpu
    headroom = usable - needed
    fits = usable >= kv_seq_gpu
    meets_target = headroom >= 0
    budget = (
        f"{inputs.gpu_memory_bytes / GB:.1f} GB x {inputs.gpu_memory_utilization:g} - "
        f"{weights_gpu / GB:.2f} GB weights - {inputs.overhead_bytes / GB:.2f} GB overhead = "
        f"{usable / GB:.2f} GB for KV"
    )
    if usable <= 0:
        reason = f"weights do not fit: {budget} per GPU (TP={tp})"
    elif not fits:
        reason = (
            f"KV cache does not fit one sequence: {inputs.max_model_len} tokens need {kv_seq_gpu / GB:.2f} GB "
            f"per GPU but {budget}"
        )
    elif meets_target:
        reason = (
            f"fits: {budget} per GPU; {wanted} x {inputs.max_model_len} tokens need {needed / GB:.2f} GB; "
            f"up to {max_seqs} sequences at max length"
        )
    else:
        reason = (
            f"fits, but not the target concurrency: {wanted} x {inputs.max_model_len} tokens need "
            f"{needed / GB:.2f} GB per GPU and {budget}; at most {max_seqs} sequences at max length "
            "(vLLM will queue or preempt the rest)"
        )
    return CapacityPlan(
        weight_bytes=weights,
        weight_bytes_per_gpu=weights_gpu,
        kv_bytes_per_token=kv_token,
        kv_bytes_per_token_per_gpu=kv_token_gpu,
        kv_bytes_per_sequence=kv_seq,
        kv_bytes_per_sequence_per_gpu=kv_seq_gpu,
        usable_bytes_per_gpu=usable,
        max_concurrent_sequences=int(max_seqs),
        target_concurrency=inputs.target_concurrency,
        kv_bytes_needed_per_gpu=needed,
        headroom_bytes_per_gpu=headroom,
        fits=fits,
        meets_target=meets_target,
        reason=reason,
    )
