"""The precise scorer's per-request CPU on the gateway's event loop: encode on the loop against in a thread (issue 24).

Replays the GPU routing benchmark's shared-prefix workload as the 1.5x point of run 6b drew it
(`fleetgate.sim.workloads.sized_items`: 48 system prompts of 2,048 tokens, a unique ~96-token question each, Gemma
3's 6.48 characters per token, 92.3 req/s over 10 s: 914 completions prompts) through `LocalTokenizer.tokens` plus
`token_block_hashes` (block size 16), what the scorer's `produce` does per request, with a fresh segment cache per
arm. Arms, alternated `--rounds` times in one process: `loop` (`thread_min_chars=None`: every encode on the event
loop, the code before this change) and `thread` (the default, 512; `thread:N` for another threshold). A `legacy`
arm (no such parameter: the checkout's code before the change, run with that checkout's interpreter) is measured
alone.

Figures per arm:
- CPU per request, sequential: the process's CPU (every thread) and the event loop thread's own CPU (what delays
  every other request and streamed chunk), ms per request.
- Loop lag under `--rate` req/s (Poisson, the same requests): a probe task sleeping 1 ms records how late it
  wakes (p50, p99, p99.9, max; sum of lateness over 1 ms), while `--busy` of the loop's time goes to synthetic
  stream-relay work (0.2 ms slices of Python); and each request's time from arrival to hashes (p50, p99), which
  the thread hand-off can lengthen when the loop is busy.
- `--kv`: decode + apply CPU of vLLM-shaped KV-event batches per 1,000 blocks (the stores of the same prompts'
  blocks on one engine with 4,096 blocks, evicting LRU, as `BlockStored`/`BlockRemoved` batches).

    PYTHONSAFEPATH=1 .venv/bin/python scripts/precise_offload_bench.py --rounds 3 --kv
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import random
import statistics
import time
from collections import OrderedDict
from typing import Any

from fleetgate.core.types import Endpoint
from fleetgate.router.hashing import token_block_hashes
from fleetgate.router.prompt_tokens import LocalTokenizer, load
from fleetgate.router.types import RoutingRequest
from fleetgate.sim.workloads import Sizes, sized_items

ENDPOINTS = [Endpoint(id="e", url="http://127.0.0.1:1", model="m")]
BLOCK = 16


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", default=None, help="tokenizer directory (default: the prepared Gemma 3 model)")
    parser.add_argument("--arms", default="loop,thread",
                        help="comma-separated: loop, thread (or thread:N, N the threshold in characters), legacy")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=float, default=100.0, help="req/s of the loop-lag phase")
    parser.add_argument("--busy", type=float, default=0.3, help="share of the loop's time in synthetic relay work")
    parser.add_argument("--seed", type=int, default=91)
    parser.add_argument("--kv", action="store_true", help="also time KV-event decode + apply")
    return parser.parse_args()


def _requests(seed: int) -> list[RoutingRequest]:
    items = sized_items("shared-prefix", seed=seed, rate=92.3, window_s=10.0, sizes=Sizes(), chars_per_token=6.483,
                        capacity_tokens=65536, replicas=2)
    return [RoutingRequest(request_id=it.id, model="m", prompt_text="", kind="completions",
                           body={"model": "m", "prompt": it.prompt}) for it in items]


def _tokenizer(arm: str, path: str) -> LocalTokenizer:
    """A tokenizer with a fresh segment cache (the first request of each system prompt encodes it whole)."""
    kwargs: dict[str, Any] = {"paths": {"*": path}, "cache_entries": 1}
    if arm != "legacy":
        kwargs["thread_min_chars"] = None if arm == "loop" else int(arm.partition(":")[2] or 512)
    tok = LocalTokenizer(**kwargs)
    tok._loaded["*"] = load(path, segment_entries=16384, segment_bytes=64 << 20)
    return tok


async def _one(tok: LocalTokenizer, req: RoutingRequest) -> list[int]:
    tokens = await tok.tokens(req, ENDPOINTS)
    if tokens is None:
        raise SystemExit("tokenizing failed")
    return token_block_hashes(tokens, block_size=BLOCK, max_blocks=1024)


async def _cpu(tok: LocalTokenizer, reqs: list[RoutingRequest]) -> tuple[dict[str, float], list[list[int]]]:
    p0, t0 = time.process_time(), time.thread_time()
    out = [await _one(tok, r) for r in reqs]
    n = len(reqs)
    return {"cpu_ms": (time.process_time() - p0) / n * 1e3, "loop_cpu_ms": (time.thread_time() - t0) / n * 1e3}, out


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _lag(tok: LocalTokenizer, reqs: list[RoutingRequest], *, rate: float, busy: float, seed: int
               ) -> dict[str, float]:
    rng = random.Random(seed)
    lags: list[float] = []
    waits: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        while not done.is_set():
            t = time.perf_counter()
            await asyncio.sleep(0.001)
            lags.append(time.perf_counter() - t - 0.001)

    async def relay() -> None:  # other requests' streams: `busy` of the loop's time in 0.2 ms slices
        while not done.is_set():
            end = time.perf_counter() + 0.0002
            while time.perf_counter() < end:
                pass
            await asyncio.sleep(0.0002 * (1 - busy) / busy if busy > 0 else 0.01)

    async def request(req: RoutingRequest) -> None:
        t = time.perf_counter()
        await _one(tok, req)
        waits.append(time.perf_counter() - t)

    tasks = [asyncio.create_task(probe())] + ([asyncio.create_task(relay())] if busy > 0 else [])
    running = []
    start = time.perf_counter()
    at = 0.0
    for req in reqs:
        at += rng.expovariate(rate)
        delay = start + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        running.append(asyncio.create_task(request(req)))
    await asyncio.gather(*running)
    done.set()
    await asyncio.gather(*tasks)
    ms = [x * 1e3 for x in lags]
    return {"lag_p50_ms": _pct(ms, 0.5), "lag_p99_ms": _pct(ms, 0.99), "lag_p999_ms": _pct(ms, 0.999),
            "lag_max_ms": max(ms), "lag_over_1ms_sum_ms": sum(x - 1 for x in ms if x > 1),
            "decision_p50_ms": _pct(waits, 0.5) * 1e3, "decision_p99_ms": _pct(waits, 0.99) * 1e3}


def _kv_batches(hashes: list[list[int]], tokens_of: list[list[int]]) -> list[bytes]:
    """One engine storing each prompt's blocks it lacks (LRU over 4,096 blocks) as vLLM publishes them."""
    from fleetgate.router.kv_events import BlockRemoved, BlockStored, encode_batch

    engine: OrderedDict[int, None] = OrderedDict()  # our chain hash stands in for the engine's block hash
    out = []
    for chain, tokens in zip(hashes, tokens_of, strict=True):
        have = 0
        while have < len(chain) and chain[have] in engine:
            engine.move_to_end(chain[have])
            have += 1
        new = chain[have:]
        if not new:
            continue
        events: list[Any] = []
        evict = max(0, len(engine) + len(new) - 4096)
        if evict:
            events.append(BlockRemoved(block_hashes=tuple(engine.popitem(last=False)[0] for _ in range(evict))))
        events.append(BlockStored(block_hashes=tuple(new), parent_block_hash=chain[have - 1] if have else None,
                                  token_ids=tuple(tokens[have * BLOCK:len(chain) * BLOCK]), block_size=BLOCK,
                                  lora_name=None, medium="GPU", group_idx=None, spec_kind=None, extra_keys=None))
        engine.update((h, None) for h in new)
        out.append(encode_batch(events, ts=time.time()))
    return out


