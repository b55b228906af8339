#!/usr/bin/env python3
"""Issue 30, round 7: do asymmetric alignment features lower false hits on sources the model was not fitted on?

Development data only, each set loaded by name: dev (`--data`, FLEETGATE_EVAL_DATA), the training rows
(cache/data) and `frozen` .. `frozen5` (`DEVELOPMENT`). No other frozen set is ever read (`frozen6` is the
held-out set of this change).

    python scripts/asymmetry/experiment.py prepare   # -> build/asym/prepared.pkl (token states of every text)
    python scripts/asymmetry/experiment.py eval [--variants base,side75,...] [--cv-repeats 5]

Protocol, the pair model (its residual head stacked as `training.with_head` does) with the 43 shipped inputs
(`base`) against the same plus a variant's extra columns, on the same rows:
- `lso`: leave one source out (dev, train, frozen .. frozen5): the model refitted without the source and without
  any row sharing a prompt with it (round 5's `_train_mask`), judging the source's rows at the shipped
  threshold 0.95 (as rounds 5 and 6 did);
- `cv`: `training.out_of_fold` (repeats x 5 folds, grouped by shared prompt, the head refitted in each fold)
  over every development source, and over round 4's CV sets (dev, train, frozen .. frozen3), at 0.95.
"""

from __future__ import annotations

import argparse
import os
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "asym"
DEVELOPMENT = ("frozen", "frozen2", "frozen3", "frozen4", "frozen5")  # never frozen6: held out for this change
SOURCES = ("dev", "train", *DEVELOPMENT)
OLD_CV = ("dev", "train", "frozen", "frozen2", "frozen3")
PAIR_THRESHOLD = 0.95


def prepare(args: argparse.Namespace) -> None:
    from fleetgate.cache import training
    from fleetgate.cache.build import build_embedder
    from fleetgate.cache.config import CacheConfig
    from fleetgate.cache.eval_cli import KINDS, _load
    from fleetgate.cache.evaluation import MemoEmbedder
    from fleetgate.cache.textnorm import embedding_text
    from fleetgate.cache.verifier import default_states, pair_alignment

    frozen_dir = ROOT / "tests" / "data" / "eval"
    loaded = {"dev": _load(args.data, "cache_{kind}.dev.jsonl"),
              "train": _load(Path(args.train), "train_{kind}.jsonl"),
              **{name: _load(frozen_dir, "cache_{kind}." + name + ".jsonl") for name in DEVELOPMENT}}
    missing = [name for name, rows in loaded.items() if rows is None]
    if missing:
        raise SystemExit(f"not found: {missing}")
    items = [ex for name, rows in loaded.items() if rows is not None for kind in KINDS
             for ex in training.examples(rows[kind], source=f"{name} {kind}")]
    config = CacheConfig()
    embedder = MemoEmbedder(build_embedder(config))
    texts = sorted({e.a for e in items} | {e.b for e in items})
    vectors = dict(zip(texts, embedder.embed([embedding_text(t) for t in texts]), strict=True))
    states = default_states()
    words: dict[str, Any] = {}

    def align(a: str, b: str) -> tuple[Sequence[float], np.ndarray]:
        out = pair_alignment(a, b, states)
        for t in (a, b):
            w = states.words(t)
            words[t] = (w.text, w.vectors, w.capital)
        return out

    data = training.featurize(items, vectors, threshold=config.semantic.threshold, align=align)
    source = np.array([e.source.split()[0] for e in items])
    OUT.mkdir(parents=True, exist_ok=True)
    with (OUT / args.name).open("wb") as f:
        pickle.dump({"data": data, "source": source, "words": words}, f)
    print(f"{len(items)} rows, {int(data.candidate.sum())} candidates: {OUT / args.name}")


# -- variants: extra columns from the two prompts' words --------------------------------------------------------

def _words(p: dict[str, Any], text: str) -> Any:
    from fleetgate.cache.tokenalign import Words

    t, v, c = p["words"][text]
    return Words(t, v, c)


