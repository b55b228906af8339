"""Measure an OpenAI-compatible engine's TTFT vs prompt length and TPOT vs batch size, and fit the
simulator's step-time constants to it.

Probes (streaming `/v1/completions`, fresh random prompts so nothing is served from the prefix cache):
- TTFT at batch 1 for each prompt length L (tokens as the engine reports them in `usage`);
- time per output token with B concurrent requests of `decode_prompt_tokens` tokens each.
Least-squares fits: TTFT(L) = a + b * L  and  TPOT(B) = c + d * B. They map onto `SimProfile` as
prefill_s_per_token = b, decode_s_per_seq = d, step_overhead_s = c (a step with one sequence
costs c + d, so a small a - c is the engine's per-request overhead outside the step loop).
`fleetgate sim --calibrate URL` prints the real engine's figures, the fit, and the simulator's own
figures under the fitted profile side by side; the simulator's characters per token is set to the
engine's measured ratio so both count about the same tokens for the same prompt.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from dataclasses import dataclass

import aiohttp
import orjson

from fleetgate.sim.workloads import _text


@dataclass(slots=True)
class Probe:
    ttft_by_len: dict[int, float]  # prompt tokens (engine's count) -> median TTFT seconds
    tpot_by_batch: dict[int, float]  # batch size -> median seconds per output token
    chars_per_token: float = 4.0  # prompt characters per engine token, over the TTFT probes


async def _one(session: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int
               ) -> tuple[float, float, int]:
    """(ttft, tpot, prompt_tokens) of one streamed completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    stamps: list[float] = []
    prompt_tokens = 0
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for raw in resp.content:
            line = raw.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = orjson.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text") is not None:
                stamps.append(time.perf_counter())
            if chunk.get("usage"):
                prompt_tokens = int(chunk["usage"]["prompt_tokens"])
    ttft = stamps[0] - start if stamps else float("nan")
    tpot = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else float("nan")
    return ttft, tpot, prompt_tokens


async def probe(
    *, url: str, model: str, prompt_lengths: tuple[int, ...] = (64, 256, 512, 1024, 1536),
    batch_sizes: tuple[int, ...] = (1, 2, 4, 8), reps: int = 3, output_tokens: int = 32,
    decode_prompt_tokens: int = 64, chars_per_token: float = 4, seed: int = 0,
) -> Probe:
    rng = random.Random(seed)
    out = Probe(ttft_by_len={}, tpot_by_batch={})
    chars = tokens_total = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        await _one(session, url, model, "warm up " + _text(rng, 32), 2)
        for n in prompt_lengths:
            samples, tokens = [], 0
            for _ in range(reps):
                prompt = f"{rng.random()} " + _text(rng, n, chars_per_token=chars_per_token)
                ttft, _, tokens = await _one(session, url, model, prompt, 1)
                samples.append(ttft)
                chars += len(prompt.encode())
                tokens_total += tokens
            out.ttft_by_len[tokens] = statistics.median(samples)
        out.chars_per_token = chars / max(1, tokens_total)
        for b in batch_sizes:
            samples = []
            for _ in range(reps):
                prompts = [f"{rng.random()} " + _text(rng, decode_prompt_tokens, chars_per_token=chars_per_token)
                           for _ in range(b)]
                results = await asyncio.gather(*(_one(session, url, model, p, output_tokens) for p in prompts))
                samples.extend(r[1] for r in results)
            out.tpot_by_batch[b] = statistics.median(samples)
    return out


def fit_line(points: dict[int, float]) -> tuple[float, float]:
    """Least squares y = a + b x over the points."""
    xs, ys = list(points), list(points.values())
    slope, intercept = statistics.linear_regression(xs, ys)
    return intercept, slope


def report(real: Probe, sim: Probe | None) -> str:
    lines = ["TTFT at batch 1 (s):", f"  {'prompt tokens':>14}{'engine':>10}{'sim':>10}{'sim/engine':>12}"]
    sim_ttft = list(sim.ttft_by_len.values()) if sim else []
    for i, (n, t) in enumerate(real.ttft_by_len.items()):
        s = sim_ttft[i] if i < len(sim_ttft) else float("nan")
        lines.append(f"  {n:>14}{t:>10.3f}{s:>10.3f}{s / t:>12.2f}")
    lines += ["Time per output token (s):", f"  {'batch':>14}{'engine':>10}{'sim':>10}{'sim/engine':>12}"]
    for b, t in real.tpot_by_batch.items():
        s = sim.tpot_by_batch.get(b, float("nan")) if sim else float("nan")
        lines.append(f"  {b:>14}{t:>10.4f}{s:>10.4f}{s / t:>12.2f}")
    return "\n".join(lines)
