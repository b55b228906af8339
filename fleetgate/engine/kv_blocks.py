"""Paged KV cache: how many blocks vLLM carves out of a KV budget, and how many sequences they hold.

The byte formula in `capacity` (KV per token x max length) is the textbook estimate. vLLM allocates the
cache in blocks and reports, at start-up, `KV cache size: N tokens` and `Maximum concurrency for L tokens
per request: X`. This module reproduces that arithmetic (vLLM 0.32, `vllm/v1/core/kv_cache_utils.py` and
`vllm/v1/kv_cache_interface.py`), including the terms the textbook formula lacks:

- **Blocks.** Every layer stores `block_size` tokens per block (vLLM CPU: 128, CUDA: 16); one layer's page
  is `2 x block_size x kv_heads_per_gpu x head_dim x kv_bytes`. A request at `max_model_len` needs
  `ceil(max_model_len / block_size)` whole blocks, so lengths are rounded up to a block.
- **Hybrid attention (Gemma 3, gpt-oss, ...).** Sliding-window layers and full-attention layers get separate
  block tables ("KV cache groups"). The groups have equal layer counts: the smaller type's layer count is the
  group size (the larger one when the two differ by less than 1.5x), each type is split into
  `ceil(layers / group_size)` groups, and one block spans one group: `group_size` pages. All groups draw from
  one pool of `num_blocks = kv_bytes // (group_size x page)` blocks.
- **Sliding windows hold only the window.** A sliding-window group keeps at most
  `min(window - 1 + max_num_batched_tokens, max_model_len)` tokens per request, plus one block because the
  window need not start at a block boundary.
- **Concurrency and tokens.** `max_concurrency = num_blocks / sum over groups of blocks per request` and
  vLLM's `KV cache size` in tokens is `int(max_concurrency x max_model_len)`: for a hybrid model that is
  more than `num_blocks x block_size`, because sliding-window layers do not grow with the context.

A model without sliding-window layers is one group of all layers (`num_blocks = kv_bytes // (layers x
page)`). Inputs: `KvLayout` (the per-layer facts) and the budget; output: `PagedKV`.
Not modelled: KV-cache dtype scales (fp8 with per-head scales), MLA, Mamba state, speculative-decoding
draft layers, decode context parallelism, `num_gpu_blocks_override`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetgate.core.errors import ConfigError

# vLLM chooses these when the user does not: `vllm/platforms/cpu.py` sets 128 on CPU, CUDA keeps 16.
CPU_BLOCK_SIZE = 128
CUDA_BLOCK_SIZE = 16
# vLLM's default `max_num_batched_tokens` for the OpenAI server on CPU and on most GPUs (`arg_utils.py`).
DEFAULT_MAX_NUM_BATCHED_TOKENS = 2048
# Padding layers are avoided when the two attention types differ by less than this factor (vLLM's heuristic).
_GROUP_SIZE_SLACK = 1.5


@dataclass(frozen=True, kw_only=True, slots=True)
class KvLayout:
    """Per-layer KV facts on one GPU (or CPU engine)."""

    layers: int
    sliding_window_layers: int = 0
    sliding_window: int | None = None
    page_bytes: int  # one layer's block: 2 x block_size x kv_heads_per_gpu x head_dim x kv bytes
    block_size: int

    def __post_init__(self) -> None:
        if not 0 <= self.sliding_window_layers <= self.layers:
            raise ConfigError(
                f"KV layout: sliding_window_layers must be in 0..{self.layers}, got {self.sliding_window_layers}"
            )
        if self.sliding_window_layers and (self.sliding_window is None or self.sliding_window < 1):
            raise ConfigError("KV layout: sliding-window layers need a sliding_window >= 1")
        if self.block_size < 1 or self.page_bytes < 1:
            raise ConfigError("KV layout: block_size and page_bytes must be >= 1")


@dataclass(frozen=True, kw_only=True, slots=True)
class PagedKV:
    block_size: int
    bytes_per_block: int  # one block across the layers of one KV cache group
    num_blocks: int
    blocks_per_sequence: int  # summed over the groups, at max_model_len
    max_concurrency: float  # vLLM's "Maximum concurrency for L tokens per request"
    tokens: int  # vLLM's "KV cache size: N tokens"


@dataclass(frozen=True, kw_only=True, slots=True)
class _Group:
    count: int  # how many KV cache groups of this attention type
    blocks_per_sequence: int  # blocks one request at max length needs in one such group


def group_size(*, full_layers: int, sliding_layers: int) -> int:
    """Layers per KV cache group: vLLM's `_get_kv_cache_groups_uniform_page_size` rule."""
    counts = [n for n in (full_layers, sliding_layers) if n > 0]
    if len(counts) == 1:
        return counts[0]
    smallest, largest = min(counts), max(counts)
    return largest if largest < smallest * _GROUP_SIZE_SLACK else smallest


def sliding_window_blocks(*, window: int, max_model_len: int, max_num_batched_tokens: int, block_size: int) -> int:
    """Blocks one request holds in a sliding-window group (`SlidingWindowSpec.max_admission_blocks_per_request`)."""
    tokens = min(window - 1 + max_num_batched_tokens, max_model_len)
    return math.ceil(tokens / block_size) + 1


def _groups(*, layout: KvLayout, max_model_len: int, max_num_batched_tokens: int) -> tuple[int, list[_Group]]:
    full = layout.layers - layout.sliding_window_layers
    sliding = layout.sliding_window_layers
    size = group_size(full_layers=full, sliding_layers=sliding)
    groups = []
    if full:
        full_blocks = math.ceil(max_model_len / layout.block_size)
        groups.append(_Group(count=math.ceil(full / size), blocks_per_sequence=full_blocks))
    if sliding:
        assert layout.sliding_window is not None  # checked in KvLayout
        blocks = sliding_window_blocks(
            window=layout.sliding_window,
            max_model_len=max_model_len,
            max_num_batched_tokens=max_num_batched_tokens,
            block_size=layout.block_size,
        )
        groups.append(_Group(count=math.ceil(sliding / size), blocks_per_sequence=blocks))
    return size, groups


def paged_kv(
    *, layout: KvLayout, kv_cache_bytes: int, max_model_len: int, max_num_batched_tokens: int
) -> PagedKV:
    """vLLM's block count, KV tokens and maximum concurrency for a KV budget of `kv_cache_bytes`."""
    if max_model_len < 1 or max_num_batched_tokens < 1:
        raise ConfigError("paged KV: max_model_len and max_num_batched_tokens must be >= 1")
    size, groups = _groups(layout=layout, max_model_len=max_model_len, max_num_batched_tokens=max_num_batched_tokens)
    bytes_per_block = size * layout.page_bytes
    num_blocks = max(0, kv_cache_bytes) // bytes_per_block
    per_sequence = sum(g.count * g.blocks_per_sequence for g in groups)
    concurrency = num_blocks / per_sequence
    return PagedKV(
        block_size=layout.block_size,
        bytes_per_block=bytes_per_block,
        num_blocks=num_blocks,
        blocks_per_sequence=per_sequence,
        max_concurrency=concurrency,
        tokens=int(concurrency * max_model_len),
    )
