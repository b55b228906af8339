"""`fleetgate bench embedder`: the MiniLM backends side by side, agreement first, then CPU cost.

Agreement: every prompt of the eval files (`cache_pairs`, `cache_conversations`: every user message;
`tier_queries`: every query) embedded by the reference (sentence-transformers) and by each ONNX variant,
one text per call and in batches of `--batch`; the per-prompt cosine to the reference (min, p1, mean) and
how many prompts fall under `--min-cosine`.

Cost: CPU seconds per text (this process's own CPU time, so the box's other load counts less than in wall
time) for one text per call and for batches of `--batch`, all backends alternating in `--rounds` rounds,
best round kept; the ratios are against the reference and the fp32 ONNX graph from the same run, with
the load average (the box is shared: compare ratios, not raw figures, across runs). Tokenisation (the
`tokenizers` batch encode) is timed on its own as well.

Event-loop stalls (first, and alone with `--gil-only`): whether an int8 encode in a worker thread holds the
GIL and so stalls the gateway's event loop, or only shares the CPU with it.
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import orjson

from fleetgate.core.minilm_onnx import OnnxMiniLMEmbedder

Embed = Callable[[Sequence[str]], np.ndarray]


def eval_prompts(data: Path) -> list[str]:
    """The user texts of the eval files in `data` (empty and duplicate texts dropped, order kept)."""
    texts: list[str] = []
    for path in sorted(
        p for stem in ("cache_pairs", "cache_conversations", "tier_queries") for p in data.glob(f"{stem}*.jsonl")
    ):  # .dev and .frozen sets alike
        for line in path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            row = orjson.loads(line)
            texts += [str(row[k]) for k in ("a", "b", "text", "prompt", "query") if isinstance(row.get(k), str)]
            for conv in ("conv_a", "conv_b"):
                texts += [str(m["content"]) for m in row.get(conv, []) if m.get("role") == "user"]
    return list(dict.fromkeys(t for t in texts if t.strip()))


def embed_in_batches(embed: Embed, texts: Sequence[str], *, batch: int) -> np.ndarray:
    return np.concatenate([embed(texts[i : i + batch]) for i in range(0, len(texts), batch)])


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.asarray((a * b).sum(axis=1) / (np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1)))


def _cpu_per_text(embed: Embed, texts: Sequence[str], *, batch: int) -> float:
    start = time.process_time()
    embed_in_batches(embed, texts, batch=batch)
    return (time.process_time() - start) / len(texts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=None, help="eval folder (default: as fleetgate cache-eval)")
    parser.add_argument("--batch", type=int, default=16, help="texts per call in the batched runs")
    parser.add_argument("--timed", type=int, default=300, help="prompts in each timed run")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads of every backend")
    parser.add_argument("--min-cosine", type=float, default=0.99)
    parser.add_argument("--gil-only", action="store_true", help="only the event-loop stall measurement")


def run(args: argparse.Namespace) -> int:
    from fleetgate.cache.eval_cli import default_data_dir
    from fleetgate.core.minilm import MiniLMEmbedder

    texts = eval_prompts(args.data or default_data_dir())
    if not texts:
        print("no eval prompts found (use --data)")
        return 2
    _loop_stalls(OnnxMiniLMEmbedder(variant="int8", intra_op_threads=args.threads), texts[: args.batch])
    if args.gil_only:
        return 0
    backends: dict[str, Embed] = {"sentence-transformers": MiniLMEmbedder(threads=args.threads).embed}
    for variant in ("fp32", "int8"):
        backends[f"onnx-{variant}"] = OnnxMiniLMEmbedder(variant=variant, intra_op_threads=args.threads).embed
    reference = embed_in_batches(backends["sentence-transformers"], texts, batch=32)
    print(f"agreement with sentence-transformers on {len(texts)} eval prompts (cosine per prompt):")
    for name, embed in backends.items():
        if name == "sentence-transformers":
            continue
        for label, batch in (("one per call", 1), (f"batches of {args.batch}", args.batch)):
            cos = cosine_rows(embed_in_batches(embed, texts, batch=batch), reference)
            print(
                f"  {name:17} {label:14} min {cos.min():.5f}  p1 {np.percentile(cos, 1):.5f}  "
                f"mean {cos.mean():.5f}  under {args.min_cosine}: {int((cos < args.min_cosine).sum())}"
            )
    timed = texts[:: max(1, len(texts) // args.timed)][: args.timed]  # spread over every eval file
    backends["tokenizer only"] = _tokenize_only(OnnxMiniLMEmbedder())
    best: dict[tuple[str, int], float] = {}
    for _ in range(args.rounds):
        for name, embed in backends.items():
            for batch in (1, args.batch):
                cost = _cpu_per_text(embed, timed, batch=batch)
                best[(name, batch)] = min(best.get((name, batch), cost), cost)
    tokens = np.mean([len(ids) for ids in OnnxMiniLMEmbedder().token_ids(timed)])
    print(
        f"\nCPU per text ({len(timed)} prompts, {tokens:.1f} tokens on average, best of {args.rounds} rounds, "
        f"{args.threads} intra-op thread(s), load average {os.getloadavg()[0]:.1f} at the end):"
    )
    for batch in (1, args.batch):
        ref, old = best[("sentence-transformers", batch)], best[("onnx-fp32", batch)]
        for name in backends:
            cost = best[(name, batch)]
            print(
                f"  batch {batch:3d}  {name:22} {cost * 1e3:7.3f} ms   {ref / cost:5.2f}x the reference's speed, "
                f"{old / cost:5.2f}x onnx-fp32's"
            )
    return 0


def _tokenize_only(embedder: OnnxMiniLMEmbedder) -> Embed:
    """The ONNX embedder's tokenisation alone (the `tokenizers` batch encode), timed like a backend."""

    def embed(texts: Sequence[str]) -> np.ndarray:
        embedder.token_ids(texts)
        return np.zeros((len(texts), 1), dtype=np.float32)

    return embed


