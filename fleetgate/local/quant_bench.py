"""`fleetgate bench engine --compare w4a16,w8a8`: bf16 and quantized Gemma 3 270M, one engine at a time, one run.

For bf16 (the baseline) and each scheme, on the same machine in the same run (engines start one after
the other, each stopped before the next starts):
- weights: bytes of the checkpoint's safetensors files (what the engine loads), and in memory as the
  engine's worker reports them (`fleetgate.local.vllm_plugin`, `$FLEETGATE_LOG_WEIGHT_BYTES`): the bytes
  of the loaded model's tensors, and the worker's RSS and anonymous-RSS growth over the load (vLLM CPU logs
  no weight memory; see `fleetgate.local.vllm_weights`);
- memory: RSS and PSS summed over the engine's process group once it has served requests;
- start-up: launch -> `/health` 200 with the model listed;
- TTFT of a short prompt; decode tokens/s of one stream and aggregate tokens/s of 4 streams;
- quality, against bf16's greedy continuations of 10 short prompts (`--agreement-tokens` tokens each):
  - `teacher_forced_agreement`: each engine is fed prompt + bf16's continuation in one prefill and asked
    for `prompt_logprobs`; the share of continuation positions where its top-1 token (rank 1) is bf16's
    token, pooled over the prompts. Every position is judged on bf16's own prefix, so one early
    difference does not spoil the rest (bf16's own figure is the noise floor of prefill vs decode);
  - `greedy_agreement`: the earlier, stricter figure: the share of positions equal to bf16's greedy
    tokens up to the first divergence (after which the two continue from different texts), averaged;
- `perplexity` on a held-out text (`fleetgate/local/data/heldout_text.txt`, ~720 tokens of prose written
  for this bench, never used for calibration or training): exp(-mean log-probability) of its tokens
  from `prompt_logprobs`, scored in chunks of whole paragraphs that fit the context (one chunk here).
Printed as figures and as ratios against bf16.
"""

from __future__ import annotations

import json
import math
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fleetgate.local.config import EngineConfig
from fleetgate.local.engine_probe import MODEL, decode_rate, group_memory_mib, post_json, stream_times
from fleetgate.local.engines import EngineFleet
from fleetgate.local.model_prep import prepare_model
from fleetgate.local.vllm_command import vllm_specs
from fleetgate.local.vllm_weights import WEIGHT_BYTES_ENV, parse_weight_bytes

BASELINE = "none"
HELDOUT_FILE = "heldout_text.txt"
HELDOUT_CHUNK_CHARS = 6000  # ~1,500 tokens: under the engine's 2,048
PromptLogprobs = list[dict[str, dict[str, Any]] | None]
PROMPTS: tuple[str, ...] = (
    "The capital of France is",
    "Water boils at a temperature of",
    "To make a cup of tea, first",
    "The three primary colours are",
    "A good way to learn a new language is",
    "The largest planet in our solar system is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The main ingredients of bread are",
    "In summary, the benefits of regular exercise are",
)


@dataclass(frozen=True, kw_only=True, slots=True)
class Greedy:
    """One greedy completion: its tokens as text (the first-divergence figure) and as ids (teacher forcing)."""

    tokens: list[str]
    prompt_ids: list[int]
    ids: list[int]


def greedy(url: str, *, prompt: str, max_tokens: int) -> Greedy:
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": 1,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    choice = post_json(f"{url}/v1/completions", body)["choices"][0]
    return Greedy(
        tokens=[str(t) for t in choice["logprobs"]["tokens"]],
        prompt_ids=[int(i) for i in choice["prompt_token_ids"]],
        ids=[int(i) for i in choice["token_ids"]],
    )


