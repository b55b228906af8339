"""Throughput and time to first token of one engine, at a few concurrency levels.

Each request is a streamed `/v1/completions` call whose prompt is a list of token ids (exactly
`prompt_tokens` long, drawn at random per request so that prefix caching never serves one from another)
and whose answer is `max_tokens` tokens (`ignore_eos`). At a level of C streams, C workers send
`C x rounds` requests back to back (3 at one stream, for three TTFT samples). Reported per level:
output tokens/s = completion tokens of every request / the level's wall time; TTFT = time from sending a
request to its first streamed chunk with a choice (p50, p90 over the level's requests); TPOT = time from a
request's first to its last chunk with a choice over the tokens after the first (p50): the decode step time
without the prefill. A request counts as
ok only if it streamed exactly `max_tokens` tokens (an error event inside a 200 stream is a failure). Everything is
bounded: a level stops starting requests at `deadline` (monotonic seconds) and every request has a
timeout, so a stalled engine costs at most that.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

PROMPT_TOKENS = 1024
MAX_TOKENS = 128
FIRST_ID, LAST_ID = 1000, 200_000  # ordinary vocabulary ids of the Gemma tokenizer (no special tokens)


@dataclass(frozen=True, kw_only=True, slots=True)
class LevelResult:
    concurrency: int
    requests: int
    ok: int
    prompt_tokens: int  # per request
    output_tokens: int  # all requests together
    duration_s: float
    output_tokens_per_s: float
    ttft_p50_s: float | None
    ttft_p90_s: float | None
    error: str | None = None  # the first failure, if any
    tpot_p50_s: float | None = None  # seconds per output token after the first (requests of 2+ tokens)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 1]); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q * len(ordered) + 0.5 - 1e-9)))
    return ordered[rank - 1]


def prompt_ids(*, index: int, length: int, seed: int, vocab_limit: int = LAST_ID) -> list[int]:
    rng = random.Random(seed * 1_000_003 + index)
    return [rng.randrange(FIRST_ID, vocab_limit) for _ in range(length)]


@dataclass(frozen=True, slots=True)
class _Answer:
    ttft_s: float | None
    tpot_s: float | None
    tokens: int
    error: str | None


async def _one(
    session: Any, url: str, *, model: str, prompt: list[int], max_tokens: int, timeout_s: float
) -> _Answer:
    """TTFT, TPOT, completion tokens and the error of one streamed completion."""
    import aiohttp

    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "temperature": 0.0,
            "stream": True, "stream_options": {"include_usage": True}}  # fmt: skip
    start = time.monotonic()
    stamps: list[float] = []  # arrival of each chunk with a choice
    tokens = 0

    def answer(error: str | None) -> _Answer:
        ttft = stamps[0] - start if stamps else None
        # tokens after the first over the time from the first chunk to the last (a chunk may carry several)
        after_first = (tokens or len(stamps)) - 1
        tpot = (stamps[-1] - stamps[0]) / after_first if len(stamps) > 1 and after_first > 0 and error is None else None
        return _Answer(ttft_s=ttft, tpot_s=tpot, tokens=tokens, error=error)

    try:
        async with session.post(url, json=body, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            if resp.status != 200:
                return answer(f"HTTP {resp.status}: {(await resp.text())[:200]}")
            async for raw in resp.content:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:  # vLLM reports a failure inside a stream that already answered 200
                    return answer(f"stream error: {str(chunk['error'])[:200]}")
                if chunk.get("choices"):
                    stamps.append(time.monotonic())
                usage = chunk.get("usage")
                if usage:
                    tokens = int(usage.get("completion_tokens") or 0)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        return answer(f"{type(exc).__name__}: {exc}"[:200])
    if tokens != max_tokens:  # ignore_eos: a whole answer is exactly max_tokens long
        return answer(f"incomplete answer: {tokens} of {max_tokens} tokens")
    return answer(None)


async def run_level(
    *, base_url: str, model: str, concurrency: int, requests: int, deadline: float, seed: int = 0,
    prompt_tokens: int = PROMPT_TOKENS, max_tokens: int = MAX_TOKENS, vocab_limit: int = LAST_ID,
    request_timeout_s: float = 180.0,
) -> LevelResult:
    """One level: `concurrency` workers share `requests` requests; see the module docstring."""
    import aiohttp

    url = base_url.rstrip("/") + "/v1/completions"
    queue = list(range(requests))
    ttfts: list[float] = []
    tpots: list[float] = []
    counts: list[int] = []
    errors: list[str] = []

    async def worker(session: aiohttp.ClientSession) -> None:
        while queue and time.monotonic() < deadline:
            index = queue.pop()
            prompt = prompt_ids(index=index, length=prompt_tokens, seed=seed + concurrency, vocab_limit=vocab_limit)
            timeout = max(1.0, min(request_timeout_s, deadline - time.monotonic()))
            got = await _one(session, url, model=model, prompt=prompt, max_tokens=max_tokens, timeout_s=timeout)
            counts.append(got.tokens)
            if got.error is not None:
                errors.append(got.error)
                continue
            if got.ttft_s is not None:
                ttfts.append(got.ttft_s)
            if got.tpot_s is not None:
                tpots.append(got.tpot_s)

    start = time.monotonic()
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(worker(session) for _ in range(concurrency)))
    duration = time.monotonic() - start
    total = sum(counts)
    return LevelResult(
        concurrency=concurrency, requests=len(counts), ok=len(counts) - len(errors), prompt_tokens=prompt_tokens,
        output_tokens=total, duration_s=round(duration, 3),
        output_tokens_per_s=round(total / duration, 1) if duration > 0 else 0.0,
        ttft_p50_s=percentile(ttfts, 0.5), ttft_p90_s=percentile(ttfts, 0.9), error=errors[0] if errors else None,
        tpot_p50_s=percentile(tpots, 0.5),
    )  # fmt: skip


def requests_for(*, concurrency: int, rounds: int) -> int:
    return 3 if concurrency == 1 else concurrency * rounds


async def post_json(url: str, body: dict[str, Any], *, timeout_s: float = 60.0) -> tuple[int, Any]:
    """(status, parsed JSON or text) of one POST."""
    import aiohttp

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession() as session, session.post(url, json=body, timeout=timeout) as resp:
        text = await resp.text()
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text


# The calibration probe (`SweepConfig.calibrate`): what `fleetgate bench cost` fits step-time constants from.
CALIBRATION_LENGTHS: tuple[int, ...] = (128, 1024, 4096)  # TTFT at one stream, one output token
CALIBRATION_BATCHES: tuple[int, ...] = (1, 16, 64)  # TPOT with B streams of short prompts
DECODE_PROMPT_TOKENS, DECODE_OUTPUT_TOKENS = 64, 32  # as the live routing run's calibration probe
CALIBRATION_REPS = 3  # requests per TTFT length, rounds per decode level


async def calibration(
    *, base_url: str, model: str, deadline: float, vocab_limit: int = LAST_ID, reps: int = CALIBRATION_REPS,
    lengths: tuple[int, ...] = CALIBRATION_LENGTHS, batches: tuple[int, ...] = CALIBRATION_BATCHES,
) -> list[dict[str, Any]]:  # fmt: skip
    """TTFT levels (`probe` "ttft": one stream, `reps` one-token answers per prompt length), then decode levels
    (`probe` "decode": B streams of 64-token prompts and 32-token answers, `reps` rounds; TPOT p50).

    Each probe draws prompts from its own seed, so no prompt shares a prefix with the load levels' or another
    probe's (prefix caching would otherwise serve part of it). Levels not started by `deadline` are left out.
    """
    out: list[dict[str, Any]] = []
    plan = [("ttft", 1, reps, length, 1, 10_000 + length) for length in lengths]
    plan += [("decode", b, requests_for(concurrency=b, rounds=reps), DECODE_PROMPT_TOKENS, DECODE_OUTPUT_TOKENS, 20_000)
             for b in batches]
    for probe, concurrency, requests, prompt_tokens, max_tokens, seed in plan:
        if time.monotonic() > deadline:
            break
        level = await run_level(base_url=base_url, model=model, concurrency=concurrency, requests=requests,
                                deadline=deadline, seed=seed, prompt_tokens=prompt_tokens, max_tokens=max_tokens,
                                vocab_limit=vocab_limit)  # fmt: skip
        out.append({"probe": probe, **level.to_dict()})
    return out