def _loop_stalls(embedder: OnnxMiniLMEmbedder, batch: Sequence[str], *, seconds: float = 3.0) -> None:
    """Does an encode block the event loop's thread (the GIL), or only share the CPU with it? The longest
    gap between iterations of a tight Python loop, alone and while a worker thread encodes `batch` over and
    over: if the encode held the GIL, gaps would reach one encode's duration."""
    import threading

    embedder.embed(batch)
    start = time.perf_counter()
    embedder.embed(batch)
    one = time.perf_counter() - start
    stop = threading.Event()

    def encode() -> None:
        while not stop.is_set():
            embedder.embed(batch)

    stalls: dict[str, tuple[int, float]] = {}  # gaps of at least 80% of one encode: count, seconds in them
    for label in ("alone", "beside encodes"):
        worker = threading.Thread(target=encode) if label != "alone" else None
        stop.clear()
        if worker is not None:
            worker.start()
        last = time.perf_counter()
        end, count, stalled = last + seconds, 0, 0.0
        while last < end:
            now = time.perf_counter()
            if now - last >= 0.8 * one:
                count, stalled = count + 1, stalled + now - last
            last = now
        stop.set()
        if worker is not None:
            worker.join()
        stalls[label] = (count, stalled)
    (n_alone, s_alone), (n_beside, s_beside) = stalls["alone"], stalls["beside encodes"]
    print(
        f"event-loop thread beside int8 encodes of {len(batch)} texts ({one * 1e3:.0f} ms each), {seconds:g} s: "
        f"{n_beside} stalls as long as an encode ({s_beside:.2f} s), alone {n_alone} ({s_alone:.2f} s); an encode "
        f"holding the GIL would add ~{seconds / one:.0f}; load average {os.getloadavg()[0]:.1f}\n"
    )
