"""`fleetgate cache-eval`: precision/recall of the response cache on labelled data, and lookup latency.

Columns, for pairs and for conversations, at the shipped settings:
- `dev`: `cache_pairs.dev.jsonl` / `cache_conversations.dev.jsonl` (`--data`, default ../shared/data/eval);
- one column per frozen set in `--frozen` (default tests/data/eval): `cache_pairs.NAME.jsonl` with
  `cache_conversations.NAME.jsonl` for every NAME starting with `frozen` (`frozen`, `frozen2`, ...), so a
  set added later shows up by itself. The sets named in `DEVELOPMENT_FROZEN` (`frozen`, `frozen2` and
  `frozen3`, each reported once, in rounds 1-3 of issue 12; `frozen4` and `frozen5`, each held out once in
  issue 30) have since been used for development and training: they are marked in-sample; any other is a
  held-out set nobody tuned on;
- `cv`: out-of-fold results of the pair model on dev + the development frozen sets + the hand-written
  training rows (cache/data), folds grouped by shared prompt, with the shipped threshold: each row is judged
  by a model that saw neither it nor any row sharing a prompt with it.
Each column gives precision (with its one-sided 95% Clopper-Pearson lower bound), recall of the same=true rows,
false hits and false-hit rate by kind, and
cross-tenant hits (dev and frozen run through the real `TwoLayerCache`, a fresh one per row). Then two
sweeps on dev and each frozen set: the similarity threshold with the verifier on and off, and the pair model's
`min_confidence`. `--fit` first refits the pair model on the cv sets and writes pair_model.json.
Last, lookup latency p50/p99 with `--entries` stored entries and where the time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from fleetgate.cache.config import CacheConfig
from fleetgate.cache.evaluation import MemoEmbedder, Score, crowded_rows, load_rows, score_rows, sweep, texts_of

DEFAULT_THRESHOLDS = (0.0, 0.5, 0.6, 0.7, 0.8, 0.9)
DEFAULT_CONFIDENCES = (0.5, 0.7, 0.8, 0.9, 0.95, 0.98)
_REPO = Path(__file__).resolve().parent.parent
KINDS = ("pairs", "conversations")
# frozen sets since used to develop and train (in-sample columns): `frozen` since round 2 of issue 12, `frozen2`
# since round 3, `frozen3` since issue 30, `frozen4` and `frozen5` since round 7 of issue 30 (held out once each,
# in rounds 4 and 6)
DEVELOPMENT_FROZEN = ("frozen", "frozen2", "frozen3", "frozen4", "frozen5")
EMBEDDERS = ("minilm-onnx-int8", "minilm-onnx", "minilm", "hashing")  # in-process


def default_data_dir() -> Path:
    env = os.environ.get("FLEETGATE_EVAL_DATA")
    if env:
        return Path(env)
    return _REPO.parent / "shared" / "data" / "eval"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=None, help="folder with cache_*.dev.jsonl (default: "
                        "$FLEETGATE_EVAL_DATA or ../shared/data/eval next to the repository)")
    parser.add_argument("--frozen", type=Path, default=_REPO / "tests" / "data" / "eval",
                        help="folder with cache_*.frozen*.jsonl, one column per set (default: the repository's "
                        "tests/data/eval)")
    parser.add_argument("--train", type=Path, default=_REPO / "cache" / "data",
                        help="folder with train_pairs.jsonl and train_conversations.jsonl (cross-validation, --fit)")
    parser.add_argument("--fit", action="store_true", help="refit the pair model on dev + the development "
                        "frozen sets + training rows and write it to the package's pair_model.json before evaluating")
    parser.add_argument("--fit-threshold", type=float, default=None,
                        help="with --fit: ship this pair model threshold instead of the lowest one whose "
                        "cross-validated precision's lower bound reaches 98% (the rule's choice is recorded in the "
                        "model's info)")
    parser.add_argument("--align", action=argparse.BooleanOptionalAction, default=True,
                        help="with --fit: give the model the token-alignment features (MiniLM token states; on "
                        "by default since round 3 of issue 12, where they added recall at equal precision in "
                        "grouped cross-validation; --no-align fits without them)")
    parser.add_argument("--threshold", type=float, default=None, help="override the shipped similarity threshold")
    parser.add_argument("--min-confidence", type=float, default=None,
                        help="override the pair model's acceptance probability")
    parser.add_argument("--pair-veto", action=argparse.BooleanOptionalAction, default=None,
                        help="the cross-encoder veto on would-be hits (semantic.pair_veto.enabled; default: shipped)")
    parser.add_argument("--sweep", type=float, nargs="*", default=list(DEFAULT_THRESHOLDS))
    parser.add_argument("--confidences", type=float, nargs="*", default=list(DEFAULT_CONFIDENCES))
    parser.add_argument("--entries", type=int, default=100_000, help="stored entries for the latency run (0: skip)")
    parser.add_argument("--queries", type=int, default=200, help="lookups timed per load level in the latency run")
    parser.add_argument("--loads", type=float, nargs="*", default=[0.5, 0.9],
                        help="latency run: open-loop arrival rates as shares of the measured single-stream capacity")
    parser.add_argument("--latency-only", action="store_true", help="only the latency run (prompts of whatever "
                        "sets are found; the frozen sets alone will do): no precision, cross-validation or sweeps")
    parser.add_argument("--verify-cost", action="store_true", help="time the verification of real candidate "
                        "pairs even with --entries 0 (cheap stages vs. the pair model with token states)")
    parser.add_argument("--embedder", choices=[*EMBEDDERS, "remote"], default="minilm-onnx-int8",
                        help="the cache's encoder; remote: an encoder service at --encoder-url")
    parser.add_argument("--encoder-url", help="with --embedder remote: the service's base URL (vLLM serving MiniLM "
                        "with the pooling runner, e.g. `fleetgate up --embedder engine`)")
    parser.add_argument("--encoder-model", default="all-minilm-l6-v2", help="the service's served model name")
    parser.add_argument("--encoder-timeout-ms", type=float, help="the cache's bound on a lookup's wait for the "
                        "service (default: the shipped semantic.remote.timeout_ms)")
    parser.add_argument("--compare", choices=EMBEDDERS, nargs="*", default=[],
                        help="also decide every dev and frozen row with these in-process embedders and print, per set, "
                        "how many decisions differ from --embedder's and which rows")
    parser.add_argument("--redis", action="store_true", help="also time the fetch (MGET) from a real redis-server "
                        "started on a free loopback port")


def _cell(s: Score | None) -> str:
    if s is None:
        return "n/a"
    return f"{100 * s.precision:5.1f}% / {100 * s.recall:5.1f}% ({s.true_hits}/{s.hits} hits, {s.positives} true)"


def _bounded(s: Score | None) -> str:
    """`_cell` with the one-sided 95% Clopper-Pearson lower bound of the precision of the rows served."""
    if s is None:
        return "n/a"
    from fleetgate.cache.training import precision_lower_bound

    return f"{_cell(s)}, precision >= {100 * precision_lower_bound(s):5.1f}% (95% one-sided)"


def _kinds(s: Score | None) -> str:
    if s is None:
        return "n/a"
    return ", ".join(f"{k} {v}/{s.rows_by_kind[k]}" for k, v in sorted(s.false_by_kind.items())) or "none"


def _progress(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _load(folder: Path, pattern: str) -> dict[str, list[dict[str, Any]]] | None:
    paths = {kind: folder / pattern.format(kind=kind) for kind in KINDS}
    if not all(p.is_file() for p in paths.values()):
        return None
    return {kind: load_rows(p) for kind, p in paths.items()}


def frozen_sets(folder: Path) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Every frozen set in `folder` by name (`frozen`, `frozen2`, ...): both files must be present."""
    names = sorted(p.name[len("cache_pairs."):-len(".jsonl")] for p in folder.glob("cache_pairs.frozen*.jsonl"))
    found = {name: _load(folder, "cache_{kind}." + name + ".jsonl") for name in names}
    return {name: rows for name, rows in found.items() if rows is not None}