def _kv(payloads: list[bytes]) -> dict[str, float]:
    from fleetgate.router.kv_subscriber import EndpointKvState

    state = EndpointKvState()
    blocks = 0
    t0 = time.process_time()
    for seq, payload in enumerate(payloads):
        state.apply(payload, seq)
    cpu = time.process_time() - t0
    blocks = state.stats.applied.stored + state.stats.applied.removed
    return {"batches": len(payloads), "blocks": blocks, "cpu_ms_per_1000_blocks": cpu / blocks * 1e6,
            "cpu_us_per_batch": cpu / len(payloads) * 1e6}


async def main() -> None:
    args = _args()
    path = args.tokenizer
    if path is None:
        from fleetgate.local.model_prep import prepare_model

        path = str(prepare_model())
    arms = [a for a in args.arms.split(",") if a]
    if "thread_min_chars" not in inspect.signature(LocalTokenizer).parameters and arms != ["legacy"]:
        raise SystemExit("this checkout's LocalTokenizer has no thread_min_chars: run --arms legacy")
    reqs = _requests(args.seed)
    print(json.dumps({"requests": len(reqs), "prompt_chars_mean": statistics.mean(len(r.body["prompt"]) for r in reqs
                                                                                if r.body), "arms": arms,
                      "load_average": os.getloadavg()}))
    reference: list[list[int]] | None = None
    tokens_of: list[list[int]] = []
    for rnd in range(args.rounds):
        for arm in arms:
            tok = _tokenizer(arm, path)
            cpu, hashes = await _cpu(tok, reqs)
            if reference is None:
                reference = hashes
                tokens_of = [await tok.tokens(r, ENDPOINTS) or [] for r in reqs]
            elif hashes != reference:
                raise SystemExit(f"arm {arm} hashed differently: the decisions would differ")
            tok = _tokenizer(arm, path)
            lag = await _lag(tok, reqs, rate=args.rate, busy=args.busy, seed=args.seed + rnd)
            print(json.dumps({"round": rnd, "arm": arm, **{k: round(v, 4) for k, v in {**cpu, **lag}.items()},
                              "encodes": getattr(tok, "encodes", None), "load_average": os.getloadavg()}))
            await tok.aclose()
    if args.kv and reference is not None:
        payloads = _kv_batches(reference, tokens_of)
        for rnd in range(args.rounds):
            print(json.dumps({"round": rnd, "kv": {k: round(v, 3) for k, v in _kv(payloads).items()},
                              "load_average": os.getloadavg()}))


if __name__ == "__main__":
    asyncio.run(main())