def _variant(name: str) -> tuple[tuple[str, ...], Callable[[Any, Any], Sequence[float]]]:
    """(column names, function of (Words a, Words b)) of a variant; names ending in their SIGNS direction."""
    from fleetgate.cache import asymmetry

    cut = float(name.split("c")[1]) if "c" in name[1:] else None  # side75c6.5: weights max(0, 6.5 - zipf)
    if name.startswith("side"):  # sideNN: asymmetry.side_shares at tau 0.NN
        tau = int(name[4:6]) / 100
        return asymmetry.SIDE_FEATURES, lambda a, b: asymmetry.side_shares(a, b, tau=tau, cut=cut)
    if name.startswith("soft"):
        return asymmetry.SIDE_FEATURES, lambda a, b: asymmetry.side_shares(a, b, tau=None)
    if name.startswith("mass"):  # massNN: unexplained content weight (not share) per side
        tau = int(name[4:6]) / 100
        return ("asym_mass_max", "asym_mass_min", "asym_mass_gap"), lambda a, b: asymmetry.side_mass(a, b, tau=tau,
                                                                                                     cut=cut)
    raise SystemExit(f"unknown variant {name}")


def head_inputs(p: dict[str, Any], variant: str) -> np.ndarray | None:
    """Residual head inputs of a `head...` variant (None: the shipped `residual_inputs`)."""
    from fleetgate.cache import asymmetry

    if not variant.startswith("head"):
        return None
    data = p["data"]
    out = np.zeros((len(data.y), 3 * 384))
    for i in np.flatnonzero(data.candidate):
        e = data.examples[i]
        out[i] = asymmetry.side_residual_inputs(_words(p, e.a), _words(p, e.b))
    return out


def columns(p: dict[str, Any], variant: str) -> tuple[tuple[str, ...], np.ndarray]:
    data = p["data"]
    if variant == "base" or variant == "headside":
        return (), np.zeros((len(data.y), 0))
    names, fn = _variant(variant)
    extra = np.zeros((len(data.y), len(names)))
    for i in np.flatnonzero(data.candidate):
        e = data.examples[i]
        extra[i] = fn(_words(p, e.a), _words(p, e.b))
    return names, extra


def _fit(x: np.ndarray, y: np.ndarray, names: Sequence[str]) -> Any:
    from fleetgate.cache import training

    return training.fit_model(x, y, threshold=PAIR_THRESHOLD, names=tuple(names))


def _with(data: Any, extra: np.ndarray) -> Any:
    import dataclasses

    return dataclasses.replace(data, x=np.concatenate([data.x, extra], axis=1))


def lso(p: dict[str, Any], data: Any, names: Sequence[str], sources: Sequence[str]) -> dict[str, np.ndarray]:
    from fleetgate.cache import training

    source = p["source"]
    group = training.groups(data.examples)
    out = {}
    for s in sources:  # "frozen4+frozen5": both left out together, each judged
        test = np.isin(source, s.split("+"))
        train = ~test & ~np.isin(group, group[test])
        tr = np.flatnonzero(train & data.candidate)
        te = np.flatnonzero(test & data.candidate)
        x, _ = training.with_head(data, tr, te)
        model = _fit(x[tr], data.y[tr], names)
        prob = np.zeros(len(data.y))
        prob[te] = [model.probability(x[i].tolist()) for i in te]
        out[s] = prob
    return out


def cv(data: Any, names: Sequence[str], rows: np.ndarray, repeats: int) -> np.ndarray:
    """`training.out_of_fold` restricted to `rows` (its model fit with the extra columns' names)."""
    import dataclasses

    from fleetgate.cache import training

    sub = dataclasses.replace(data, examples=tuple(e for e, r in zip(data.examples, rows, strict=True) if r),
                              x=data.x[rows], y=data.y[rows], candidate=data.candidate[rows],
                              accepted=data.accepted[rows],
                              residual=None if data.residual is None else data.residual[rows])
    prob = np.zeros(len(data.y))
    prob[rows] = training.out_of_fold(sub, repeats=repeats, names=tuple(names))
    return prob