def training_sets(names: list[str]) -> list[str]:
    """The sets the pair model is fitted and cross-validated on."""
    return ["dev", "train", *(n for n in names if n in DEVELOPMENT_FROZEN)]


def _cross_validate(sets: dict[str, dict[str, list[dict[str, Any]]]], embedder: MemoEmbedder, config: CacheConfig,
                    *, refit: bool, align: bool = True, threshold: float | None = None) -> dict[str, Score]:
    """Out-of-fold scores on the training sets per kind (refitting and writing the model first with `refit`)."""
    import numpy as np

    from fleetgate.cache import pairmodel, training
    from fleetgate.cache.textnorm import embedding_text
    from fleetgate.cache.verifier import default_states, pair_alignment

    used = training_sets(list(sets))
    items = [ex for name in used for kind in KINDS
             for ex in training.examples(sets[name][kind], source=f"{name} {kind}")]
    texts = sorted({e.a for e in items} | {e.b for e in items})
    vectors = dict(zip(texts, embedder.embed([embedding_text(t) for t in texts]), strict=True))  # as a lookup does
    # token alignment: when refitting with --align (the default), or when the shipped model uses it (hashing:
    # tests, no model)
    use = align if refit else pairmodel.load_model().uses_alignment
    states = default_states() if use and config.semantic.embedder != "hashing" else None
    data = training.featurize(items, vectors, threshold=config.semantic.threshold,
                              align=None if states is None else lambda a, b: pair_alignment(a, b, states))
    if refit:
        model, probs = training.fit(data, threshold=threshold)
        pairmodel.MODEL_PATH.write_text(model.to_json(), encoding="utf-8")
        pairmodel.load_model.cache_clear()
        rule = model.info.get("threshold_rule")
        print(f"pair model refitted on {model.info['candidates']} candidates, threshold {model.threshold}"
              + (f" (given; the lower-bound rule chose {rule})" if rule is not None else "") + " "
              f"(cross-validated precision {100 * model.info['cv_precision']:.1f}%, "
              f"recall {100 * model.info['cv_recall']:.1f}%): {pairmodel.MODEL_PATH}")
    else:
        probs = training.out_of_fold(data)
    bar = config.semantic.min_confidence
    bar = pairmodel.load_model().threshold if bar is None else bar
    hit = training.hits(data, probs, bar)
    sources = np.array([e.source for e in items])
    scores = {kind: training.score(data, hit, np.isin(sources, [f"{name} {kind}" for name in used]))
              for kind in KINDS}
    return scores


