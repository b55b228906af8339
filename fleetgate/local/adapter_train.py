"""Brief LoRA fine-tuning of the packaged Gemma 3 270M on CPU with `peft`, seeded and bounded in steps.

Algorithm: supervised fine-tuning on (question, answer) pairs rendered as the packaged chat template's
plain dialogue (`<bos>User: Q\\n\\nAssistant:` + ` A\\n\\n`). The base weights are frozen (loaded as
float32; the matrix products run in bfloat16 autocast where the CPU has native bfloat16). LoRA matrices
of rank `rank` (scale `alpha / rank`) sit on every attention and MLP projection (the modules vLLM's
Gemma 3 LoRA packs into `qkv_proj` and `gate_up_proj`, plus `o_proj` and `down_proj`). Each step draws
`batch_size` examples from a seeded shuffle, runs the decoder, and takes the cross-entropy over the
answer tokens only: the 262k-row output head, as costly per token as the whole decoder, is applied to
those positions alone. AdamW with a constant learning rate after a short warm-up; `steps` bounds the
work (16 steps of 4 examples: two passes over the text, enough for a visible style on this model).
The result is saved in the PEFT format vLLM loads (`adapter_config.json` + `adapter_model.safetensors`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from fleetgate.local.gemma_format import BLANK_LINE_ID

# vLLM 0.32's Gemma 3 LoRA: qkv_proj <- q/k/v, gate_up_proj <- gate/up, plus o_proj and down_proj.
TARGET_MODULES: Final = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

Progress = Callable[[str], None]


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainRecipe:
    """Everything that decides the adapter's weights (with the base model and the text)."""

    rank: int = 8
    alpha: int = 16
    steps: int = 16
    batch_size: int = 4
    learning_rate: float = 2e-3
    warmup_steps: int = 5
    seed: int = 17


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainReport:
    seconds: float
    first_loss: float
    last_loss: float
    sample: str  # the adapter's greedy answer to a held-out question
    precision: str  # of the matrix products: "bfloat16" (autocast) where the CPU has it natively, else "float32"


def prompt_text(question: str) -> str:
    """The packaged template's dialogue up to the answer (without `<bos>`, which the tokenizer adds)."""
    return f"User: {question.strip()}\n\nAssistant:"


def _encode(tokenizer: Any, pairs: Sequence[tuple[str, str]]) -> list[tuple[list[int], int]]:
    """Token ids of each example and the index where its answer starts; the answer ends with the blank line
    the base model ends a turn with, so the adapter keeps stopping where the engine's end tokens expect."""
    out = []
    for question, answer in pairs:
        prompt = tokenizer(prompt_text(question)).input_ids
        reply = tokenizer(f" {answer.strip()}", add_special_tokens=False).input_ids
        out.append(([*prompt, *reply, BLANK_LINE_ID], len(prompt)))
    return out


def train_adapter(
    *,
    base: Path,
    out: Path,
    pairs: Sequence[tuple[str, str]],
    recipe: TrainRecipe,
    sample_question: str,
    progress: Progress,
    threads: int | None = None,
) -> TrainReport:
    """Train one adapter on `pairs` from the model directory `base`; write it into `out` (created).

    `threads`: intra-op threads; None leaves one core free, as the local engines do (on a busy 2-core box
    two OpenMP threads stall each other at every barrier: one thread was several times faster).
    """
    threads = threads or max(1, (os.cpu_count() or 1) - 1)
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    start = time.monotonic()
    torch.manual_seed(recipe.seed)
    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    config = LoraConfig(
        r=recipe.rank,
        lora_alpha=recipe.alpha,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        target_modules=list(TARGET_MODULES),
    )
    peft_model = get_peft_model(model, config)
    bf16 = _native_bf16(torch)
    causal = peft_model.get_base_model()
    examples = _encode(tokenizer, pairs)
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=recipe.learning_rate, weight_decay=0.0)
    generator = torch.Generator().manual_seed(recipe.seed)
    order: list[int] = []
    losses: list[float] = []
    peft_model.train()
    for step in range(recipe.steps):
        if len(order) < recipe.batch_size:
            order += torch.randperm(len(examples), generator=generator).tolist()
        batch = [examples[i] for i in order[: recipe.batch_size]]
        del order[: recipe.batch_size]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = _loss(torch, causal, batch, pad_id=int(tokenizer.pad_token_id or 0))
        for group in optimizer.param_groups:
            group["lr"] = recipe.learning_rate * min(1.0, (step + 1) / max(1, recipe.warmup_steps))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if step == 0 or (step + 1) % 10 == 0 or step + 1 == recipe.steps:
            progress(
                f"    step {step + 1:3d}/{recipe.steps}  loss {losses[-1]:.3f}  ({time.monotonic() - start:5.1f}s)"
            )
    peft_model.eval()
    sample = greedy_answer(torch, causal, tokenizer, sample_question)
    out.mkdir(parents=True, exist_ok=True)
    peft_model.save_pretrained(str(out), safe_serialization=True)
    return TrainReport(
        seconds=time.monotonic() - start,
        first_loss=losses[0],
        last_loss=losses[-1],
        sample=sample,
        precision="bfloat16" if bf16 else "float32",
    )


def _native_bf16(torch: Any) -> bool:
    """bfloat16 matrix products are ~2-3x faster than float32 on CPUs with AVX512-BF16 or AMX (measured
    here: 4 s vs 12 s a step at batch 8 -> 4); elsewhere they are emulated and slower, so stay float32."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def _loss(torch: Any, causal: Any, batch: list[tuple[list[int], int]], *, pad_id: int) -> Any:
    width = max(len(ids) for ids, _ in batch)
    ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for row, (tokens, _) in enumerate(batch):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        mask[row, : len(tokens)] = 1
    hidden = causal.model(input_ids=ids, attention_mask=mask).last_hidden_state
    # Position t predicts token t + 1: keep the positions whose next token is part of an answer.
    rows, cols, targets = [], [], []
    for row, (tokens, answer_start) in enumerate(batch):
        for t in range(answer_start - 1, len(tokens) - 1):
            rows.append(row)
            cols.append(t)
            targets.append(tokens[t + 1])
    logits = causal.lm_head(hidden[torch.tensor(rows), torch.tensor(cols)])
    return torch.nn.functional.cross_entropy(logits.float(), torch.tensor(targets))


def greedy_answer(torch: Any, causal: Any, tokenizer: Any, question: str, *, max_new_tokens: int = 40) -> str:
    """The greedy continuation of `question`'s dialogue up to the turn-ending blank line."""
    ids = tokenizer(prompt_text(question), return_tensors="pt").input_ids
    with torch.no_grad():
        out = causal.generate(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=[BLANK_LINE_ID, int(tokenizer.eos_token_id or 1)],
            pad_token_id=int(tokenizer.pad_token_id or 0),
        )
    return str(tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)).strip()
