#!/usr/bin/env python3
"""Issue 30, round 6: the CPU of one semantic lookup with the pair veto off and on, in one process.

Two caches built as the gateway builds them (`build_cache`, shipped settings, `embed_memo: 0` so every lookup
encodes as in `bench gateway`), one with `semantic.pair_veto.enabled: false`, sharing one embedder and one
veto scorer (loaded before timing). Per workload the lookups alternate between the two caches, and each
lookup's process CPU time (all threads) is recorded:
- `varied miss`: `bench gateway`'s varied questions (`loadgen.varied_prompt`), each stored after its lookup, so
  every lookup searches among the earlier ones (its near neighbours differ in words: the pair model judges);
- `would-be hit`: the dev set's `same` pairs (`$FLEETGATE_EVAL_DATA`, development data) that reach the veto
  (the pair model accepts them: found in a first pass with it on), each `a` stored in a cache of its own and its
  `b` looked up, cycling (not stored, so it stays a semantic hit). `bench gateway`'s `semantic hit` paraphrase
  no longer serves: the round-4 pair model refuses it (`constraint`), so that workload measures exact hits.
The first `--skip` lookups of each are left out (warm-up). Prints p50 / p90 per cache, the difference, and how
many times the veto ran.

`--baseline-model PATH` (round 7) compares two pair models instead, both caches with the veto off: the one in PATH
(e.g. main's `cache/pair_model.json`, copied aside) against the package's, switched before every lookup (the
cache and the verifier read the model through `load_model`); the would-be hits are then dev `same` pairs the
package's model judges (the word match does not settle them) and serves.

    FLEETGATE_EVAL_DATA=/work/shared/data/eval PYTHONSAFEPATH=1 OMP_NUM_THREADS=1 \
        .venv/bin/python scripts/crossencoder/lookup_cost.py [--baseline-model OLD_pair_model.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from pathlib import Path
from typing import Any

import numpy as np


def _request(text: str) -> Any:
    from fleetgate.cache.types import CacheRequest

    return CacheRequest(tenant="t", model="m", kind="chat",
                        body={"model": "m", "messages": [{"role": "user", "content": text}], "temperature": 0})


ANSWER = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
          "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}],
          "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lookups", type=int, default=400, help="per cache and workload")
    parser.add_argument("--skip", type=int, default=100)
    parser.add_argument("--pairs", type=int, default=40, help="dev pairs for the would-be hits")
    parser.add_argument("--baseline-model", type=Path, help="compare this pair_model.json with the package's "
                        "(veto off in both) instead of the veto off and on")
    args = parser.parse_args()
    from prometheus_client import CollectorRegistry

    from fleetgate.bench.loadgen import varied_prompt
    from fleetgate.cache import twolayer, verifier
    from fleetgate.cache.build import build_embedder, build_prefilter
    from fleetgate.cache.config import CacheConfig
    from fleetgate.cache.eval_cli import default_data_dir
    from fleetgate.cache.metrics import CacheMetrics
    from fleetgate.cache.pairmodel import PairModel, load_model
    from fleetgate.cache.pairveto import default_scorer
    from fleetgate.cache.twolayer import TwoLayerCache
    from fleetgate.cache.types import CacheStatus
    from fleetgate.core.kvstore import MemoryKVStore

    models = None if args.baseline_model is None else {
        "baseline model": PairModel.from_json(args.baseline_model.read_text(encoding="utf-8")),
        "shipped model": load_model()}
    base = CacheConfig()
    caches = (("veto off", False), ("veto on", True)) if models is None else tuple((n, False) for n in models)
    configs = {name: base.model_copy(update={"semantic": base.semantic.model_copy(update={
        "embed_memo": 0, "pair_veto": base.semantic.pair_veto.model_copy(update={"enabled": on})})})
        for name, on in caches}
    first, second = configs
    embedder = build_embedder(configs[second])  # memo off: a text embedded for one cache is embedded again
    prefilter = build_prefilter(configs[second], embedder)
    scorer = default_scorer(None)
    if models is None:
        scorer.load()

    def use(name: str) -> None:
        """The pair model the next lookup reads (model comparison only)."""
        if models is not None:
            chosen = models[name]
            twolayer.load_model = verifier.load_model = lambda *_: chosen  # type: ignore[assignment]

    def fresh() -> dict[str, TwoLayerCache]:
        return {name: TwoLayerCache(config=c, kvstore=MemoryKVStore(), embedder=embedder, prefilter=prefilter,
                                    metrics=CacheMetrics(CollectorRegistry())) for name, c in configs.items()}

    for name, cache in fresh().items():
        use(name)
        await cache.warm_up()
    would = []  # dev pairs the veto (or the compared pair model) is asked about, and passes: a served hit
    use(second)
    for row in map(json.loads, (default_data_dir() / "cache_pairs.dev.jsonl").read_text().splitlines()):
        if not row["same"] or len(would) >= args.pairs:
            continue
        cache = fresh()[second]
        found = await cache.lookup(_request(row["a"]))
        await cache.store(_request(row["a"]), found, ANSWER)
        before = scorer.runs
        hit = (await cache.lookup(_request(row["b"]))).status == CacheStatus.HIT_SEMANTIC
        judged = (scorer.runs > before if models is None
                  else isinstance(verifier.precheck(row["a"], row["b"]), verifier.Pending))
        if hit and judged:
            would.append((row["a"], row["b"]))
    results: dict[str, dict[str, list[float]]] = {}
    statuses: dict[str, dict[str, int]] = {}
    for workload in ("varied miss", "would-be hit"):
        stored: list[dict[str, TwoLayerCache]] = [fresh()]
        if workload == "would-be hit":
            stored = [fresh() for _ in would]
            for (a, _), pair in zip(would, stored, strict=True):
                for name, cache in pair.items():
                    use(name)
                    found = await cache.lookup(_request(a))
                    await cache.store(_request(a), found, ANSWER)
        cpu: dict[str, list[float]] = {name: [] for name in configs}
        seen: dict[str, dict[str, int]] = {name: {} for name in configs}
        runs_before = scorer.runs
        for n in range(args.lookups):
            caches = stored[n % len(stored)]
            text = varied_prompt(n) if workload == "varied miss" else would[n % len(would)][1]
            for name, cache in (caches.items() if n % 2 else reversed(caches.items())):
                use(name)
                t = time.process_time()
                got = await cache.lookup(_request(text))
                cpu[name].append(time.process_time() - t)
                seen[name][got.status.value] = seen[name].get(got.status.value, 0) + 1
                if workload == "varied miss" and got.status == CacheStatus.MISS:
                    await cache.store(_request(text), got, ANSWER)
        results[workload] = {k: v[args.skip:] for k, v in cpu.items()}
        statuses[workload] = {"veto runs": scorer.runs - runs_before, **{f"{k}: {s}": c for k, d in seen.items()
                                                                        for s, c in d.items()}}
    print(f"{args.lookups} lookups per cache and workload (first {args.skip} left out), process CPU per lookup, "
          f"one thread each (ORT), load average {os.getloadavg()}:")
    for workload, per in results.items():
        p50 = {k: 1e3 * float(np.median(v)) for k, v in per.items()}
        p90 = {k: 1e3 * float(np.quantile(v, 0.9)) for k, v in per.items()}
        cells = ", ".join(f"{k} p50 {p50[k]:.3f} / p90 {p90[k]:.3f} ms" for k in per)
        difference = p50[second] - p50[first]
        print(f"  {workload}: {cells}; difference at p50 {difference:+.3f} ms; {statuses[workload]}")
    print(f"would-be hits: {len(would)} dev pairs")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