async def _quality(args: argparse.Namespace, sets: dict[str, dict[str, list[dict[str, Any]]]], shipped: CacheConfig,
                   embedder: MemoEmbedder, prefilter: MemoEmbedder | None, *, frozen: list[str]) -> None:
    """Precision and recall at the shipped settings, cross-validation and the sweeps."""
    from fleetgate.cache.pairmodel import load_model

    sem = shipped.semantic
    cv = _cross_validate(sets, embedder, shipped, refit=args.fit, align=args.align, threshold=args.fit_threshold)
    model = load_model()
    print(f"settings: similarity threshold {sem.threshold}, pair model threshold "
          f"{sem.min_confidence if sem.min_confidence is not None else model.threshold}, top_k {sem.top_k}, "
          f"verify {sem.verify}, pair veto "
          f"{f'below {sem.pair_veto.threshold}' if sem.pair_veto.enabled and sem.verify else 'off'}")
    print(f"frozen sets in {args.frozen}: " + (", ".join(
        f"{name} ({'in-sample: used for development and training' if name in DEVELOPMENT_FROZEN else 'held out'})"
        for name in frozen) or "none found"))
    print(f"cv: out-of-fold over {' + '.join(training_sets(list(sets)))}, folds grouped by shared prompt")
    columns = ["dev", *(frozen or ["frozen"])]
    for kind in KINDS:
        scores: dict[str, Score | None] = {name: (await score_rows(sets[name][kind], shipped, embedder, prefilter)
                                                  if name in sets else None) for name in columns}
        scores["cv"] = cv[kind]
        print(f"\n{kind} at the shipped settings: precision / recall, and the precision's lower bound")
        for name, s in scores.items():
            print(f"  {name:<7} {_bounded(s)}")
        print("  false hits by kind (false hits / rows of that kind):")
        for name, s in scores.items():
            print(f"  {name:<7} {_kinds(s)}")
        if prefilter is not None:
            unfiltered = {name: await score_rows(sets[name][kind], shipped, embedder) for name in columns
                          if name in sets}
            print("  the same without the static prefilter (every lookup encoded): " + ", ".join(
                f"{name} {_cell(s)}" for name, s in unfiltered.items()))
            if kind == "pairs":
                print("  crowded: every row's `a` in one partition, then every `b` looked up among them "
                      "(hits right only on the row's own `a`); prefilter on | off, and lookups encoded:")
                for name in columns:
                    if name in sets:
                        (on_s, on_n), (off_s, _) = (await crowded_rows(sets[name][kind], shipped, embedder, prefilter),
                                                    await crowded_rows(sets[name][kind], shipped, embedder))
                        print(f"    {name:<7} {_cell(on_s)} | {_cell(off_s)}; encoded {on_n}/{on_s.rows}")
        print("  cross-tenant hits: " + ", ".join(f"{name} {s.cross_tenant_hits}/{s.rows}" for name, s in
                                                    scores.items() if s is not None and name != "cv"))
        for name in columns:
            if name not in sets:
                continue
            rows = sets[name][kind]
            print(f"  {name} sweep, similarity threshold: precision / recall, verifier on | verifier off")
            on = [shipped.model_copy(update={"semantic": sem.model_copy(update={"threshold": t})}) for t in args.sweep]
            off = [c.model_copy(update={"semantic": c.semantic.model_copy(update={"verify": False})}) for c in on]
            swept_on = await sweep(rows, on, embedder, prefilter)
            swept_off = await sweep(rows, off, embedder, prefilter)
            for t, a, b in zip(args.sweep, swept_on, swept_off, strict=True):
                print(f"    {t:4.2f}: {_cell(a)}   |   {_cell(b)}")
            print(f"  {name} sweep, pair model min_confidence: precision / recall")
            confs = [shipped.model_copy(update={"semantic": sem.model_copy(update={"min_confidence": c})})
                     for c in args.confidences]
            for c, a in zip(args.confidences, await sweep(rows, confs, embedder, prefilter), strict=True):
                print(f"    {c:4.2f}: {_cell(a)}")


