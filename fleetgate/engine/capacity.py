"""Capacity plan: will a model fit on its GPUs, and how many sequences can run at once?

Pure arithmetic on model architecture facts and deployment knobs, the way the inference-optimization
literature does it (all sizes in bytes; GB = 10**9 bytes as in those worked examples):

- weights            = parameters x bytes per weight            (dtype or quantization, `WEIGHT_BYTES`);
                       quantized checkpoints keep the embeddings and lm_head in 16 bits (vLLM quantizes
                       only the decoder's linear layers), so with `vocab_size` and `hidden_size` known:
                       (parameters - embedding parameters) x quantized bytes + embedding parameters x 2;
                       8-bit (fp8, int8): quantized bytes 1 (per-tensor or per-channel scales are
                       negligible; Llama-3.1-8B fp8 with a 262,144 vocabulary: 11.3 GB, not 9.1 GB);
                       4-bit group-quantized (AWQ, GPTQ, ...): 0.5 + 2.5/128, a 16-bit scale and a 4-bit
                       zero point per group of 128 weights (Qwen2.5-7B-AWQ: 5.6 GB, not 3.8 GB)
- weights per GPU    = weights / tensor_parallel_size            (tensor parallelism shards every matrix)
- KV bytes per token = 2 x layers x kv_heads x head_dim x kv bytes   (K and V, every layer, every KV head)
- KV per token/GPU   = 2 x layers x max(1, kv_heads / TP) x head_dim x kv bytes
                       (heads are split across GPUs; with fewer KV heads than GPUs vLLM replicates them)
- KV per sequence    = KV per token x max_model_len              (the worst case a scheduler must admit)
- LoRA slots         = max_loras x max_lora_rank x hidden_size x 2 x layers x target modules x LoRA dtype bytes
                       (with `--enable-lora` only). vLLM preallocates, at start-up, `max_loras` slots of
                       rank `max_lora_rank` in every LoRA-wrapped linear layer, whatever the adapters'
                       own ranks: an A matrix (rank x in) and a B matrix (out x rank), so the 2 counts A
                       and B with in = out = hidden_size. Target modules: the 7 linear projections of a
                       decoder block (q, k, v, o, gate, up, down), which vLLM wraps when no
                       `--lora-target-modules` is given. First-order: k and v are narrower under GQA and
                       the MLP projections wider (intermediate size), neither of which the plan knows.
                       LoRA dtype: the model's activation dtype (16-bit; 32-bit for float32 models).
- LoRA per GPU       = LoRA slots x (1 + 1/TP) / 2: vLLM shards half of each layer's LoRA (B of column-
                       parallel layers, A of row-parallel ones) and replicates the other half
- usable per GPU     = (GPU memory - driver-reserved) x gpu_memory_utilization - weights per GPU - LoRA per
                       GPU - reserve (driver-reserved: what nvidia-smi lists but CUDA never offers)
                       (reserve: vLLM's peak activation, CUDA graphs and non-torch memory, modelled per
                       GPU by `fleetgate.engine.reserve` when `CapacityInputs.reserve` is given, else a
                       flat `overhead_bytes`); with an explicit KV budget (vLLM CPU) LoRA slots live
                       outside it and are only shown
- KV budget          = the explicit KV space when one is given (vLLM CPU: `VLLM_CPU_KVCACHE_SPACE`), else usable
- max sequences      = floor(vLLM's maximum concurrency for that budget), from `kv_blocks.paged_kv`: whole
                       blocks of `block_size` tokens, hybrid sliding-window / full-attention layer groups
                       (Gemma 3), sliding-window layers holding only their window (the textbook
                       floor(usable / KV per sequence) for a full-attention model, up to block rounding)
- fits               = one sequence at max length fits in the KV blocks (else vLLM refuses to start)
- meets_target       = the target concurrency (max_num_seqs) at max length fits in the KV blocks too

A speculative-decoding draft model adds its own weights and its own KV per token to the same GPUs.
Inputs: `ModelArch` (parameters, layers, kv_heads, head_dim) and `CapacityInputs`; output: `CapacityPlan`.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from fleetgate.core.errors import ConfigError
from fleetgate.engine.kv_blocks import CUDA_BLOCK_SIZE, DEFAULT_MAX_NUM_BATCHED_TOKENS, KvLayout, PagedKV, paged_kv
from fleetgate.engine.reserve import Reserve

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
    # Hybrid attention (Gemma 3: 5 sliding-window layers per full one): how many layers attend only to
    # the last `sliding_window` tokens. vLLM keeps just the window's blocks for those layers.
    sliding_window_layers: int = 0
    sliding_window: int | None = None
    # Activation sizes (the modelled vLLM reserve): the MLP's intermediate size (one expert's for a mixture
    # of experts) and how many experts each token visits (None: a dense model).
    intermediate_size: int | None = None
    experts_per_token: int | None = None

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
        if not 0 <= self.sliding_window_layers <= self.layers:
            raise ConfigError(
                f"model architecture: sliding_window_layers must be in 0..{self.layers}, "
                f"got {self.sliding_window_layers}"
            )
        if self.sliding_window_layers and (self.sliding_window is None or self.sliding_window < 1):
            raise ConfigError("model architecture: sliding-window layers need sliding_window >= 1")


# Linear projections per decoder layer that vLLM wraps for LoRA by default: q, k, v, o, gate, up, down.
LORA_TARGET_MODULES = 7


@dataclass(frozen=True, kw_only=True, slots=True)
class LoraSlots:
    """What vLLM preallocates for LoRA: `max_loras` adapters of rank up to `max_lora_rank`."""

    max_loras: int
    max_lora_rank: int
    dtype_bytes: float = 2.0
    target_modules: int = LORA_TARGET_MODULES


def lora_bytes(*, arch: ModelArch, slots: LoraSlots) -> int:
    """All LoRA slots of one engine (every GPU together), by the formula in the module docstring."""
    hidden = arch.hidden_size or (arch.query_heads() or 0) * arch.head_dim
    if hidden < 1:
        raise ConfigError("capacity: LoRA adapter memory needs the model's hidden size (architecture.hiddenSize)")
    per_layer = slots.max_lora_rank * hidden * 2 * slots.target_modules * slots.dtype_bytes
    return round(slots.max_loras * per_layer * arch.layers)


def lora_bytes_per_gpu(*, total: int, tensor_parallel_size: int) -> int:
    return math.ceil(total * (1 + 1 / tensor_parallel_size) / 2)


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
    # An explicit KV budget per engine replaces the memory-derived one (vLLM CPU: VLLM_CPU_KVCACHE_SPACE GiB).
    kv_cache_bytes: int | None = None
    block_size: int = CUDA_BLOCK_SIZE  # tokens per KV block (vLLM: 16 on CUDA, 128 on CPU)
    max_num_batched_tokens: int = DEFAULT_MAX_NUM_BATCHED_TOKENS  # sliding-window layers hold window + this
    lora: LoraSlots | None = None  # LoRA on (--enable-lora): the slots vLLM preallocates
    reserve: Reserve | None = None  # modelled per-GPU reserve; replaces the flat overhead_bytes when given


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
    kv_block_size: int
    kv_cache_blocks: int  # vLLM's number of KV blocks per GPU
    kv_cache_tokens: int  # vLLM's "KV cache size: N tokens"
    max_concurrency: float  # vLLM's "Maximum concurrency for max_model_len tokens per request: X"
    fits: bool  # weights and one sequence at max length fit: vLLM can start
    meets_target: bool  # the target concurrency at max length fits too
    reason: str
    # LoRA on: the adapter slots (max_loras x max_lora_rank) of the whole engine and of one GPU; None when off.
    max_adapters: int | None = None
    max_lora_rank: int | None = None
    lora_bytes: int | None = None
    lora_bytes_per_gpu: int | None = None
    # What vLLM keeps out of the KV cache besides weights, per GPU: the modelled terms, or the flat overhead.
    reserve_bytes_per_gpu: int | None = None
    activation_bytes_per_gpu: int | None = None
    cuda_graph_bytes_per_gpu: int | None = None
    non_torch_bytes_per_gpu: int | None = None

    def to_status(self) -> dict[str, object]:
        """camelCase dict for an InferenceService status, sizes also in GB for people."""
        raw = asdict(self)
        out: dict[str, object] = {_camel(k): v for k, v in raw.items() if v is not None}
        for key in (
            "weight_bytes_per_gpu",
            "kv_bytes_per_sequence",
            "usable_bytes_per_gpu",
            "kv_bytes_needed_per_gpu",
            "lora_bytes_per_gpu",
            "reserve_bytes_per_gpu",
        ):
            if raw[key] is not None:
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
    """Checkpoint bytes: 16-bit embeddings and lm_head beside quantized layers (module docstring)."""
    per_weight = bytes_per_weight(dtype)
    if per_weight < 2.0 and arch.vocab_size and arch.hidden_size:
        embedding = arch.vocab_size * arch.hidden_size * (1 if arch.tied_embeddings else 2)
        quantized = max(0.0, arch.parameters - embedding)
        overhead = GROUP_QUANT_OVERHEAD if per_weight == 0.5 else 0.0
        return round(quantized * (per_weight + overhead) + embedding * 2)
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


def kv_layout(*, arch: ModelArch, kv_dtype: str, tensor_parallel_size: int, block_size: int) -> KvLayout:
    """The model's per-layer KV facts on one GPU, for the paged (block) arithmetic."""
    per_layer_token = kv_bytes_per_token(
        arch=ModelArch(parameters=arch.parameters, layers=1, kv_heads=arch.kv_heads, head_dim=arch.head_dim),
        kv_dtype=kv_dtype,
        tensor_parallel_size=tensor_parallel_size,
    )
    return KvLayout(
        layers=arch.layers,
        sliding_window_layers=arch.sliding_window_layers,
        sliding_window=arch.sliding_window,
        page_bytes=per_layer_token * block_size,
        block_size=block_size,
    )


