"""`fleetgate tier train | calibrate | eval`: the tier scorer's reproducible training, calibration, evaluation."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from fleetgate.core.config import load_yaml
from fleetgate.core.errors import ConfigError
from fleetgate.router.tiers.calibration import (
    routing_metrics,
    share_for_budget,
    threshold_for_recall,
    threshold_for_recall_bound,
    threshold_for_share,
)
from fleetgate.router.tiers.config import Tier, TierConfig
from fleetgate.router.tiers.data import (
    DEFAULT_FROZEN,
    LabelledPrompt,
    default_training_data,
    load_labelled,
    load_many,
)
from fleetgate.router.tiers.scorer import DEFAULT_ARTIFACT, LinearModel, ScorerArtifact


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    train = sub.add_parser("train", help="train the scorer on labelled prompts (seeded, reproducible)")
    train.add_argument("--data", type=Path, nargs="+", default=None,
                       help="labelled JSONL files (default: router/tiers/data/train.jsonl, plus the dev set "
                            "../shared/data/eval/tier_queries.dev.jsonl when it is there)")
    train.add_argument("--out", type=Path, default=DEFAULT_ARTIFACT, help="artifact to write")
    train.add_argument("--seed", type=int, default=0)
    train.add_argument("--folds", type=int, default=5)
    train.add_argument("--target-recall", type=float, default=0.95, help="recall of `large` on new prompts")
    train.add_argument("--confidence", type=float, default=0.99,
                       help="confidence that new prompts get the target recall (sets the threshold's margin)")

    cal = sub.add_parser("calibrate", help="set the threshold for a target share of large-tier calls")
    goal = cal.add_mutually_exclusive_group(required=True)
    goal.add_argument("--target-share", type=float, help="share of calls for the large tier, e.g. 0.45")
    goal.add_argument("--budget", type=float, help="spend as a fraction of always-large, e.g. 0.5")
    goal.add_argument("--target-recall", type=float, help="share of `large` prompts that must reach it")
    cal.add_argument("--confidence", type=float,
                     help="with --target-recall: hold it on new prompts with this confidence (a margin)")
    cal.add_argument("--model", choices=("full", "structural"), default="full")
    cal.add_argument("--write", action="store_true", help="write the threshold into the artifact")
    _common(cal)

    ev = sub.add_parser("eval", help="dev, frozen and cross-validated figures vs a tuned keyword rule, latency")
    ev.add_argument("--train", type=Path, nargs="+", default=None,
                    help="the scorer's training data, for the cross-validation column (default: as `train`)")
    ev.add_argument("--dev", type=Path, default=None, help="dev set (default: ../shared/data/eval/...dev.jsonl)")
    ev.add_argument("--frozen", type=Path, default=DEFAULT_FROZEN, help="frozen test set, never trained on")
    ev.add_argument("--thresholds", default="0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9")
    ev.add_argument("--latency-samples", type=int, default=300)
    ev.add_argument("--compute-samples", type=int, default=30, help="samples that compute the embedding")
    _common(ev)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--artifact", type=Path, default=DEFAULT_ARTIFACT)
    p.add_argument("--config", type=Path, help="gateway YAML with a `tiers:` section, for prices")
    p.add_argument("--alias", default="auto", help="alias whose first and last tiers give the prices")
    p.add_argument("--output-tokens", type=int, default=256, help="assumed completion tokens per call")


def prices(args: argparse.Namespace) -> tuple[Tier, Tier, str]:
    from fleetgate.router.tiers.evaluation import DEFAULT_LARGE, DEFAULT_SMALL

    if args.config is None:
        return DEFAULT_SMALL, DEFAULT_LARGE, "default prices"
    data = load_yaml(args.config)
    cfg = TierConfig.model_validate(data.get("tiers", data))
    alias = cfg.aliases.get(args.alias)
    if alias is None or len(alias.tiers) < 2:
        raise ConfigError(f"{args.config}: no alias {args.alias!r} with at least two tiers")
    return alias.tiers[0], alias.tiers[-1], f"prices of alias {args.alias!r} in {args.config}"


def _embed(rows: list[LabelledPrompt]) -> np.ndarray:
    from fleetgate.router.tiers.embedding import MiniLMEmbedder

    print(f"embedding {len(rows)} prompts with all-MiniLM-L6-v2 ...", file=sys.stderr)
    return MiniLMEmbedder().embed([r.text for r in rows])


def run(args: argparse.Namespace) -> int:
    if args.action == "train":
        return _train(args)
    if args.action == "calibrate":
        return _calibrate(args)
    from fleetgate.router.tiers.eval_cli import run_eval

    return run_eval(args, embed=_embed, prices=prices)


def _train(args: argparse.Namespace) -> int:
    from fleetgate.router.tiers.training import train

    paths: list[Path] = args.data or default_training_data()
    rows = load_many(paths)
    try:
        artifact = train(
            rows, _embed(rows), seed=args.seed, folds=args.folds, target_recall=args.target_recall,
            confidence=args.confidence, sources=[(p.name, load_labelled(p)) for p in paths],
        )
    except ValueError as exc:  # too few rows of a tier for the folds, a target out of range
        raise ConfigError(f"cannot train on {', '.join(map(str, paths))}: {exc}") from exc
    artifact.save(args.out)
    y = np.asarray(artifact.labels)
    names = " + ".join(f"{p.name} ({len(load_labelled(p))})" for p in paths)
    print(f"trained on {len(rows)} rows of {names} (seed {args.seed}, {args.folds} folds) -> {args.out}")
    for name, model in (("full", artifact.full), ("structural", artifact.structural)):
        m = routing_metrics(np.asarray(model.oos_scores), y, threshold=model.threshold)
        print(
            f"  {name:10s} C={artifact.meta[name]['C']:<5} threshold={model.threshold:.4f}  out-of-sample: "
            f"recall(large)={m.recall_large:.3f} share(large)={m.share_large:.3f}"
        )
    return 0


def _sources(artifact: ScorerArtifact) -> str:
    return " + ".join(str(s.get("name", "?")) for s in artifact.meta.get("sources", [])) or "?"


def _calibrate(args: argparse.Namespace) -> int:
    artifact = ScorerArtifact.load(args.artifact)
    model: LinearModel = getattr(artifact, args.model)
    if not model.oos_scores or len(model.oos_scores) != len(artifact.labels):
        raise ConfigError(f"{args.artifact} holds no out-of-sample scores: retrain it with `fleetgate tier train`")
    scores, y = np.asarray(model.oos_scores), np.asarray(artifact.labels)
    small, large, source = prices(args)
    tokens = np.asarray(artifact.input_tokens)
    cost_small = np.asarray([small.call_cost(input_tokens=t, output_tokens=args.output_tokens) or 0 for t in tokens])
    cost_large = np.asarray([large.call_cost(input_tokens=t, output_tokens=args.output_tokens) or 0 for t in tokens])
    if args.target_recall is not None and args.confidence is not None:
        threshold = threshold_for_recall_bound(scores, y, target=args.target_recall, confidence=args.confidence)
    elif args.target_recall is not None:
        threshold = threshold_for_recall(scores, y, target=args.target_recall)
    else:
        share = args.target_share
        if args.budget is not None:
            share = share_for_budget(
                budget=args.budget, cost_small=float(cost_small.mean()), cost_large=float(cost_large.mean())
            )
            print(f"budget {args.budget:.2f} x always-large -> at most {share:.3f} of calls to the large tier")
        threshold = threshold_for_share(scores, target=share)
    m = routing_metrics(scores, y, threshold=threshold, cost_small=cost_small, cost_large=cost_large)
    print(f"calibrated on {len(y)} out-of-sample scores ({args.model} model, {_sources(artifact)})")
    print(f"  threshold            {threshold:.4f}")
    print(f"  share to large tier  {m.share_large:.3f}  ({m.fewer_large_calls:.1%} fewer large calls than always)")
    print(f"  recall of `large`    {m.recall_large:.3f}")
    print(f"  small sent to large  {m.small_to_large:.3f}")
    print(f"  savings vs always-large {m.savings or 0.0:.1%}  ({source}, {args.output_tokens} output tokens/call)")
    if args.write:
        updated = LinearModel(
            weights=model.weights, bias=model.bias, threshold=round(threshold, 6), oos_scores=model.oos_scores
        )
        fields = {"full": artifact.full, "structural": artifact.structural, args.model: updated}
        ScorerArtifact(
            full=fields["full"], structural=fields["structural"], labels=artifact.labels,
            input_tokens=artifact.input_tokens, categories=artifact.categories, meta=artifact.meta,
        ).save(args.artifact)
        print(f"wrote threshold {threshold:.4f} for the {args.model} model into {args.artifact}")
    elif args.model == "structural":
        print("a configured `threshold` applies to both models: use --write to set the structural model's alone")
    else:
        print(f"config snippet (tiers.aliases.{args.alias}):\n  threshold: {threshold:.4f}")
    return 0