async def _evaluate(args: argparse.Namespace) -> int:
    from fleetgate.cache.build import build_embedder, build_prefilter

    if args.fit_threshold is not None and not (args.fit and 0.0 < args.fit_threshold < 1.0):
        print("fleetgate cache-eval: --fit-threshold needs --fit and a probability between 0 and 1", file=sys.stderr)
        return 2
    dev = _load(args.data or default_data_dir(), "cache_{kind}.dev.jsonl")
    train = _load(args.train, "train_{kind}.jsonl")
    frozen = frozen_sets(args.frozen)
    if (dev is None or train is None) and not (args.latency_only and frozen):
        print(f"fleetgate cache-eval: dev or training rows not found (--data {args.data or default_data_dir()}, "
              f"--train {args.train})", file=sys.stderr)
        return 2
    base = CacheConfig()
    # embed_memo 0: the latency run times real encodes (the scores memoise through MemoEmbedder)
    sem = base.semantic.model_copy(update={"embedder": args.embedder, "embed_memo": 0})
    if args.embedder == "remote":
        if not args.encoder_url:
            print("fleetgate cache-eval: --embedder remote needs --encoder-url", file=sys.stderr)
            return 2
        remote = {"url": args.encoder_url, "model": args.encoder_model}
        if args.encoder_timeout_ms is not None:
            remote["timeout_ms"] = args.encoder_timeout_ms
        sem = sem.model_copy(update={"remote": sem.remote.model_copy(update=remote)})
    if args.threshold is not None:
        sem = sem.model_copy(update={"threshold": args.threshold})
    if args.min_confidence is not None:
        sem = sem.model_copy(update={"min_confidence": args.min_confidence})
    if args.pair_veto is not None:
        sem = sem.model_copy(update={"pair_veto": sem.pair_veto.model_copy(update={"enabled": args.pair_veto})})
    shipped = base.model_copy(update={"semantic": sem})
    sets = {**({"dev": dev} if dev is not None else {}), **({"train": train} if train is not None else {}), **frozen}

    start = time.perf_counter()
    embedder = MemoEmbedder(build_embedder(shipped))
    from fleetgate.cache.textnorm import embedding_text

    every = [t for rows in sets.values() for kind in KINDS for t in texts_of(rows[kind])]
    # what a lookup encodes: misspellings corrected
    embedder.prime([embedding_text(t) for t in every], progress=_progress)
    static = build_prefilter(shipped, embedder.inner)
    prefilter = MemoEmbedder(static) if static is not None else None
    if prefilter is not None:
        prefilter.prime([embedding_text(t) for t in every])
    print(f"embedder {args.embedder}: {time.perf_counter() - start:.1f} s to load and embed every prompt; "
          f"static prefilter {'on' if prefilter is not None else 'off'}")
    for other in args.compare:
        await _compare(sets, shipped, embedder, prefilter, other=other,
                       names=[n for n in ("dev", *frozen) if n in sets], every=every)
    if not args.latency_only:
        await _quality(args, sets, shipped, embedder, prefilter, frozen=list(frozen))
    if args.entries > 0:
        from fleetgate.cache.latency import measure_loaded

        loads = sorted(set(args.loads))
        print(f"\nlookup latency with {args.entries} entries in one partition (worst case: every entry a candidate), "
              f"the shipped lookup path (static prefilter {'on' if prefilter is not None else 'off'}, encoder "
              f"through the batcher); {args.queries} new real prompts per load level:")
        prompts = [t for rows in sets.values() for t in texts_of(rows["pairs"])]
        run_ = await measure_loaded(embedder=embedder.inner, prefilter=static, config=shipped, prompts=prompts,
                                    entries=args.entries, queries=args.queries, loads=loads,
                                    vectors=embedder, static_vectors=prefilter, progress=_progress)
        _print_latency(run_)
    if (args.entries > 0 or args.verify_cost) and args.embedder != "hashing" and "dev" in sets:  # MiniLM's states
        import numpy as np

        from fleetgate.cache.latency import verification_cost
        from fleetgate.cache.textnorm import embedding_text
        from fleetgate.cache.verifier import default_states

        rows = sets["dev"]["pairs"]
        pairs = [(str(r["a"]), str(r["b"])) for r in rows if r["a"] != r["b"]]
        scored = [(a, b, float(np.dot(*embedder.embed([embedding_text(a), embedding_text(b)])))) for a, b in pairs]
        close = [(a, b, sim) for a, b, sim in scored if sim >= sem.threshold]
        cheap, bound, model_t = verification_cost(close, states=default_states())
        print(f"\nverification per candidate ({len(close)} dev pairs above the similarity threshold; "
              f"{len(bound.seconds) + len(model_t.seconds)} reach the pair model, {len(model_t.seconds)} of them "
              "need token states):")
        for t in (cheap, bound, model_t):
            if t.seconds:
                print(f"  {t.name:<12} p50 {t.pct(50):8.3f} ms   p99 {t.pct(99):8.3f} ms")
    if args.redis:
        from fleetgate.cache.latency import redis_fetch
        from fleetgate.core.localredis import LocalRedis

        with LocalRedis() as server:
            t = await redis_fetch(url=server.url, k=shipped.semantic.top_k)
        print(f"  {t.name:<12} p50 {t.pct(50):8.3f} ms   p99 {t.pct(99):8.3f} ms  "
              f"(MGET of {shipped.semantic.top_k} x 2 KB records, loopback redis-server)")
    aclose = getattr(embedder.inner, "aclose", None)  # the remote encoder's HTTP session, opened on this loop
    if aclose is not None:
        await aclose()
    return 0