def paged_plan(*, inputs: CapacityInputs, kv_budget_bytes: int) -> PagedKV:
    """vLLM's blocks and concurrency for the main model.

    A draft model's layers share the pool: with full attention everywhere, vLLM 0.26 puts the target's and
    the draft's layers in one KV cache group (`UniformTypeKVCacheSpecs`, even when their head sizes differ),
    so one block holds `block_size` tokens in every layer of both and the pool has budget // (both models'
    bytes per block) blocks. With sliding-window layers the draft takes its share of the budget by KV bytes
    per token (an approximation: vLLM's hybrid grouping with a draft is not modelled).
    """
    if inputs.draft is not None:
        tp = inputs.tensor_parallel_size
        main = kv_bytes_per_token(arch=inputs.arch, kv_dtype=inputs.kv_cache_dtype, tensor_parallel_size=tp)
        draft = kv_bytes_per_token(arch=inputs.draft, kv_dtype=inputs.kv_cache_dtype, tensor_parallel_size=tp)
        if not inputs.arch.sliding_window_layers and not inputs.draft.sliding_window_layers:
            pooled = KvLayout(layers=1, page_bytes=(main + draft) * inputs.block_size, block_size=inputs.block_size)
            return paged_kv(layout=pooled, kv_cache_bytes=kv_budget_bytes, max_model_len=inputs.max_model_len,
                            max_num_batched_tokens=inputs.max_num_batched_tokens)  # fmt: skip
        kv_budget_bytes = kv_budget_bytes * main // (main + draft)
    layout = kv_layout(
        arch=inputs.arch,
        kv_dtype=inputs.kv_cache_dtype,
        tensor_parallel_size=inputs.tensor_parallel_size,
        block_size=inputs.block_size,
    )
    return paged_kv(
        layout=layout,
        kv_cache_bytes=kv_budget_bytes,
        max_model_len=inputs.max_model_len,
        max_num_batched_tokens=inputs.max_num_batched_tokens,
    )


