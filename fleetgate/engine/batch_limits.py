"""The batch limits a vLLM engine runs with: what the spec sets, else vLLM's default for the hardware.

vLLM (0.26 and 0.32, `EngineArgs._set_default_max_num_seqs_and_batched_tokens_args`) fills in
`max_num_batched_tokens` (T) and `max_num_seqs` (S) when they are not given:
- T defaults per hardware (8192 on GPUs of >= 70 GiB other than the A100, else 2048); with chunked
  prefill off it is raised to `max_model_len` (a whole prompt must fit one step); a default T is capped at
  S x max_model_len;
- S defaults per hardware (1024 on those large GPUs, else 256) and, when defaulted, is capped at T.
Then vLLM refuses `T < S` (`SchedulerConfig.verify_max_model_len`: "max_num_batched_tokens must be
greater than or equal to max_num_seqs"): `batch_problem` says so before any pod is made.
The effective limits also size the capacity plan (sliding-window KV, activations, CUDA graphs).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True, slots=True)
class BatchLimits:
    max_num_batched_tokens: int
    max_num_seqs: int


def effective_limits(
    *,
    max_num_seqs: int | None,
    max_num_batched_tokens: int | None,
    chunked_prefill: bool | None,
    max_model_len: int,
    default_seqs: int,
    default_tokens: int,
) -> BatchLimits:
    """T and S as vLLM will run them (see the module docstring); `chunked_prefill` None means vLLM's
    default, which is on for the generative models FleetGate serves."""
    seqs = max_num_seqs if max_num_seqs is not None else default_seqs
    tokens = max_num_batched_tokens
    if tokens is None:
        tokens = default_tokens if chunked_prefill is not False else max(max_model_len, default_tokens)
        tokens = min(seqs * max_model_len, tokens)
    if max_num_seqs is None:
        seqs = min(seqs, tokens)
    return BatchLimits(max_num_batched_tokens=tokens, max_num_seqs=seqs)


def batch_problem(limits: BatchLimits) -> str | None:
    """Why vLLM would refuse these limits, or None."""
    if limits.max_num_batched_tokens < limits.max_num_seqs:
        return (
            f"maxNumSeqs {limits.max_num_seqs} exceeds the {limits.max_num_batched_tokens} tokens one engine step "
            "schedules (maxNumBatchedTokens, or vLLM's default for this accelerator): vLLM refuses to start; "
            f"set maxNumBatchedTokens to at least {limits.max_num_seqs}"
        )
    return None
