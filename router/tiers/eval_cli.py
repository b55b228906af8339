"""`fleetgate tier eval`: the shipped scorer against a tuned keyword rule, in three columns, plus latency.

Columns: `dev` (the reference dev set; in-sample when it is part of the training data), `frozen` (the frozen
test set, never trained on) and `cv` (the training data, nested cross-validation: fit and threshold chosen
without the judged fold). Rows: the full scorer (structural signals + MiniLM), the structural-only scorer,
the length-plus-keyword rule tuned on the same training data for the same out-of-sample recall the
scorer's threshold is calibrated to, and always-large. A file that is not there gives an `n/a` column.
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fleetgate.router.tiers.calibration import RoutingMetrics, allowed_misses, routing_metrics
from fleetgate.router.tiers.config import Tier
from fleetgate.router.tiers.data import LabelledPrompt, default_dev, default_training_data, load_labelled, load_many
from fleetgate.router.tiers.evaluation import (
    decision_latency,
    keyword_rule_nested,
    nested_estimate,
    percentile_ms,
    row_costs,
)
from fleetgate.router.tiers.features import feature_matrix
from fleetgate.router.tiers.keyword_rule import KeywordRule, fit_keyword_rule
from fleetgate.router.tiers.scorer import ScorerArtifact
from fleetgate.router.tiers.training import N_STRUCT, Calibration, FitParams, cross_val_scores, data_fingerprint

TARGET_FEWER = 0.45  # the target: >= 45% fewer large-tier calls than always-large
METHODS = (
    "full scorer (shipped)", "structural-only scorer", "keyword rule (tuned)", "keyword rule (dev, 0.95)",
    "always-large",
)


@dataclass(frozen=True, slots=True)
class Column:
    name: str
    note: str
    rows: list[LabelledPrompt]
    routed: dict[str, np.ndarray]  # method -> 1.0 where the prompt goes to the large tier
    full_scores: np.ndarray  # the full model's scores (out-of-sample for `cv`), for the threshold sweep
    cost_small: np.ndarray
    cost_large: np.ndarray

    @property
    def labels(self) -> np.ndarray:
        return np.asarray([int(r.large) for r in self.rows])

    def metrics(self, method: str) -> RoutingMetrics | None:
        if method not in self.routed:
            return None
        return routing_metrics(self.routed[method], self.labels, threshold=0.5, cost_small=self.cost_small,
                               cost_large=self.cost_large)


def _fmt(m: RoutingMetrics | None) -> str:
    if m is None:
        return f"{'n/a':^24}"
    return f"{m.recall_large:6.3f} {m.fewer_large_calls:7.1%} {m.savings or 0.0:7.1%}  "


def _rule_target(artifact: ScorerArtifact) -> float:
    """The recall on training data that the scorer's calibrated threshold asks for (target + margin)."""
    n = sum(artifact.labels)
    target, confidence = float(artifact.meta["target_recall"]), float(artifact.meta["confidence"])
    return 1.0 - max(allowed_misses(n=n, target=target, confidence=confidence), 0) / n


def run_eval(
    args: argparse.Namespace,
    *,
    embed: Callable[[list[LabelledPrompt]], np.ndarray],
    prices: Callable[[argparse.Namespace], tuple[Tier, Tier, str]],
) -> int:
    artifact = ScorerArtifact.load(args.artifact)
    small, large, price_source = prices(args)
    train_paths: list[Path] = args.train or default_training_data()
    train_rows = load_many(train_paths)
    rule_target = _rule_target(artifact)
    rule = fit_keyword_rule(train_rows, target_recall=rule_target)
    dev_path = args.dev or default_dev()
    # The baseline: a rule tuned on the dev set alone for the bare target, as a person would.
    dev_rule = fit_keyword_rule(load_labelled(dev_path), target_recall=0.95) if dev_path.is_file() else None

    def costs(rows: list[LabelledPrompt]) -> tuple[np.ndarray, np.ndarray]:
        return row_costs(rows, small=small, large=large, output_tokens=args.output_tokens)

    def held_out(name: str, path: Path | None, trained_on: bool) -> Column | None:
        if path is None or not path.is_file():
            return None
        rows = load_labelled(path)
        emb = embed(rows).astype(np.float64)
        x = feature_matrix([r.text for r in rows], emb)
        full = 1.0 / (1.0 + np.exp(-(x @ artifact.full.weights + artifact.full.bias)))
        xs = x[:, :N_STRUCT]
        struct = 1.0 / (1.0 + np.exp(-(xs @ artifact.structural.weights + artifact.structural.bias)))
        routed = {
            METHODS[0]: (full >= artifact.full.threshold).astype(float),
            METHODS[1]: (struct >= artifact.structural.threshold).astype(float),
            METHODS[2]: rule.predict([r.text for r in rows]),
            METHODS[4]: np.ones(len(rows)),
        }
        if dev_rule is not None:
            routed[METHODS[3]] = dev_rule.predict([r.text for r in rows])
        note = f"{path} ({len(rows)} rows, {'IN the training data: in-sample' if trained_on else 'held out'})"
        return Column(name, note, rows, routed, full, *costs(rows))

    in_training = {str(s.get("data_sha256")) for s in artifact.meta.get("sources", [])}
    dev_in = dev_path.is_file() and data_fingerprint(load_labelled(dev_path)) in in_training
    train_emb = embed(train_rows).astype(np.float64)
    columns = [
        held_out("dev", dev_path, dev_in),
        held_out("frozen", args.frozen, False),
        _cv_column(artifact, train_rows, train_paths, train_emb, costs, rule_target),
    ]
    _print_table(args, artifact, columns, (rule, dev_rule), rule_target, price_source, small, large)
    _latency(args, artifact, train_rows, train_emb)
    return 0