def prompt_logprobs(url: str, prompt: str | list[int]) -> tuple[list[int], PromptLogprobs]:
    """(prompt token ids, vLLM's `prompt_logprobs`) of `prompt` (text or token ids), scored in one prefill.

    vLLM 0.32's completions answer: `choices[0].prompt_logprobs`, one entry per prompt token, None for the
    first, else {token id (a JSON string): {"logprob", "rank", "decoded_token"}} holding the prompt's own
    token (with its rank in the model's distribution, 1 = the model's top choice) and the top
    `prompt_logprobs` tokens."""
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 1,
            "return_token_ids": True}  # fmt: skip
    choice = post_json(f"{url}/v1/completions", body)["choices"][0]
    return [int(i) for i in choice["prompt_token_ids"]], choice["prompt_logprobs"]


def _entry(logprobs: PromptLogprobs, position: int, token: int) -> dict[str, Any]:
    entry = logprobs[position]
    if entry is None or str(token) not in entry:
        raise ValueError(f"prompt_logprobs has no entry for token {token} at position {position}")
    return dict(entry[str(token)])


def teacher_forced_matches(logprobs: PromptLogprobs, *, tokens: list[int], start: int) -> int:
    """How many of `tokens` (the prompt's tokens from position `start` on) the model ranks first given the
    tokens before them: per position, the scored model's top-1 is the reference's token. Each position is
    judged on the reference's own prefix, so one divergence does not spoil the positions after it."""
    return sum(_entry(logprobs, start + i, token).get("rank") == 1 for i, token in enumerate(tokens))


def token_logprobs(logprobs: PromptLogprobs, *, tokens: list[int]) -> list[float]:
    """Log-probability of each prompt token after the first (which nothing predicts)."""
    return [float(_entry(logprobs, i, token)["logprob"]) for i, token in enumerate(tokens) if i > 0]


def perplexity(logprobs: list[float]) -> float:
    """exp(-mean log-probability) of the scored tokens."""
    if not logprobs:
        raise ValueError("perplexity of no tokens")
    return math.exp(-sum(logprobs) / len(logprobs))


def text_chunks(text: str, *, max_chars: int) -> list[str]:
    """`text`'s paragraphs (blank-line separated) joined into chunks of at most `max_chars` characters (a
    longer paragraph is a chunk of its own), so that each chunk fits the engine's context."""
    chunks: list[str] = []
    for paragraph in (p.strip() for p in text.split("\n\n")):
        if not paragraph:
            continue
        if chunks and len(chunks[-1]) + 2 + len(paragraph) <= max_chars:
            chunks[-1] += "\n\n" + paragraph
        else:
            chunks.append(paragraph)
    return chunks


def heldout_text() -> str:
    return (Path(__file__).parent / "data" / HELDOUT_FILE).read_text(encoding="utf-8")


def heldout_perplexity(url: str) -> tuple[float, int]:
    """(perplexity, tokens scored) of the packaged held-out text, chunk by chunk."""
    scored: list[float] = []
    for chunk in text_chunks(heldout_text(), max_chars=HELDOUT_CHUNK_CHARS):
        ids, logprobs = prompt_logprobs(url, chunk)
        scored += token_logprobs(logprobs, tokens=ids)
    return perplexity(scored), len(scored)


def teacher_forced_agreement(url: str, reference: list[Greedy]) -> float:
    """Share of the reference's (bf16's) greedy continuation tokens that this engine ranks first when fed
    the reference's prompt and continuation (pooled over the prompts)."""
    matched = total = 0
    for ref in reference:
        _, logprobs = prompt_logprobs(url, ref.prompt_ids + ref.ids)
        matched += teacher_forced_matches(logprobs, tokens=ref.ids, start=len(ref.prompt_ids))
        total += len(ref.ids)
    return matched / max(1, total)


def agreement(reference: list[str], other: list[str]) -> float:
    """Share of `reference` positions matched by `other` before the first divergence."""
    same = 0
    for a, b in zip(reference, other, strict=False):
        if a != b:
            break
        same += 1
    return same / max(1, len(reference))


def _weights_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("*.safetensors"))