def cell(data: Any, hit: np.ndarray, mask: np.ndarray) -> str:
    from fleetgate.cache.training import precision_lower_bound, score

    s = score(data, hit, mask)
    kinds = ", ".join(f"{k} {v}" for k, v in sorted(s.false_by_kind.items())) or "none"
    return (f"{100 * s.precision:5.1f}% / {100 * s.recall:4.1f}% ({s.hits - s.true_hits} false of {s.hits}, "
            f">= {100 * precision_lower_bound(s):4.1f}%; {kinds})")


def evaluate(args: argparse.Namespace) -> None:
    from fleetgate.cache.pairfeatures import FEATURES

    with (OUT / args.name).open("rb") as f:
        p = pickle.load(f)
    data0, source = p["data"], p["source"]
    pairs = np.array(["conversations" not in e.source for e in data0.examples])
    for variant in args.variants.split(","):
        t0 = time.process_time()
        extra_names, extra = columns(p, variant)
        names = (*FEATURES, *extra_names)
        data = _with(data0, extra)
        residual = head_inputs(p, variant)
        if residual is not None:
            import dataclasses

            data = dataclasses.replace(data, residual=residual)
        print(f"\n== {variant} ({len(names)} inputs)", flush=True)
        if args.lso:
            probs = lso(p, data, names, args.lso.split(","))
            for s, prob in probs.items():
                hit = data.accepted | (data.candidate & (prob >= PAIR_THRESHOLD))
                for one in s.split("+"):
                    m = source == one
                    label = one if "+" not in s else f"{one} (with {s})"
                    print(f"  lso {label:<8} pairs {cell(data, hit, m & pairs)}")
                    print(f"  lso {label:<8} conv  {cell(data, hit, m & ~pairs)}")
            pooled = np.zeros(len(data.y), dtype=bool)
            allm = np.zeros(len(data.y), dtype=bool)
            for s, prob in probs.items():
                if "+" in s:
                    continue
                m = source == s
                pooled |= m & (data.accepted | (data.candidate & (prob >= PAIR_THRESHOLD)))
                allm |= m
            print(f"  lso pooled   pairs {cell(data, pooled, allm & pairs)}")
            for t in args.thresholds:
                for s, prob in probs.items():
                    hit = data.accepted | (data.candidate & (prob >= t))
                    for one in s.split("+"):
                        label = one if "+" not in s else f"{one} (with {s})"
                        print(f"  lso {label:<8} pairs @ {t:.2f} {cell(data, hit, (source == one) & pairs)}")
        for label, cv_sources in (("cv-all", SOURCES), ("cv-r4", OLD_CV))[: 2 if args.cv_old else 1]:
            if args.cv_repeats <= 0:
                break
            rows = np.isin(source, cv_sources)
            prob = cv(data, names, rows, args.cv_repeats)
            hit = rows & (data.accepted | (data.candidate & (prob >= PAIR_THRESHOLD)))
            print(f"  {label:<6} pairs {cell(data, hit, rows & pairs)}")
            print(f"  {label:<6} conv  {cell(data, hit, rows & ~pairs)}")
            for t in args.thresholds:
                hit_t = rows & (data.accepted | (data.candidate & (prob >= t)))
                print(f"  {label:<6} pairs @ {t:.2f} {cell(data, hit_t, rows & pairs)}")
        print(f"  ({time.process_time() - t0:.0f} s CPU)", flush=True)


def main() -> int:
    from fleetgate.cache.eval_cli import default_data_dir

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare")
    prep.add_argument("--data", type=Path, default=default_data_dir())  # $FLEETGATE_EVAL_DATA, as cache-eval
    prep.add_argument("--train", default=str(ROOT / "cache" / "data"))
    prep.add_argument("--name", default="prepared.pkl")
    ev = sub.add_parser("eval")
    ev.add_argument("--name", default="prepared.pkl")
    ev.add_argument("--variants", default="base,side55,side65,side75")
    ev.add_argument("--lso", default=",".join((*SOURCES, "frozen4+frozen5")))
    ev.add_argument("--cv-repeats", type=int, default=5)
    ev.add_argument("--cv-old", action="store_true", help="also CV over round 4's sets")
    ev.add_argument("--thresholds", type=float, nargs="*", default=[])
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args)
    else:
        evaluate(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