def _cv_column(
    artifact: ScorerArtifact, rows: list[LabelledPrompt], paths: list[Path], embeddings: np.ndarray,
    costs: Callable[[list[LabelledPrompt]], tuple[np.ndarray, np.ndarray]], rule_target: float,
) -> Column:
    seed, folds = int(artifact.meta.get("seed", 0)), int(artifact.meta.get("folds", 5))
    calibration = Calibration(
        target_recall=float(artifact.meta["target_recall"]), confidence=float(artifact.meta["confidence"])
    )
    y = np.asarray([int(r.large) for r in rows])
    x = feature_matrix([r.text for r in rows], embeddings)
    cost_small, cost_large = costs(rows)
    routed: dict[str, np.ndarray] = {}
    oos = np.zeros(len(rows))
    for method, name, cols in ((METHODS[0], "full", slice(None)), (METHODS[1], "structural", slice(0, N_STRUCT))):
        params = FitParams(c=float(artifact.meta[name]["C"]), struct_weight=float(artifact.meta[name]["struct_weight"]))
        nested = nested_estimate(x[:, cols], y, params=params, folds=folds, seed=seed, calibration=calibration,
                                 cost_small=cost_small, cost_large=cost_large)
        routed[method] = nested.routed
        if name == "full":
            oos = cross_val_scores(x, y, params=params, folds=folds, seed=seed)
    routed[METHODS[2]] = keyword_rule_nested(rows, folds=folds, seed=seed, target_recall=rule_target)
    routed[METHODS[4]] = np.ones(len(rows))
    trained = data_fingerprint(rows) == artifact.meta.get("data_sha256")
    note = (f"{' + '.join(p.name for p in paths)} ({len(rows)} rows), nested {folds}-fold: each fold judged by "
            f"a model fit and calibrated without it{'' if trained else ' (NOT the artifact training data)'}")
    return Column("cv", note, rows, routed, oos, cost_small, cost_large)


