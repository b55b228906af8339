"""The GPU memory vLLM keeps out of the KV cache besides weights: activations, CUDA graphs, non-torch memory.

vLLM's GPU worker (0.26, `v1/worker/gpu_worker.py: determine_available_memory`) sizes the KV cache as

    KV bytes = CUDA's total memory x gpu_memory_utilization
               - weights - peak activation - non-torch increase - CUDA graph estimate

This module predicts, per GPU, the terms that are not weights, following what vLLM 0.26 does to measure
them (file references are to that release):

- **CUDA's total memory** is less than what nvidia-smi lists (and the accelerator profile holds): the
  driver keeps `driver_reserved_bytes` that CUDA never offers. vLLM multiplies CUDA's total by the
  utilization, so the plan does too.
- **Which model runner.** vLLM 0.26 uses its V2 model runner by default and falls back to V1 for
  speculative methods V2 lacks (ngram, suffix, draft_model, medusa: `config/vllm.py:
  _get_v2_model_runner_unsupported_features`) and for mixture-of-experts models outside a short list
  (`_is_default_v2_model_runner_model`; Mixtral is not on it). The two profile differently.
- **Peak activation** is the torch allocator's peak during `profile_run`: one forward pass over
  `max_num_batched_tokens` (T) tokens, then a dummy sampling step on `S = min(max_num_seqs, T)` rows of
  logits over the vocabulary V (gathered to every rank under tensor parallelism). The peak is the larger
  of the two phases:
  - forward = T x dtype bytes x (`forward_mlp` x I / TP x experts per token + `forward_hidden` x H): the
    MLP's gate_up output (2 I) and its activated product (I), and hidden-sized buffers (residual,
    normed input, attention output);
  - V2 sampler (`v1/worker/gpu/model_runner.py: _dummy_sampler_run`): the 16-bit logits, sampled in
    place (the dummy batch skips top-k/top-p): S x V x `v2_logit_bytes` -- never the peak here;
  - V1 sampler (`v1/worker/gpu_model_runner.py: _dummy_sampler_run`): the 16-bit logits, their float32
    copy, the float32 probabilities and the exponential noise: S x V x `v1_logit_bytes`;
  - V1 with speculative decoding adds a dummy rejection-sampling step on S bonus rows and S target rows
    (`v1/sample/rejection_sampler.py`): 2S 16-bit logits, the bonus rows' float32 logits and the full
    raw logprobs kept for them, the target rows' float32 copy, its processed clone and probabilities,
    alive together: S x V x `spec_logit_bytes`. It does not depend on the draft model: it is the
    target's vocabulary, so ngram pays it as a draft model does.
  Compiled (torch.compile, not `enforce_eager`), the forward's measured peak is `compiled_factor` x the
  eager one (why is not established from the source; it is fitted, see below).
- **CUDA graphs**: the V2 runner captures its graphs after the KV cache is allocated and subtracts no
  estimate (`profile_cudagraph_memory` returns 0), so with V2 this term is 0 whether or not graphs are
  captured; the V1 runner subtracts its estimate of the graph pool: `graph_bytes_per_layer` x layers per
  captured graph, for the sizes `[1, 2, 4] + range(8, 256, 8) + range(256, M + 1, 16)` with M = min(2 x
  max_num_seqs x (1 + speculative tokens), 512, T), piecewise for every size and full for decode sizes.
- **Non-torch** memory grows by what the forward pass allocates outside torch (cuBLAS/FlashAttention
  workspaces): `non_torch_bytes`, plus `non_torch_bytes_per_extra_gpu` per tensor-parallel peer.

The coefficients are not vLLM constants: `VLLM_0_26_H100` says which were derived from the source and
which were fitted, on which configuration; docs/reports/gpu-h100.md has the held-out errors.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from fleetgate.core.errors import ConfigError

if TYPE_CHECKING:  # capacity imports this module for `Reserve`
    from fleetgate.engine.capacity import ModelArch

MAX_GRAPH_SIZE = 512  # vLLM 0.26's default cap on the largest captured batch (non-Blackwell)
MIB = 2**20
GIB = 2**30
ModelRunner = Literal["v1", "v2"]
# Speculative methods vLLM 0.26's V2 model runner implements; the others run on V1.
V2_SPECULATIVE_METHODS = frozenset({"eagle", "eagle3", "mtp", "dflash", "dspark"})


@dataclass(frozen=True, kw_only=True, slots=True)
class ReserveCoefficients:
    driver_reserved_bytes: int  # memory nvidia-smi lists that CUDA never offers (per GPU)
    forward_mlp: float  # intermediate-size activations live at the forward peak, per token
    forward_hidden: float  # hidden-size activations live at the forward peak, per token
    v2_logit_bytes: float  # bytes per (row x vocabulary) entry at the V2 sampler's peak
    v1_logit_bytes: float  # ... at the V1 sampler's peak
    spec_logit_bytes: float  # ... at the V1 rejection sampler's peak (speculative decoding)
    compiled_factor: float  # compiled peak activation / eager peak activation
    graph_bytes_per_layer: float  # V1's CUDA graph estimate per captured graph and decoder layer
    non_torch_bytes: float  # non-torch increase of one GPU
    non_torch_bytes_per_extra_gpu: float  # added per tensor-parallel peer (communication workspaces)


# vLLM 0.26.0 on an H100 80GB HBM3, from the first GPU-tier sweep (docs/reports/gpu-h100.md; the logs are in
# docs/reports/data/gpu-h100-call1.jsonl). Derived from the source: forward_mlp (gate_up 2 I + product I),
# v2_logit_bytes (16-bit logits sampled in place), v1_logit_bytes (2 + 4 + 4 + 4, see the docstring).
# Measured directly: driver_reserved_bytes (nvidia-smi 81,559 MiB, CUDA 79.18 GiB: 478 MiB), non_torch_bytes
# (0.22 GiB in all six engines), graph_bytes_per_layer (llama8b-bf16 captured 102 graphs x 32 layers in
# 0.98 GiB). Fitted, one configuration each: forward_hidden on llama8b-awq-eager (peak 0.84 GiB: 3 x 0.656 GiB
# of MLP + 2.9 x 64 MiB, rounded to 3); compiled_factor on llama8b-bf16 (2.13 GiB / 0.844 GiB eager
# forward); spec_logit_bytes on llama8b-draft-eager (7.74 GiB less the 64 MiB of hidden states, over 1,024 x
# 262,144 entries; the source count of the buffers alive at once is 28-34 bytes). Held out: every other
# configuration (ngram's 1.11 GiB at S = 128 checks spec_logit_bytes' scaling). Not yet measured:
# non_torch_bytes_per_extra_gpu (tensor parallel 2), v1_logit_bytes (a V1 model without speculative
# decoding: Mixtral).
VLLM_0_26_H100 = ReserveCoefficients(
    driver_reserved_bytes=478 * MIB,
    forward_mlp=3.0,
    forward_hidden=3.0,
    v2_logit_bytes=2.0,
    v1_logit_bytes=14.0,
    spec_logit_bytes=30.7,
    compiled_factor=2.52,
    graph_bytes_per_layer=0.98 * GIB / (102 * 32),
    non_torch_bytes=0.22 * GIB,
    non_torch_bytes_per_extra_gpu=0.1 * GIB,
)


def model_runner(*, speculative_method: str | None, moe: bool) -> ModelRunner:
    """The model runner vLLM 0.26 picks (module docstring)."""
    if speculative_method is not None and speculative_method not in V2_SPECULATIVE_METHODS:
        return "v1"
    return "v1" if moe else "v2"


@dataclass(frozen=True, kw_only=True, slots=True)
class ReserveInputs:
    """The engine settings that size the reserve (the effective values: vLLM's defaults filled in)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    enforce_eager: bool = False
    activation_dtype_bytes: float = 2.0  # 16-bit models; 4 for float32
    num_speculative_tokens: int = 0
    speculative_method: str | None = None
    coefficients: ReserveCoefficients = VLLM_0_26_H100

    def __post_init__(self) -> None:
        if self.max_num_batched_tokens < 1 or self.max_num_seqs < 1:
            raise ConfigError("reserve: max_num_batched_tokens and max_num_seqs must be >= 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class Reserve:
    """Bytes per GPU that vLLM keeps out of the KV cache besides weights."""

    activation_bytes: int
    cuda_graph_bytes: int
    non_torch_bytes: int
    cuda_graphs: int  # graphs whose estimate vLLM subtracts (V1 runner only)
    runner: ModelRunner = "v2"
    driver_reserved_bytes: int = 0  # not offered by CUDA: taken off the total before the utilization

    @property
    def total_bytes(self) -> int:
        return self.activation_bytes + self.cuda_graph_bytes + self.non_torch_bytes


def capture_sizes(*, max_num_seqs: int, max_num_batched_tokens: int, num_speculative_tokens: int = 0) -> list[int]:
    """Batch sizes vLLM 0.26 captures CUDA graphs for (`VllmConfig._set_cudagraph_sizes`)."""
    largest = min(max_num_seqs * (1 + num_speculative_tokens) * 2, MAX_GRAPH_SIZE, max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= largest]
    if largest >= 8:
        sizes += list(range(8, min(largest + 1, 256), 8))
    if largest >= 256:
        sizes += list(range(256, largest + 1, 16))
    if max_num_batched_tokens <= largest and max_num_batched_tokens not in sizes:
        sizes.append(max_num_batched_tokens)
    return sorted(sizes)


def cuda_graph_count(inputs: ReserveInputs) -> int:
    """Piecewise graphs for every capture size, full graphs for the decode-only ones (none when eager)."""
    if inputs.enforce_eager:
        return 0
    sizes = capture_sizes(
        max_num_seqs=inputs.max_num_seqs,
        max_num_batched_tokens=inputs.max_num_batched_tokens,
        num_speculative_tokens=inputs.num_speculative_tokens,
    )
    decode_limit = inputs.max_num_seqs * (1 + inputs.num_speculative_tokens)
    return len(sizes) + sum(1 for s in sizes if s <= decode_limit)


def activation_bytes(*, arch: ModelArch, inputs: ReserveInputs, tensor_parallel_size: int) -> int:
    """vLLM's peak activation on one GPU (the larger of the forward and the sampling phases)."""
    c = inputs.coefficients
    if not arch.hidden_size:
        raise ConfigError("reserve: the model's hidden size is needed to size activations (architecture.hiddenSize)")
    hidden = arch.hidden_size
    intermediate = arch.intermediate_size or 4 * hidden  # the common 4x MLP when config.json is not known
    tokens, width = inputs.max_num_batched_tokens, inputs.activation_dtype_bytes
    mlp = intermediate / tensor_parallel_size * (arch.experts_per_token or 1)
    forward = tokens * width * (c.forward_mlp * mlp + c.forward_hidden * hidden)
    runner = model_runner(speculative_method=inputs.speculative_method, moe=bool(arch.experts_per_token))
    entries = min(inputs.max_num_seqs, tokens) * (arch.vocab_size or 0)
    if runner == "v2":
        per_entry = c.v2_logit_bytes
    elif inputs.speculative_method is not None:
        per_entry = max(c.v1_logit_bytes, c.spec_logit_bytes)
    else:
        per_entry = c.v1_logit_bytes
    sampler = entries * per_entry + tokens * hidden * width  # the forward's hidden states are still held
    if not inputs.enforce_eager:
        forward *= c.compiled_factor
    return round(max(forward, sampler))


def vllm_reserve(*, arch: ModelArch, inputs: ReserveInputs, tensor_parallel_size: int = 1) -> Reserve:
    """The reserve terms for one GPU of an engine with `tensor_parallel_size` GPUs."""
    c = inputs.coefficients
    runner = model_runner(speculative_method=inputs.speculative_method, moe=bool(arch.experts_per_token))
    graphs = cuda_graph_count(inputs) if runner == "v1" else 0
    return Reserve(
        activation_bytes=activation_bytes(arch=arch, inputs=inputs, tensor_parallel_size=tensor_parallel_size),
        cuda_graph_bytes=round(graphs * arch.layers * c.graph_bytes_per_layer),
        non_torch_bytes=round(c.non_torch_bytes + c.non_torch_bytes_per_extra_gpu * (tensor_parallel_size - 1)),
        cuda_graphs=graphs,
        runner=runner,
        driver_reserved_bytes=c.driver_reserved_bytes,
    )
