"""`fleetgate bench estimate`: the CPU each way of counting a request's prompt costs the gateway, per request.

Options, on the same request shapes (a short chat, a 10-turn chat with 5 tools, a 3,000-word `thinking` part,
40 images, a 5-prompt completion list):
- `parse`: `parse_request` (JSON, validation): what every request already pays; the baseline of the ratios;
- `chars/4`: the old estimate (characters of text parts / 4: wrong for the issue-26 defects);
- `bound`: `estimate.estimate_request`, the prompt bound now on the hot path;
- `/tokenize`: the gateway's side of an exact count from an engine (`token_count.EngineTokenCounter`: one
  HTTP round trip), against `--engine URL` (a vLLM) or a fake engine started in a child process, so only the
  gateway's CPU is measured; what the engine spends is not counted here;
- `tokenizer`: the model's own tokenizer and chat template in the gateway process (transformers'
  `apply_chat_template`), with `--tokenizer DIR` (a model directory with its tokenizer files).
CPU is `time.process_time()` over `--n` calls after a warm-up, in microseconds per request, with the ratio to
`parse` measured in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import aiohttp
import orjson

from fleetgate.core.localredis import free_port
from fleetgate.gateway.discovery import StaticEndpointSource
from fleetgate.gateway.estimate import estimate_request
from fleetgate.gateway.parsing import Kind, ParsedRequest, estimate_prompt_tokens, parse_request
from fleetgate.gateway.settings import ModelRoute
from fleetgate.gateway.token_count import EngineTokenCounter

WORDS = " ".join(f"word{i}" for i in range(3000))
TOOL = {"type": "function", "function": {"name": "lookup", "description": "Look a thing up in the catalogue.",
                                         "parameters": {"type": "object", "properties": {
                                             "query": {"type": "string", "description": "what to find"},
                                             "limit": {"type": "integer"}}, "required": ["query"]}}}
IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + "A" * 2000}}


def shapes(model: str) -> dict[str, tuple[Kind, dict[str, Any]]]:
    turns = [{"role": r, "content": f"turn {i}: " + "some words of the conversation " * 6}
             for i, r in enumerate(["user", "assistant"] * 5)]
    return {
        "short chat": ("chat", {"model": model, "max_tokens": 64,
                                "messages": [{"role": "user", "content": "What is the capital of France?"}]}),
        "10 turns + 5 tools": ("chat", {"model": model, "max_tokens": 64, "tools": [TOOL] * 5, "messages": turns}),
        "3,000-word thinking": ("chat", {"model": model, "max_tokens": 64, "messages": [
            {"role": "assistant", "content": [{"type": "thinking", "thinking": WORDS}]},
            {"role": "user", "content": "go on"}]}),
        "40 images": ("chat", {"model": model, "max_tokens": 64, "messages": [
            {"role": "user", "content": [{"type": "text", "text": "describe"}, *[IMAGE] * 40]}]}),
        "5-prompt completion": ("completions", {"model": model, "max_tokens": 16,
                                                "prompt": ["Once upon a time " * 10] * 5}),
    }


def cpu_us(call: Callable[[], Any], n: int) -> float:
    for _ in range(max(1, n // 10)):
        call()
    started = time.process_time()
    for _ in range(n):
        call()
    return (time.process_time() - started) / n * 1e6


async def cpu_us_async(call: Callable[[], Awaitable[Any]], n: int) -> float:
    for _ in range(max(1, n // 10)):
        await call()
    started = time.process_time()
    for _ in range(n):
        await call()
    return (time.process_time() - started) / n * 1e6


def _local_counter(path: str) -> Callable[[str, ParsedRequest], int]:
    from transformers import AutoTokenizer  # heavy: only for this option

    tokenizer = AutoTokenizer.from_pretrained(path)

    def count(kind: str, parsed: ParsedRequest) -> int:
        body = parsed.body
        if kind == "chat":
            messages = [{**m, "content": m["content"] if isinstance(m["content"], str) else [
                p for p in m["content"] if p.get("type") == "text"] or ""} for m in body["messages"]]
            ids = tokenizer.apply_chat_template(messages, tools=body.get("tools"), tokenize=True,
                                                add_generation_prompt=True)
            return len(ids)
        return sum(len(tokenizer(p)["input_ids"]) for p in body["prompt"])

    return count


async def _measure(args: argparse.Namespace, engine_url: str) -> None:
    model = args.model
    source = StaticEndpointSource([ModelRoute(name=model, endpoints=[engine_url])])
    local = _local_counter(args.tokenizer) if args.tokenizer else None
    async with aiohttp.ClientSession() as session:
        counter = EngineTokenCounter(source=source, session=lambda: session, timeout_s=30)
        load = os.getloadavg()[0]
        print(f"[estimate] CPU per request in the gateway process, {args.n} calls each; load average {load:.2f}; "
              f"engine {engine_url}")
        for name, (kind, body) in shapes(model).items():
            raw = orjson.dumps(body)
            parsed = parse_request(kind, raw)
            base = cpu_us(partial(parse_request, kind, raw), args.n)
            old = cpu_us(partial(estimate_prompt_tokens, parsed.prompt_text), args.n)
            bound = cpu_us(partial(estimate_request, parsed), args.n)
            exact = await cpu_us_async(partial(counter.count, kind=parsed.kind, model=model, body=body),
                                       max(20, args.n // 20))
            line = (f"[estimate] {name:<20} parse {base:6.1f} us | chars/4 {old:4.1f} us | bound {bound:6.1f} us "
                    f"({bound / base:4.2f}x parse) | /tokenize {exact:6.1f} us ({exact / base:5.1f}x)")
            if local is not None:
                tok = cpu_us(partial(local, kind, parsed), max(20, args.n // 20))
                line += f" | tokenizer {tok:8.1f} us ({tok / base:6.1f}x)"
            print(line)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=2000, help="calls per option and shape")
    parser.add_argument("--engine", help="an engine URL for /tokenize (default: a fake engine in a child process)")
    parser.add_argument("--model", default="m1", help="the model name the engine serves")
    parser.add_argument("--tokenizer", help="a model directory: also time its tokenizer + chat template in-process")


def run(args: argparse.Namespace) -> int:
    if args.engine:
        asyncio.run(_measure(args, args.engine.rstrip("/")))
        return 0
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "fleetgate.sim.fake_engine", "--port", str(port), "--model",
                             args.model], env={**os.environ, "PYTHONSAFEPATH": "1"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                import urllib.request

                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        asyncio.run(_measure(args, f"http://127.0.0.1:{port}"))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return 0