def measure(*, scheme: str, max_tokens: int, agreement_tokens: int, reference: list[Greedy] | None) -> dict[str, Any]:
    """One engine's figures; `reference`: bf16's greedy completions (None: this is bf16, scored on its own)."""
    quantization = None if scheme == BASELINE else scheme
    model_path = prepare_model(quantization=quantization)
    logs = Path(tempfile.mkdtemp(prefix=f"fleetgate-quant-bench-{scheme}-"))
    config = EngineConfig(
        base_port=0,
        max_model_len=2048,
        quantization=scheme,  # type: ignore[arg-type]  # checked against QUANTIZATIONS by the CLI
        log_dir=logs,
        env={WEIGHT_BYTES_ENV: "1"},
    )
    out: dict[str, Any] = {"weights_bytes": _weights_bytes(model_path)}
    with EngineFleet(specs=vllm_specs(config=config, model_path=model_path)) as fleet:
        out["engine_start_s"] = fleet.start()
        reported = parse_weight_bytes((logs / "engine-0.log").read_text(errors="replace"))
        nan = float("nan")
        out["weights_tensor_bytes"], out["weights_rss_bytes"], out["weights_anon_bytes"] = reported or (nan, nan, nan)
        url, pgid = fleet.urls[0], fleet.processes[0].pid
        out["greedy"] = [greedy(url, prompt=p, max_tokens=agreement_tokens) for p in PROMPTS]
        out["teacher_forced_agreement"] = teacher_forced_agreement(url, reference or out["greedy"])
        out["perplexity"], out["perplexity_tokens"] = heldout_perplexity(url)
        start, arrivals = stream_times(url, prompt="Once upon a time", max_tokens=max_tokens)
        out["ttft_s"] = arrivals[0] - start
        out["decode_tok_s_1_stream"] = decode_rate(arrivals)
        results: list[list[float]] = []

        def one(i: int) -> None:
            results.append(stream_times(url, prompt=f"Story {i}: once upon a time", max_tokens=max_tokens)[1])

        threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
        t = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        out["decode_tok_s_4_streams"] = sum(len(r) for r in results) / (time.monotonic() - t)
        memory = group_memory_mib(pgid)
        out["rss_mib"], out["pss_mib"] = memory["rss"], memory["pss"]
    return out


def run_compare(*, schemes: list[str], max_tokens: int, agreement_tokens: int, as_json: bool) -> int:
    figures: dict[str, dict[str, Any]] = {}
    for scheme in [BASELINE, *schemes]:
        reference = figures[BASELINE]["greedy"] if figures else None
        figures[scheme] = measure(
            scheme=scheme, max_tokens=max_tokens, agreement_tokens=agreement_tokens, reference=reference
        )
    base = figures[BASELINE]
    for fig in figures.values():
        pairs = zip((g.tokens for g in base["greedy"]), (g.tokens for g in fig["greedy"]), strict=True)
        fig["greedy_agreement"] = sum(agreement(a, b) for a, b in pairs) / len(PROMPTS)
        for key in (
            "weights_bytes",
            "weights_tensor_bytes",
            "weights_rss_bytes",
            "weights_anon_bytes",
            "rss_mib",
            "pss_mib",
            "engine_start_s",
            "ttft_s",
            "decode_tok_s_1_stream",
            "decode_tok_s_4_streams",
            "perplexity",
        ):
            fig[f"{key}_vs_bf16"] = fig[key] / base[key] if base[key] else float("nan")
    if as_json:
        print(json.dumps({k: {f: v for f, v in fig.items() if f != "greedy"} for k, fig in figures.items()}, indent=2))
        return 0
    keys = [k for k in base if k != "greedy"]
    print(f"{'figure':34s}" + "".join(f"{('bf16' if s == BASELINE else s):>14s}" for s in figures))
    for key in keys:
        cells = "".join(f"{figures[s][key]:14.3f}" for s in figures)
        print(f"{key:34s}{cells}")
    return 0