async def _compare(sets: dict[str, dict[str, list[dict[str, Any]]]], config: CacheConfig, embedder: MemoEmbedder,
                   prefilter: MemoEmbedder | None, *, other: str, names: list[str], every: list[str]) -> None:
    """Row by row: the cache's decision with `embedder` against its decision with the in-process `other`."""
    from fleetgate.cache.build import build_embedder
    from fleetgate.cache.evaluation import row_hits
    from fleetgate.cache.textnorm import embedding_text

    theirs_config = config.model_copy(update={"semantic": config.semantic.model_copy(update={"embedder": other})})
    theirs = MemoEmbedder(build_embedder(theirs_config))
    theirs.prime([embedding_text(t) for t in every])
    print(f"decisions against the in-process {other} encoder, row by row (dev and every frozen set; the static "
          "prefilter and token states are the same for both):")
    total = differ = 0
    for name in names:
        for kind in KINDS:
            rows = sets[name][kind]
            mine = await row_hits(rows, config, embedder, prefilter)
            other_hits = await row_hits(rows, theirs_config, theirs, prefilter)
            changed = [f"{r['id']} ({'hit' if a else 'miss'} vs {'hit' if b else 'miss'})"
                       for r, a, b in zip(rows, mine, other_hits, strict=True) if a != b]
            total, differ = total + len(rows), differ + len(changed)
            print(f"  {name:<8} {kind:<14} {len(changed)}/{len(rows)} differ" + (f": {', '.join(changed)}"
                                                                                 if changed else ""))
    print(f"  all sets: {differ}/{total} decisions differ", flush=True)