def _kv_budget(*, inputs: CapacityInputs, weights_per_gpu: int, lora_per_gpu: int | None) -> tuple[int, str]:
    """Bytes per GPU left for the KV cache, and the sentence that explains them."""
    if inputs.kv_cache_bytes is not None:
        return inputs.kv_cache_bytes, f"{inputs.kv_cache_bytes / GIB:g} GiB given for KV"
    unseen = inputs.reserve.driver_reserved_bytes if inputs.reserve is not None else 0
    memory = math.floor((inputs.gpu_memory_bytes - unseen) * inputs.gpu_memory_utilization)
    reserve = reserve_bytes(inputs)
    usable = memory - weights_per_gpu - (lora_per_gpu or 0) - reserve
    lora = f"{lora_per_gpu / GB:.2f} GB LoRA slots - " if lora_per_gpu is not None else ""
    r = inputs.reserve
    what = (
        f"{reserve / GB:.2f} GB reserve (activations {r.activation_bytes / GB:.2f}, CUDA graphs "
        f"{r.cuda_graph_bytes / GB:.2f}, non-torch {r.non_torch_bytes / GB:.2f})"
        if r is not None
        else f"{reserve / GB:.2f} GB overhead"
    )
    return usable, (
        f"{inputs.gpu_memory_bytes / GB:.1f} GB x {inputs.gpu_memory_utilization:g} - "
        f"{weights_per_gpu / GB:.2f} GB weights - {lora}{what} = {usable / GB:.2f} GB for KV"
    )


