"""What the live benchmarks ask of the engines themselves, over HTTP: counters, idleness, cache resets, probes.

- `counters`: every engine's `/metrics` counters (`fleetgate.engine.vllm_counters`), in engine order.
- `wait_idle`: until no engine runs or queues a request (read from `vllm:num_requests_running|waiting`),
  so a point's counters and cache reset start from a quiet fleet.
- `reset_prefix_caches`: vLLM's `POST /reset_prefix_cache` (served with `VLLM_SERVER_DEV_MODE=1`) on
  every engine, retried while requests still hold blocks; `False` when an engine does not serve it (the
  point then runs on whatever the previous one left cached, and says so).
- `chars_per_token`: the engine tokenizer's characters per token on the workload's own words (one
  request with `max_tokens: 1`; the prompt's token count comes from `usage`).
"""

from __future__ import annotations

import asyncio
import random
import time

import aiohttp
import orjson

from fleetgate.engine.vllm_counters import CounterSnapshot, parse_counters
from fleetgate.router.vllm_metrics import parse_vllm_metrics
from fleetgate.sim.workloads import _text


async def metrics_text(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(f"{url}/metrics", timeout=aiohttp.ClientTimeout(total=10)) as resp:
        resp.raise_for_status()
        return await resp.text()


async def counters(session: aiohttp.ClientSession, urls: list[str]) -> list[CounterSnapshot]:
    texts = await asyncio.gather(*(metrics_text(session, u) for u in urls))
    return [parse_counters(t) for t in texts]


async def busy(session: aiohttp.ClientSession, urls: list[str]) -> float:
    """Requests running or waiting, summed over the engines."""
    texts = await asyncio.gather(*(metrics_text(session, u) for u in urls))
    parsed = [parse_vllm_metrics(t) for t in texts]
    return sum(p.running + p.waiting for p in parsed)


async def wait_idle(session: aiohttp.ClientSession, urls: list[str], *, timeout_s: float, settle_s: float = 0.3
                    ) -> bool:
    """True once every engine is idle (then `settle_s` more, for the last step's counters); False on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await busy(session, urls) == 0:
            await asyncio.sleep(settle_s)
            return True
        await asyncio.sleep(0.1)
    return False


async def reset_prefix_caches(session: aiohttp.ClientSession, urls: list[str], *, timeout_s: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout_s
    pending = list(urls)
    while pending:
        still = []
        for url in pending:
            async with session.post(f"{url}/reset_prefix_cache") as resp:
                if resp.status == 404:
                    return False
                ok = resp.status == 200 and bool((orjson.loads(await resp.read()) or {}).get("success", True))
            if not ok:
                still.append(url)
        pending = still
        if pending:
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.2)
    return True


async def model_name(session: aiohttp.ClientSession, url: str) -> str:
    async with session.get(f"{url}/v1/models") as resp:
        resp.raise_for_status()
        return str((await resp.json())["data"][0]["id"])


async def prompt_tokens_of(session: aiohttp.ClientSession, url: str, *, model: str, prompt: str) -> int:
    body = {"model": model, "prompt": prompt, "max_tokens": 1, "temperature": 0}
    async with session.post(f"{url}/v1/completions", data=orjson.dumps(body),
                            headers={"Content-Type": "application/json"}) as resp:
        data = await resp.json()
        if resp.status != 200:
            raise RuntimeError(f"{url}: probe request answered {resp.status}: {str(data)[:300]}")
    return int(data["usage"]["prompt_tokens"])


async def chars_per_token(session: aiohttp.ClientSession, url: str, *, model: str, tokens: int = 1000,
                          seed: int = 0) -> float:
    """Characters per engine token of the workloads' words (the BOS token is left out of the count)."""
    rng = random.Random(seed)
    prompt = _text(rng, tokens, chars_per_token=4)
    empty = await prompt_tokens_of(session, url, model=model, prompt="x")
    counted = await prompt_tokens_of(session, url, model=model, prompt=prompt)
    return len(prompt) / max(1, counted - (empty - 1))