def _print_latency(run: Any) -> None:
    """The latency section of `measure_loaded`'s run (`fleetgate.cache.latency.LoadedRun`)."""
    f = run.facts
    print(f"  {run.entries} entries derived from {run.stored_texts} stored prompts, stored in {run.build_s:.1f} s")
    for space in ("encoder", "static"):
        if f"{space}_ann" in f:
            print(f"  {space} index: {'IVF' if f[space + '_ann'] else 'flat'}, search p50 {f[space + '_p50']:.3f} ms "
                  f"p99 {f[space + '_p99']:.3f} ms; an exact flat scan p50 {f[space + '_flat_p50']:.3f} ms p99 "
                  f"{f[space + '_flat_p99']:.3f} ms; recall of the scan's top k "
                  f"{100 * f[space + '_recall']:.1f}% by entry, {100 * f[space + '_text_recall']:.1f}% by entry text")
    print("  load: 'single stream' = one lookup at a time (closed loop); its throughput is the capacity. 'N%' = "
          "lookups arriving open loop (Poisson) at N% of that capacity, each its own task on the event loop; "
          "latency from arrival to answer, queueing included. Cache lookups only, no other gateway work.")
    for level in run.levels:
        rate = "closed loop" if level.rate <= 0 else f"offered {level.rate:.1f}/s"
        print(f"  {level.name:<14} lookup p50 {level.lookup.pct(50):8.2f} ms   p99 {level.lookup.pct(99):8.2f} ms   "
              f"({rate}, achieved {level.achieved:.1f}/s, up to {level.max_in_flight} in flight; encoded "
              f"{level.encoded}/{level.lookups}, semantic hits {level.hits}, token-state passes {level.token_passes})")
        print("    " + "; ".join(f"{what} p50 {t.pct(50):.2f} ms p99 {t.pct(99):.2f} ms ({len(t.seconds)})"
                             for what, t in (("encoded", level.encoded_lookup), ("not encoded", level.skipped_lookup))
                             if t.seconds))
        print("    stages (ms, p50 / p99, n): " + ", ".join(
            f"{t.name} {t.pct(50):.2f} / {t.pct(99):.2f} ({len(t.seconds)})" for t in level.stages.values()))


def run(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return asyncio.run(_evaluate(args))