def reserve_bytes(inputs: CapacityInputs) -> int:
    """Per-GPU bytes kept out of the KV cache besides weights and LoRA: modelled, else the flat overhead."""
    return inputs.reserve.total_bytes if inputs.reserve is not None else inputs.overhead_bytes


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
    lora_total = lora_gpu = None
    if inputs.lora is not None:
        lora_total = lora_bytes(arch=inputs.arch, slots=inputs.lora)
        lora_gpu = lora_bytes_per_gpu(total=lora_total, tensor_parallel_size=tp)
    usable, budget = _kv_budget(inputs=inputs, weights_per_gpu=weights_gpu, lora_per_gpu=lora_gpu)
    paged = paged_plan(inputs=inputs, kv_budget_bytes=usable)
    max_seqs = math.floor(paged.max_concurrency)
    wanted = inputs.target_concurrency if inputs.target_concurrency is not None else 1
    needed = wanted * kv_seq_gpu
    headroom = usable - needed
    fits = usable > 0 and max_seqs >= 1
    meets_target = fits and max_seqs >= wanted
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
        kv_block_size=paged.block_size,
        kv_cache_blocks=paged.num_blocks,
        kv_cache_tokens=paged.tokens,
        max_concurrency=round(paged.max_concurrency, 2),
        fits=fits,
        meets_target=meets_target,
        reason=reason,
        max_adapters=inputs.lora.max_loras if inputs.lora is not None else None,
        max_lora_rank=inputs.lora.max_lora_rank if inputs.lora is not None else None,
        lora_bytes=lora_total,
        lora_bytes_per_gpu=lora_gpu,
        **_reserve_fields(inputs),
    )


def _reserve_fields(inputs: CapacityInputs) -> dict[str, int | None]:
    if inputs.kv_cache_bytes is not None:  # an explicit KV budget (vLLM CPU): no reserve is subtracted
        return {}
    r = inputs.reserve
    return {
        "reserve_bytes_per_gpu": reserve_bytes(inputs),
        "activation_bytes_per_gpu": r.activation_bytes if r is not None else None,
        "cuda_graph_bytes_per_gpu": r.cuda_graph_bytes if r is not None else None,
        "non_torch_bytes_per_gpu": r.non_torch_bytes if r is not None else None,
    }
