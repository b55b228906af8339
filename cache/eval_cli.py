"""`fleetgate cache-eval`: precision/recall of the response cache on the labelled data, and lookup latency.

Prints, for `cache_pairs.dev.jsonl` and `cache_conversations.dev.jsonl`: precision, recall on the true
rows and false hits by kind at the shipped defaults (full set, tuning half and held-out half), a sweep
over similarity thresholds with the verifier on and off (the curve), cross-tenant hits, then lookup
latency p50/p99 with `--entries` stored entries and where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path

from fleetgate.cache.config import CacheConfig
from fleetgate.cache.evaluation import MemoEmbedder, Score, load_rows, score_rows, sweep, texts_of

DEFAULT_THRESHOLDS = (0.0, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9, 0.95)


def default_data_dir() -> Path:
    env = os.environ.get("FLEETGATE_EVAL_DATA")
    if env:
        return Path(env)
    return Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "eval"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=None, help="folder with cache_pairs.dev.jsonl (default: "
                        "$FLEETGATE_EVAL_DATA or ../shared/data/eval next to the repository)")
    parser.add_argument("--threshold", type=float, default=None, help="override the shipped similarity threshold")
    parser.add_argument("--rewrite-min", type=float, default=None, help="override the verifier's rewrite_min")
    parser.add_argument("--sweep", type=float, nargs="*", default=list(DEFAULT_THRESHOLDS))
    parser.add_argument("--entries", type=int, default=100_000, help="stored entries for the latency run (0: skip)")
    parser.add_argument("--queries", type=int, default=200, help="lookups timed in the latency run")
    parser.add_argument("--embedder", choices=["minilm-onnx-int8", "minilm-onnx", "minilm", "hashing"],
                        default="minilm-onnx-int8")
    parser.add_argument("--redis", action="store_true", help="also time the fetch (MGET) from a real redis-server "
                        "started on a free loopback port")


def _line(name: str, s: Score) -> str:
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(s.false_by_kind.items())) or "none"
    return (f"  {name:<22} precision {100 * s.precision:5.1f}% ({s.true_hits}/{s.hits})  "
            f"recall {100 * s.recall:5.1f}% ({s.true_hits}/{s.positives})  false hits: {kinds}")


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


async def _evaluate(args: argparse.Namespace) -> int:
    from fleetgate.cache.build import build_embedder

    data = args.data or default_data_dir()
    pairs_path, conv_path = data / "cache_pairs.dev.jsonl", data / "cache_conversations.dev.jsonl"
    for path in (pairs_path, conv_path):
        if not path.is_file():
            print(f"fleetgate cache-eval: {path} not found (use --data)", file=sys.stderr)
            return 2
    base = CacheConfig()
    sem = base.semantic.model_copy(update={"embedder": args.embedder})
    if args.threshold is not None:
        sem = sem.model_copy(update={"threshold": args.threshold})
    if args.rewrite_min is not None:
        sem = sem.model_copy(update={"rewrite_min": args.rewrite_min})
    shipped = base.model_copy(update={"semantic": sem})
    sets = {"pairs": load_rows(pairs_path), "conversations": load_rows(conv_path)}

    start = time.perf_counter()
    embedder = MemoEmbedder(build_embedder(shipped))
    embedder.prime([t for rows in sets.values() for t in texts_of(rows)], progress=_progress)
    print(f"embedder {args.embedder}: {time.perf_counter() - start:.1f} s to load and embed every prompt")
    print(f"settings: threshold {sem.threshold}, rewrite_min {sem.rewrite_min}, top_k {sem.top_k}, "
          f"verify {sem.verify}")
    print("note: the verifier's word lists and rules were designed while reading these dev files (both halves);\n"
          "      the odd-id half is reported apart but is not a clean held-out set")
    for name, rows in sets.items():
        scores = await score_rows(rows, shipped, embedder)
        print(f"\n{name} ({len(rows)} rows, {scores['all'].positives} same=true) at the shipped settings:")
        print(_line("all rows", scores["all"]))
        print(_line("even ids (tuning half)", scores["even"]))
        print(_line("odd ids (held out)", scores["odd"]))
        print(f"  cross-tenant hits: {scores['all'].cross_tenant_hits} of {len(rows)} foreign lookups")
        print("  sweep (threshold: precision / recall / false hits, verifier on | verifier off):")
        on = [shipped.model_copy(update={"semantic": sem.model_copy(update={"threshold": t})}) for t in args.sweep]
        off = [c.model_copy(update={"semantic": c.semantic.model_copy(update={"verify": False})}) for c in on]
        for t, a, b in zip(args.sweep, await sweep(rows, on, embedder), await sweep(rows, off, embedder), strict=True):
            print(f"    {t:4.2f}: {100 * a.precision:5.1f}% / {100 * a.recall:5.1f}% / {a.false_hits:3d}   |"
                  f"   {100 * b.precision:5.1f}% / {100 * b.recall:5.1f}% / {b.false_hits:3d}")
    if args.entries > 0:
        from fleetgate.cache.latency import measure

        print(f"\nlookup latency with {args.entries} entries in one partition (worst case), "
              f"{args.queries} real prompts:")
        prompts = [t for t in texts_of(sets["pairs"])]
        timings, facts = await measure(embedder=embedder.inner, config=shipped, prompts=prompts,
                                       entries=args.entries, queries=args.queries, progress=_progress)
        print(f"  index: {'HNSW' if facts['hnsw'] else 'flat'}, built in {facts['build_s']:.1f} s; "
              f"HNSW top hit == exact top hit for {100 * facts['hnsw_agrees_with_flat']:.1f}% of queries, "
              f"within 0.01 cosine of it for {100 * facts['hnsw_within_001']:.1f}%")
        flat = next(t for t in timings if t.name == "search-flat")
        for t in timings:
            kind = "HNSW" if facts["hnsw"] else "flat"
            ratio = f"  ({kind}; {t.pct(50) / flat.pct(50):.3f}x the flat scan's p50)" if t.name == "search" else ""
            print(f"  {t.name:<12} p50 {t.pct(50):8.3f} ms   p99 {t.pct(99):8.3f} ms{ratio}")
    if args.redis:
        from fleetgate.cache.latency import redis_fetch
        from fleetgate.core.localredis import LocalRedis

        with LocalRedis() as server:
            t = await redis_fetch(url=server.url, k=shipped.semantic.top_k)
        print(f"  {t.name:<12} p50 {t.pct(50):8.3f} ms   p99 {t.pct(99):8.3f} ms  "
              f"(MGET of {shipped.semantic.top_k} x 2 KB records, loopback redis-server)")
    return 0


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return asyncio.run(_evaluate(args))
