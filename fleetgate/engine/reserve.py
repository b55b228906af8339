"""The GPU memory vLLM keeps out of the KV cache besides weights: activations, CUDA graphs, non-torch memory.

vLLM's GPU worker (0.26, `v1/worker/gpu_worker.py: determine_available_memory`) sizes the KV cache as

    KV bytes = ceil(total GPU memory x gpu_memory_utilization)
               - weights - peak activation - non-torch increase - CUDA graph estimate

where each term is measured at start-up (the CUDA context and NCCL buffers exist before its first
snapshot, so they are not charged). This module predicts the three non-weight terms per GPU from
what the spec states, following what vLLM does to measure them:

- **Peak activation** is the torch allocator's peak during `profile_run`: one forward pass over
  `max_num_batched_tokens` (T) tokens, then the sampler on `S = min(max_num_seqs, T)` rows of logits over
  the whole vocabulary V (logits are gathered to every rank under tensor parallelism). The peak is the
  larger of the two phases:
  forward  = T x dtype bytes x (`forward_mlp` x I / TP x experts per token + `forward_hidden` x H)
  sampler  = S x V x `logit_bytes` + T x H x dtype bytes (the forward's hidden states are still held)
  With the H100 defaults (T = 8192, S = 1024) and a 262,144-token vocabulary the sampler dominates.
- **CUDA graphs** (none with `enforce_eager`): vLLM captures one graph per batch size in
  `[1, 2, 4] + range(8, 256, 8) + range(256, M + 1, 16)` with M = min(2 x max_num_seqs x (1 + speculative
  tokens), 512, T), in two modes on FlashAttention 3 (piecewise for every size, full for decode batches
  up to max_num_seqs x (1 + speculative tokens)), and estimates their pool before sizing the KV cache.
  Modelled as `graph_bytes_per_layer` x layers per captured graph.
- **Non-torch** memory grows by what the forward pass allocates outside torch (cuBLAS/FlashAttention
  workspaces): `non_torch_bytes`, plus `non_torch_bytes_per_extra_gpu` per tensor-parallel peer.

The coefficients are not vLLM constants: `VLLM_0_26_H100` states where each value comes from. Inputs:
the model's `ModelArch` facts and `ReserveInputs`; output: `Reserve` (bytes per GPU, by term).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from fleetgate.core.errors import ConfigError

if TYPE_CHECKING:  # capacity imports this module for `Reserve`
    from fleetgate.engine.capacity import ModelArch

MAX_GRAPH_SIZE = 512  # vLLM 0.26's default cap on the largest captured batch (non-Blackwell)


@dataclass(frozen=True, kw_only=True, slots=True)
class ReserveCoefficients:
    logit_bytes: float  # bytes per (row x vocabulary) logit element at the sampler's peak
    forward_mlp: float  # intermediate-size activations live at the forward peak, per token
    forward_hidden: float  # hidden-size activations live at the forward peak, per token
    graph_bytes_per_layer: float  # CUDA graph pool per captured graph and decoder layer
    non_torch_bytes: float  # non-torch increase of one GPU
    non_torch_bytes_per_extra_gpu: float  # added per tensor-parallel peer (communication workspaces)


# vLLM 0.26.0 on an H100 80GB. Derived from the source (what is allocated at each peak) and calibrated on
# the one configuration measured before the GPU tier existed (issue 23: Llama-3.1-8B-shaped with a
# 262,144-token vocabulary, bf16 and fp8, H100 defaults T = 8192, S = 1024): peak activation 2.1 GiB,
# non-torch 0.2 GiB, and KV = 51.86 GiB out of 71.68 GiB requested with 17.05 GiB of weights, which
# leaves 0.47 GiB for the CUDA graph estimate (102 graphs x 32 layers). `logit_bytes` 8: the 16-bit
# logits (2) and their float32 copy (4) plus sampling buffers; forward: gate_up and the activated
# product (3 x I), residual, normed and attention output (4 x H). See docs/reports/gpu-h100.md for the
# configurations these were checked against.
VLLM_0_26_H100 = ReserveCoefficients(
    logit_bytes=8.0,
    forward_mlp=3.0,
    forward_hidden=4.0,
    graph_bytes_per_layer=0.47 * 2**30 / (102 * 32),
    non_torch_bytes=0.2 * 2**30,
    non_torch_bytes_per_extra_gpu=0.1 * 2**30,
)


@dataclass(frozen=True, kw_only=True, slots=True)
class ReserveInputs:
    """The engine settings that size the reserve (the effective values: vLLM's defaults filled in)."""

    max_num_batched_tokens: int
    max_num_seqs: int
    enforce_eager: bool = False
    activation_dtype_bytes: float = 2.0  # 16-bit models; 4 for float32
    num_speculative_tokens: int = 0
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
    cuda_graphs: int  # graphs captured (both modes)

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
    """Piecewise graphs for every capture size, full graphs for the decode-only ones."""
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
    """vLLM's peak activation on one GPU (the larger of the forward and the sampler phases)."""
    c = inputs.coefficients
    if not arch.hidden_size:
        raise ConfigError("reserve: the model's hidden size is needed to size activations (architecture.hiddenSize)")
    hidden = arch.hidden_size
    intermediate = arch.intermediate_size or 4 * hidden  # the common 4x MLP when config.json is not known
    tokens, width = inputs.max_num_batched_tokens, inputs.activation_dtype_bytes
    mlp = intermediate / tensor_parallel_size * (arch.experts_per_token or 1)
    forward = tokens * width * (c.forward_mlp * mlp + c.forward_hidden * hidden)
    rows = min(inputs.max_num_seqs, tokens)
    sampler = rows * (arch.vocab_size or 0) * c.logit_bytes + tokens * hidden * width
    return round(max(forward, sampler))


def vllm_reserve(*, arch: ModelArch, inputs: ReserveInputs, tensor_parallel_size: int = 1) -> Reserve:
    """The three terms for one GPU of an engine with `tensor_parallel_size` GPUs."""
    c = inputs.coefficients
    graphs = cuda_graph_count(inputs)
    return Reserve(
        activation_bytes=activation_bytes(arch=arch, inputs=inputs, tensor_parallel_size=tensor_parallel_size),
        cuda_graph_bytes=round(graphs * arch.layers * c.graph_bytes_per_layer),
        non_torch_bytes=round(c.non_torch_bytes + c.non_torch_bytes_per_extra_gpu * (tensor_parallel_size - 1)),
        cuda_graphs=graphs,
    )
