"""`fleetgate tier eval`: prints routing quality, large-tier share, savings and decision latency."""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable

import numpy as np

from fleetgate.router.tiers.calibration import RoutingMetrics, routing_metrics
from fleetgate.router.tiers.config import Tier
from fleetgate.router.tiers.data import LabelledPrompt, load_labelled
from fleetgate.router.tiers.evaluation import (
    decision_latency,
    nested_estimate,
    percentile_ms,
    row_costs,
)
from fleetgate.router.tiers.features import feature_matrix
from fleetgate.router.tiers.scorer import ScorerArtifact
from fleetgate.router.tiers.training import N_STRUCT, FitParams, cross_val_scores, data_fingerprint


def _fmt(m: RoutingMetrics) -> str:
    return f"{m.recall_large:6.3f} {m.share_large:6.3f} {m.savings or 0.0:7.1%}"


def run_eval(
    args: argparse.Namespace,
    *,
    embed: Callable[[list[LabelledPrompt]], np.ndarray],
    prices: Callable[[argparse.Namespace], tuple[Tier, Tier, str]],
) -> int:
    artifact = ScorerArtifact.load(args.artifact)
    rows = load_labelled(args.data)
    small, large, price_source = prices(args)
    cost_small, cost_large = row_costs(rows, small=small, large=large, output_tokens=args.output_tokens)
    y = np.asarray([int(r.large) for r in rows])
    embeddings = embed(rows)
    x = feature_matrix([r.text for r in rows], embeddings.astype(np.float64))
    trained_here = data_fingerprint(rows) == artifact.meta.get("data_sha256")
    seed, folds = int(artifact.meta.get("seed", 0)), int(artifact.meta.get("folds", 5))
    target = float(artifact.meta.get("target_recall", 0.95))
    thresholds = [float(t) for t in args.thresholds.split(",") if t.strip()]
    print(f"data: {args.data} ({len(rows)} rows, {int(y.sum())} large); artifact: {args.artifact}")
    print(f"savings at {price_source}: small {_price(small)}, large {_price(large)}, {args.output_tokens} out tok/call")
    print("figures per threshold: recall(large) share(large) savings-vs-always-large")
    if not trained_here:
        print("the artifact was NOT trained on this data: 'in-sample' below is a held-out evaluation")
    for name, cols in (("full", slice(None)), ("structural", slice(0, N_STRUCT))):
        model = getattr(artifact, name)
        xs = x[:, cols]
        in_sample = 1.0 / (1.0 + np.exp(-(xs @ model.weights + model.bias)))
        params = FitParams(c=float(artifact.meta[name]["C"]), struct_weight=float(artifact.meta[name]["struct_weight"]))
        oos = cross_val_scores(xs, y, params=params, folds=folds, seed=seed) if trained_here else None
        print(f"\n== {name} model ({'structural signals + MiniLM embedding' if name == 'full' else 'structural only'})")
        print(f"{'threshold':>10} | {'in-sample':^22} | {'out-of-sample (k-fold)':^22}")
        for t in [*thresholds, model.threshold]:
            mark = "  <- shipped" if t == model.threshold else ""
            a = routing_metrics(in_sample, y, threshold=t, cost_small=cost_small, cost_large=cost_large)
            b = None if oos is None else routing_metrics(
                oos, y, threshold=t, cost_small=cost_small, cost_large=cost_large
            )
            print(f"{t:10.4f} | {_fmt(a)} | {_fmt(b) if b else '        n/a':22}{mark}")
        if trained_here:
            nested = nested_estimate(
                xs, y, params=params, folds=folds, seed=seed, target_recall=target,
                cost_small=cost_small, cost_large=cost_large,
            )
            m = nested.metrics
            print(
                f"nested CV (threshold re-chosen for recall {target:.2f} inside each outer fold, judged on held-out "
                f"rows): recall(large)={m.recall_large:.3f} share(large)={m.share_large:.3f} "
                f"({m.fewer_large_calls:.1%} fewer large calls) savings={m.savings or 0.0:.1%}; "
                f"thresholds {', '.join(f'{v:.3f}' for v in nested.thresholds)}"
            )
            shipped = routing_metrics(oos, y, threshold=model.threshold) if oos is not None else None
            for label, fig in (("out-of-sample at the shipped threshold", shipped), ("nested CV", m)):
                if fig is not None:
                    met = fig.recall_large >= 0.95 and fig.fewer_large_calls >= 0.40
                    print(f"target (recall(large) >= 0.95 and >= 40% fewer large calls), {label}: "
                          f"{'MET' if met else 'NOT MET'}")
        basis = oos if oos is not None else in_sample
        missed = Counter(r.category for r, s in zip(rows, basis, strict=True) if r.large and s < model.threshold)
        extra = Counter(r.category for r, s in zip(rows, basis, strict=True) if not r.large and s >= model.threshold)
        label = "out-of-sample" if oos is not None else "held-out"
        print(f"at the shipped threshold ({label}): large->small by category {dict(missed.most_common())}")
        print(f"  small->large by category {dict(extra.most_common())}")
        words = np.asarray([len(r.text.split()) for r in rows])
        routed = basis >= model.threshold
        short_large, long_small = (y == 1) & (words <= 20), (y == 0) & (words >= 80)
        if short_large.any() and long_small.any():
            print(
                f"  length traps: large prompts of <= 20 words reaching large {routed[short_large].mean():.3f} "
                f"(n={int(short_large.sum())}); small prompts of >= 80 words sent to large "
                f"{routed[long_small].mean():.3f} (n={int(long_small.sum())})"
            )
    _latency(args, artifact, rows, embeddings)
    return 0


def _price(tier: Tier) -> str:
    if tier.relative_cost is not None:
        return f"relative cost {tier.relative_cost:g}"
    return f"${tier.input_usd_per_mtok or 0:g}/${tier.output_usd_per_mtok or 0:g} per 1M in/out"


def _latency(args: argparse.Namespace, artifact: ScorerArtifact, rows: list[LabelledPrompt], emb: np.ndarray) -> None:
    from fleetgate.router.tiers.embedding import MiniLMEmbedder

    embedder = MiniLMEmbedder() if args.compute_samples > 0 else None
    timings = decision_latency(
        artifact=artifact, texts=[r.text for r in rows], embeddings=emb, embedder=embedder,
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
