"""`fleetgate bench precise-prefix`: what precise prefix routing costs per request and per KV event, in-process.

Decision path (per request, `--rounds` x `--requests` calls, p50 and p99 of this thread's CPU time in
microseconds: the box is shared, and wall time would mostly measure other processes' time slices):
- `score`: `PrecisePrefixScorer.score` over `--endpoints` endpoints whose block sets each hold `--held-blocks`
  blocks (an 8B model on an H100 holds ~25k blocks of 16 tokens), for a prompt of `--prompt-tokens` tokens
  whose prefix is held, to varying depth, by some of them;
- `produce`: the producer without tokenization (the chained token-block hashes of the prompt, and the
  usability checks);
- baseline, same run: the approximate `prefix-affinity-scorer`'s produce and score on the prompt's text
  (`--prompt-tokens` x 4 characters), the decision cost FleetGate ships today. Ratios are against it.
Event path: decoding and applying `BlockStored` batches (`--event-blocks` blocks of `--block-size` tokens per
event, vLLM's tagged-map msgpack), microseconds per block, then `BlockRemoved` for the same blocks.
Tokenization (the request side's other cost): with `--tokenize-url URL`, vLLM's own `POST /tokenize` of a
chat request of ~`--prompt-tokens` tokens (wall time per call: the gateway waits for it); with `--tokenizer-path
DIR`, the same request through the model's Hugging Face tokenizer in this process (CPU time per call), whole and
segment-wise (`fleetgate.router.segment_tokens`: the repeated system prompt from its cache).

The box is shared: the load average is printed beside the figures; compare ratios, not raw numbers, across runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import time
from collections.abc import Callable
from typing import Any

from fleetgate.core.types import Endpoint
from fleetgate.router.fleet_state import FleetState
from fleetgate.router.kv_block_index import EndpointBlocks
from fleetgate.router.kv_events import BlockRemoved, BlockStored, KvEvent, decode_batch, encode_batch
from fleetgate.router.kv_fleet import KvEventFleet
from fleetgate.router.kv_subscriber import EndpointKvState
from fleetgate.router.plugins.base import CycleState
from fleetgate.router.plugins.precise_prefix_scorer import PrecisePrefixScorer
from fleetgate.router.plugins.prefix_scorer import PrefixAffinityScorer
from fleetgate.router.prompt_tokens import EngineTokenizer, LocalTokenizer
from fleetgate.router.types import RoutingRequest


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--endpoints", type=int, default=8, help="candidate endpoints (default 8)")
    parser.add_argument("--held-blocks", type=int, default=25_000, help="blocks each endpoint holds (default 25000)")
    parser.add_argument("--block-size", type=int, default=16, help="tokens per KV block (vLLM GPU default 16)")
    parser.add_argument("--prompt-tokens", type=int, default=1024, help="prompt length in tokens (default 1024)")
    parser.add_argument("--requests", type=int, default=2000, help="decisions timed per round (default 2000)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the best round's percentiles are kept")
    parser.add_argument("--event-blocks", type=int, default=16, help="blocks per BlockStored event (default 16)")
    parser.add_argument("--tokenize-url", default=None, help="an engine base URL: time its POST /tokenize")
    parser.add_argument("--tokenize-model", default=None, help="served model name for /tokenize (default: asked)")
    parser.add_argument("--tokenizer-path", default=None, help="a tokenizer directory: time the local tokenizer")
    parser.add_argument("--seed", type=int, default=1)


def _percentiles(samples_ns: list[int]) -> tuple[float, float]:
    ordered = sorted(samples_ns)
    return ordered[len(ordered) // 2] / 1e3, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] / 1e3


def _best(rounds: int, run: Callable[[], list[int]]) -> tuple[float, float]:
    results = [_percentiles(run()) for _ in range(rounds)]
    return min(results, key=lambda r: r[1])


def _endpoints(n: int) -> list[Endpoint]:
    return [Endpoint(id=f"10.0.0.{i}:8000", url=f"http://10.0.0.{i}:8000", model="m") for i in range(n)]


def _filled_state(*, rng: random.Random, held: int, size: int, prompt: list[int], depth: int) -> EndpointKvState:
    """An endpoint holding `held` blocks: `depth` blocks of the prompt's prefix, the rest of other prompts."""
    state = EndpointKvState()
    state.connected = state.synced = True
    blocks = state.blocks
    events: list[KvEvent] = []
    if depth:
        events.append(BlockStored(block_hashes=tuple(rng.getrandbits(64) for _ in range(depth)), parent_block_hash=None,
                                  token_ids=tuple(prompt[: depth * size]), block_size=size, medium="GPU", group_idx=0))
    per_chain = 64
    for _ in range(max(0, held - depth) // per_chain):
        tokens = tuple(rng.randrange(128_000) for _ in range(per_chain * size))
        events.append(BlockStored(block_hashes=tuple(rng.getrandbits(64) for _ in range(per_chain)),
                                  parent_block_hash=None, token_ids=tokens, block_size=size, medium="GPU", group_idx=0))
    blocks.apply(decode_batch(encode_batch(events)))
    return state


def _decision_bench(args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    rng = random.Random(args.seed)
    size, endpoints = args.block_size, _endpoints(args.endpoints)
    prompt = [rng.randrange(128_000) for _ in range(args.prompt_tokens)]
    n_blocks = args.prompt_tokens // size
    fleet_state = FleetState()
    fleet = KvEventFleet()
    for i, ep in enumerate(endpoints):  # depths spread from none to the whole prompt
        depth = n_blocks * i // max(1, len(endpoints) - 1) if i % 2 == 0 else 0
        fleet.states[ep.id] = _filled_state(rng=rng, held=args.held_blocks, size=size, prompt=prompt, depth=depth)
    approx = PrefixAffinityScorer(name="approx", state=fleet_state)
    precise = PrecisePrefixScorer(name="precise", state=fleet_state, fleet=fleet, tokenizer=_Fixed(prompt),
                                  approx=PrefixAffinityScorer(name="precise.approx", state=fleet_state))
    text = "".join(chr(97 + t % 26) for t in prompt) * 4  # ~4 characters per token
    req = RoutingRequest(request_id="r", model="m", prompt_text=text, kind="completions", body={"prompt": "x"})
    for ep in endpoints[:2]:  # the approximate index knows a little, as in a running gateway
        approx.on_start(req, {}, ep)

    def timed(call: Callable[[CycleState], Any], prepare: Callable[[CycleState], Any] | None = None) -> list[int]:
        """CPU time of each call (this thread's, so other processes' load does not count), in ns."""
        out = []
        for _ in range(args.requests):
            cycle: CycleState = {}
            if prepare is not None:
                _drive(prepare(cycle))
            t0 = time.thread_time_ns()
            _drive(call(cycle))
            out.append(time.thread_time_ns() - t0)
        return out

    return {
        "approximate produce": _best(args.rounds, lambda: timed(lambda c: approx.produce(req, c, endpoints))),
        "approximate score": _best(args.rounds, lambda: timed(
            lambda c: approx.score(req, c, endpoints), lambda c: approx.produce(req, c, endpoints))),
        "precise produce (no tokenizer)": _best(args.rounds, lambda: timed(
            lambda c: precise.produce(req, c, endpoints))),
        "precise score": _best(args.rounds, lambda: timed(
            lambda c: precise.score(req, c, endpoints), lambda c: precise.produce(req, c, endpoints))),
    }


def _drive(result: Any) -> None:
    """Run a coroutine that never suspends (no I/O here) without an event loop's scheduling cost."""
    if asyncio.iscoroutine(result):
        try:
            result.send(None)
        except StopIteration:
            return
        raise RuntimeError("the benchmarked call suspended")


class _Fixed:
    def __init__(self, tokens: list[int]) -> None:
        self.tokens_ = tokens

    async def tokens(self, req: RoutingRequest, endpoints: Any) -> list[int]:
        return self.tokens_

    async def warm(self, timeout_s: float) -> None:
        return None

    async def aclose(self) -> None:
        return None


def _event_bench(args: argparse.Namespace) -> tuple[float, float]:
    """(µs per stored block, µs per removed block), decoding included."""
    rng = random.Random(args.seed)
    size, k = args.block_size, args.event_blocks
    stored, removed = [], []
    for _ in range(500):
        hashes = tuple(rng.getrandbits(64) for _ in range(k))
        tokens = tuple(rng.randrange(128_000) for _ in range(k * size))
        stored.append(encode_batch([BlockStored(block_hashes=hashes, parent_block_hash=None, token_ids=tokens,
                                                block_size=size, medium="GPU", group_idx=0)]))
        removed.append(encode_batch([BlockRemoved(block_hashes=hashes, medium="GPU", group_idx=0)]))
    blocks = EndpointBlocks()
    t0 = time.process_time()
    for payload in stored:
        blocks.apply(decode_batch(payload))
    t1 = time.process_time()
    for payload in removed:
        blocks.apply(decode_batch(payload))
    t2 = time.process_time()
    total = len(stored) * k
    return (t1 - t0) / total * 1e6, (t2 - t1) / total * 1e6


def _chat_body(tokens: int) -> dict[str, Any]:
    words = " ".join(f"word{i % 97}" for i in range(tokens // 2))  # ~2 tokens per such word
    return {"messages": [{"role": "system", "content": words}, {"role": "user", "content": "What do you see?"}]}


async def _tokenize_bench(args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    out: dict[str, tuple[float, float]] = {}
    n = max(20, args.requests // 20)
    if args.tokenize_url:
        import aiohttp

        model = args.tokenize_model
        if model is None:
            async with aiohttp.ClientSession() as session, session.get(f"{args.tokenize_url}/v1/models") as resp:
                model = (await resp.json())["data"][0]["id"]
        endpoint = Endpoint(id="engine", url=args.tokenize_url.rstrip("/"), model=model)
        tok = EngineTokenizer(choose=lambda eps: eps[0], timeout_s=10.0, cache_entries=1)
        samples = []
        for i in range(n):  # a new prompt each time: the tokenizer's cache must not answer
            body = _chat_body(args.prompt_tokens)
            body["messages"][1]["content"] += f" ({i})"
            req = RoutingRequest(request_id=str(i), model=model, prompt_text="", kind="chat", body=body)
            t0 = time.perf_counter_ns()
            tokens = await tok.tokens(req, [endpoint])
            samples.append(time.perf_counter_ns() - t0)
            assert tokens, "the engine did not tokenize"
        await tok.aclose()
        out["engine /tokenize (wall)"] = _percentiles(samples)
    if args.tokenizer_path:
        # The system prompt repeats and the question changes: the segment-wise encode reads the system prompt from
        # its cache after two sightings; the whole-prompt row (segment cache off) is what shipped before it.
        for row, segment_entries in (("local tokenizer, whole prompt (CPU)", 0),
                                     ("local tokenizer, segment-wise (CPU)", 16384)):
            out[row] = await _local_tokenizer_cpu(args, n, segment_entries=segment_entries)
    return out


async def _local_tokenizer_cpu(args: argparse.Namespace, n: int, *, segment_entries: int) -> tuple[float, float]:
    local = LocalTokenizer(paths={"m": args.tokenizer_path}, cache_entries=1, segment_entries=segment_entries)
    warm = RoutingRequest(request_id="w", model="m", prompt_text="", kind="chat", body=_chat_body(16))
    await local.warm(60.0)  # loads the tokenizer in a thread (not timed)
    if await local.tokens(warm, _endpoints(1)) is None:
        raise SystemExit(f"the tokenizer in {args.tokenizer_path} did not load")
    samples = []
    for i in range(n + 2):
        body = _chat_body(args.prompt_tokens)
        body["messages"][1]["content"] += f" ({i})"
        req = RoutingRequest(request_id=str(i), model="m", prompt_text="", kind="chat", body=body)
        t0 = time.process_time_ns()
        await local.tokens(req, _endpoints(1))
        if i >= 2:  # the segment cache admits the system prompt on its second sighting
            samples.append(time.process_time_ns() - t0)
    return _percentiles(samples)


def run(args: argparse.Namespace) -> int:
    decisions = _decision_bench(args)
    per_stored, per_removed = _event_bench(args)
    tokenize = asyncio.run(_tokenize_bench(args))
    base = decisions["approximate score"][1]
    print(f"fleetgate bench precise-prefix  ({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"{args.endpoints} endpoints x {args.held_blocks} blocks, prompt {args.prompt_tokens} tokens, "
          f"block {args.block_size})")
    print(f"{'per request':36} {'p50 us':>9} {'p99 us':>9} {'p99 / approximate score':>24}")
    for name, (p50, p99) in {**decisions, **tokenize}.items():
        print(f"{name:36} {p50:9.1f} {p99:9.1f} {p99 / base:24.2f}")
    print(f"events: {per_stored:.2f} us CPU per stored block, {per_removed:.2f} us per removed block "
          f"(decode + apply, {args.event_blocks} blocks of {args.block_size} tokens per event)")
    return 0