def _print_table(
    args: argparse.Namespace, artifact: ScorerArtifact, columns: list[Column | None],
    rules: tuple[KeywordRule, KeywordRule | None], rule_target: float, price_source: str, small: Tier, large: Tier,
) -> None:
    meta = artifact.meta
    print(f"artifact {args.artifact}: trained on {meta.get('rows')} rows; threshold full "
          f"{artifact.full.threshold:.4f}, structural {artifact.structural.threshold:.4f} (recall of `large` >= "
          f"{meta.get('target_recall')} on new prompts with confidence {meta.get('confidence')})")
    for rule, how in zip(rules, (f"on the training data for recall {rule_target:.3f}", "on the dev set for recall "
                                 "0.95 (the issue's baseline)"), strict=True):
        if rule is not None:
            print(f"keyword rule tuned {how}: large when >= {rule.min_words} words or one of "
                  f"{len(rule.keywords)} keywords ({', '.join(rule.keywords[:10])}, ...)")
    print(f"savings at {price_source}: small {_price(small)}, large {_price(large)}, {args.output_tokens} out tok/call")
    for col, name in zip(columns, ("dev", "frozen", "cv"), strict=True):
        print(f"  {name:6s}: {col.note if col else 'n/a (file not found)'}")
    head = " | ".join(f"{name:^24}" for name in ("dev", "frozen", "cv"))
    print(f"\n{'':24s} | {head}")
    print(f"{'':24s} | " + " | ".join(f"{'recall  fewer  savings':^24}" for _ in range(3)))
    for method in METHODS:
        print(f"{method:24s} | " + " | ".join(_fmt(c.metrics(method) if c else None) for c in columns))
    print(f"target: recall(large) >= 0.95 and >= {TARGET_FEWER:.0%} fewer large calls than always-large")
    for method in METHODS[:4]:
        verdicts = []
        for c, name in zip(columns, ("dev", "frozen", "cv"), strict=True):
            m = c.metrics(method) if c is not None else None
            if m is not None:
                ok = m.recall_large >= 0.95 and m.fewer_large_calls >= TARGET_FEWER
                verdicts.append(f"{name} {'MET' if ok else 'NOT MET'}")
        print(f"  {method:24s} {', '.join(verdicts)}")
    _sweep(args, artifact, columns)
    for c in columns:
        if c is not None and c.name != "dev":
            _errors(c)


def _sweep(args: argparse.Namespace, artifact: ScorerArtifact, columns: list[Column | None]) -> None:
    thresholds = sorted({float(t) for t in args.thresholds.split(",") if t.strip()} | {artifact.full.threshold})
    print("\nfull scorer by threshold (cv: out-of-sample k-fold scores): recall  fewer  savings")
    for t in thresholds:
        cells = []
        for c in columns:
            if c is None:
                cells.append(_fmt(None))
                continue
            cells.append(_fmt(routing_metrics(c.full_scores, c.labels, threshold=t, cost_small=c.cost_small,
                                              cost_large=c.cost_large)))
        mark = "  <- shipped" if t == artifact.full.threshold else ""
        print(f"{t:24.4f} | " + " | ".join(cells) + mark)


def _errors(c: Column) -> None:
    routed = c.routed[METHODS[0]].astype(bool)
    y = c.labels.astype(bool)
    missed = Counter(r.category for r, go in zip(c.rows, routed, strict=True) if r.large and not go)
    extra = Counter(r.category for r, go in zip(c.rows, routed, strict=True) if not r.large and go)
    print(f"\n{c.name}, full scorer: large->small by category {dict(missed.most_common())}")
    print(f"  small->large by category {dict(extra.most_common())}")
    words = np.asarray([len(r.text.split()) for r in c.rows])
    short_large, long_small = y & (words <= 20), ~y & (words >= 80)
    print(f"  length traps: large prompts of <= 20 words reaching large {_share(routed, short_large)}; "
          f"small prompts of >= 80 words sent to large {_share(routed, long_small)}")


def _share(routed: np.ndarray, mask: np.ndarray) -> str:
    return f"{routed[mask].mean():.3f} (n={int(mask.sum())})" if mask.any() else "n/a (n=0)"


def _price(tier: Tier) -> str:
    if tier.relative_cost is not None:
        return f"relative cost {tier.relative_cost:g}"
    return f"${tier.input_usd_per_mtok or 0:g}/${tier.output_usd_per_mtok or 0:g} per 1M in/out"


def _latency(
    args: argparse.Namespace, artifact: ScorerArtifact, rows: list[LabelledPrompt], embeddings: np.ndarray
) -> None:
    from fleetgate.router.tiers.embedding import MiniLMEmbedder

    if args.latency_samples <= 0:
        return
    embedder = MiniLMEmbedder() if args.compute_samples > 0 else None
    timings = decision_latency(
        artifact=artifact, texts=[r.text for r in rows], embeddings=embeddings, embedder=embedder,
        samples=args.latency_samples, compute_samples=args.compute_samples,
    )
    print("\ndecision latency per request (TieredResolver.resolve; wall = what a request waits on this CPU shared")
    print("with other work, cpu = process CPU time of the decision itself):")
    for name, t in timings.items():
        print(
            f"  {name:43s} n={len(t.wall_s):4d}  wall p50={percentile_ms(t.wall_s, 50):7.3f} ms "
            f"p99={percentile_ms(t.wall_s, 99):7.3f} ms | cpu p50={percentile_ms(t.cpu_s, 50):7.3f} ms "
            f"p99={percentile_ms(t.cpu_s, 99):7.3f} ms"
        )

