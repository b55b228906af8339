"""CPU per request of the precise scorer's local tokenizer: whole-prompt encode vs segment-wise encode (issue 24).

The requests are the GPU routing benchmark's shared-prefix workload (`fleetgate.sim.workloads.shared_prefix`:
`--systems` long system prompts of ~`--system-tokens` tokens, each request adding a unique ~`--question-tokens`
question), sent as chat requests (system + user message, the model's chat template) and as completions prompts
(prefix + "\\nQuestion i: ...", what `fleetgate bench live` sends); `--line-words N` breaks the system prompts
into lines (Gemma's `\\n` is an added token: many short pieces, which the encoder groups into chunks). Each
request goes through `LocalTokenizer.tokens` twice, in alternation: the baseline with the segment-wise encode off
(a full encode, what shipped before), and the new default; both with a one-entry request cache (every request is
new), and their
token ids must be equal. Figures are this process's CPU time per request (Rayon's threads included), p50 and p99,
after `--warmup` requests (the segment cache admits a piece on its second sighting), with the load average.

    PYTHONSAFEPATH=1 .venv/bin/python scripts/tokenizer_segments_bench.py [--tokenizer DIR] [--chat-template FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path
from typing import Any

from fleetgate.core.types import Endpoint
from fleetgate.router.hashing import token_block_hashes
from fleetgate.router.prompt_tokens import LocalTokenizer
from fleetgate.router.types import RoutingRequest
from fleetgate.sim.workloads import shared_prefix

ENDPOINTS = [Endpoint(id="e", url="http://127.0.0.1:1", model="m")]


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, default=None,
                        help="tokenizer directory (default: the prepared Gemma 3 270M model directory)")
    parser.add_argument("--chat-template", type=Path, default=None, help="a Jinja chat template file to use")
    parser.add_argument("--systems", type=int, default=4)
    parser.add_argument("--system-tokens", type=int, default=2700)
    parser.add_argument("--question-tokens", type=int, default=96)
    parser.add_argument("--requests", type=int, default=300, help="requests timed per kind")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--line-words", type=int, default=0,
                        help="break the system prompts into lines of this many words (0: one line)")
    parser.add_argument("--seed", type=int, default=24)
    return parser.parse_args()


async def _ready(tok: LocalTokenizer) -> None:
    await tok.warm(120.0)
    if not tok.loaded("m"):
        raise SystemExit("the tokenizer did not load")


def _requests(args: argparse.Namespace, chars_per_token: float) -> dict[str, list[RoutingRequest]]:
    items = shared_prefix(seed=args.seed, groups=args.systems, prompts_per_group=-(-(args.requests + args.warmup)
                          // args.systems), prefix_tokens=args.system_tokens, question_tokens=args.question_tokens,
                          chars_per_token=chars_per_token)[: args.requests + args.warmup]
    chat, completions = [], []
    for item in items:
        system, _, question = item.prompt.partition("\n")
        if args.line_words > 0:
            words = system.split(" ")
            system = "\n".join(" ".join(words[i:i + args.line_words]) for i in range(0, len(words), args.line_words))
        body: dict[str, Any] = {"messages": [{"role": "system", "content": system},
                                             {"role": "user", "content": question}]}
        if args.chat_template is not None:
            body["chat_template"] = args.chat_template.read_text()
        chat.append(RoutingRequest(request_id=item.id, model="m", prompt_text="", kind="chat", body=body))
        completions.append(RoutingRequest(request_id=item.id, model="m", prompt_text="", kind="completions",
                                          body={"prompt": f"{system}\n{question}"}))
    return {"chat": chat, "completions": completions}


def _cpu_ms(samples: list[int]) -> tuple[float, float]:
    ordered = sorted(samples)
    return ordered[len(ordered) // 2] / 1e6, ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] / 1e6


async def main() -> int:
    args = _args()
    if args.tokenizer is None:
        from fleetgate.local.model_prep import prepare_model

        args.tokenizer = prepare_model()
    full = LocalTokenizer(paths={"m": str(args.tokenizer)}, cache_entries=1, segment_entries=0)
    segmented = LocalTokenizer(paths={"m": str(args.tokenizer)}, cache_entries=1)
    await _ready(full)
    await _ready(segmented)
    probe = shared_prefix(seed=args.seed, groups=1, prompts_per_group=1, prefix_tokens=1000)[0].prompt  # its words
    probe_req = RoutingRequest(request_id="p", model="m", prompt_text="", kind="completions", body={"prompt": probe})
    chars_per_token = len(probe) / len(await full.tokens(probe_req, ENDPOINTS) or [0])
    loads = [os.getloadavg()[0]]
    print(f"tokenizer {args.tokenizer}; {os.cpu_count()} CPUs; {args.systems} system prompts of ~{args.system_tokens} "
          f"tokens + ~{args.question_tokens}-token questions; {args.requests} requests per kind after "
          f"{args.warmup} warm-up; lines of {args.line_words or 'all'} words")
    print(f"{'kind':12} {'tokens':>7} {'full p50':>9} {'full p99':>9} {'seg p50':>8} {'seg p99':>8} "
          f"{'p50 ratio':>9} {'hash p50':>9}  (ms of CPU per request)")
    for kind, reqs in _requests(args, chars_per_token).items():
        base, new, hashing, sizes = [], [], [], []
        for i, req in enumerate(reqs):
            t0 = time.process_time_ns()
            want = await full.tokens(req, ENDPOINTS)
            t1 = time.process_time_ns()
            got = await segmented.tokens(req, ENDPOINTS)
            t2 = time.process_time_ns()
            if got != want or not want:
                raise SystemExit(f"{kind} request {i}: the segment-wise ids differ from the full encode")
            token_block_hashes(want, block_size=16, max_blocks=1024)
            t3 = time.process_time_ns()
            if i >= args.warmup:
                base.append(t1 - t0)
                new.append(t2 - t1)
                hashing.append(t3 - t2)
                sizes.append(len(want))
        (b50, b99), (n50, n99), (h50, _) = _cpu_ms(base), _cpu_ms(new), _cpu_ms(hashing)
        print(f"{kind:12} {statistics.median(sizes):7.0f} {b50:9.3f} {b99:9.3f} {n50:8.3f} {n99:8.3f} "
              f"{n50 / b50:9.3f} {h50:9.3f}")
        loads.append(os.getloadavg()[0])
    cache = segmented._loaded["m"].segments  # a benchmark reads the figures it reports
    if cache is None:
        print("the segment-wise encode is OFF for this tokenizer (see the warning above): both columns are full")
    else:
        c = cache.cache
        print(f"segment cache: {len(c)} entries, {c.bytes / 2**20:.1f} MiB, {c.hits} hits, {c.misses} misses")
    print(f"load average (1 min) during the run: {', '.join(f'{x:.2f}' for x in loads)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
