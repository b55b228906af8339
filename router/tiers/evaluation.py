"""Evaluation of the tier scorer on labelled prompts: held-out sets, honest cross-validation, decision latency.

Kinds of figures (`fleetgate tier eval` prints them side by side):
- a labelled set scored by the shipped artifact: held out (the frozen set) or in-sample (the dev set, which
  is part of the default training data);
- out-of-sample (k-fold): each training row scored by a model trained without it (same hyper-parameters);
- nested: the whole procedure (fit + choose the threshold on inner out-of-sample scores, with the shipped
  calibration rule) run inside each outer training fold and judged on the held-out fold; this is the honest
  estimate of what the calibrated threshold achieves on new prompts from the training distribution. The
  keyword rule is re-tuned inside each outer fold the same way (`keyword_rule_nested`).
Costs per row: estimated prompt tokens (characters / 4) plus a fixed `output_tokens`, priced per tier.
Latency: wall time of `TieredResolver.resolve` per prompt, with the cache's embedding passed in, without it
(MiniLM computed in a worker thread), and with the structural-only model.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fleetgate.router.tiers.calibration import RoutingMetrics, routing_metrics
from fleetgate.router.tiers.config import Alias, Tier, TierConfig
from fleetgate.router.tiers.data import LabelledPrompt, estimate_tokens
from fleetgate.router.tiers.keyword_rule import fit_keyword_rule
from fleetgate.router.tiers.resolver import Embedder, TieredResolver
from fleetgate.router.tiers.scorer import ScorerArtifact, TierScorer
from fleetgate.router.tiers.training import N_STRUCT, Calibration, FitParams, cross_val_scores, fit_raw

DEFAULT_SMALL = Tier(name="small", model="small", input_usd_per_mtok=0.10, output_usd_per_mtok=0.40)
DEFAULT_LARGE = Tier(name="large", model="large", input_usd_per_mtok=1.00, output_usd_per_mtok=4.00)


def row_costs(
    rows: Sequence[LabelledPrompt], *, small: Tier, large: Tier, output_tokens: int
) -> tuple[np.ndarray, np.ndarray]:
    def cost(tier: Tier, text: str) -> float:
        value = tier.call_cost(input_tokens=estimate_tokens(text), output_tokens=output_tokens)
        if value is None:
            raise ValueError(f"tier {tier.name!r} has no price; set $ per 1M tokens or relative_cost")
        return value

    return (
        np.asarray([cost(small, r.text) for r in rows]),
        np.asarray([cost(large, r.text) for r in rows]),
    )


@dataclass(frozen=True, slots=True)
class NestedEstimate:
    metrics: RoutingMetrics  # pooled over outer folds, each with its own threshold
    thresholds: list[float]
    routed: np.ndarray  # 1.0 where the held-out row went to the large tier


def _outer_folds(y: np.ndarray, *, folds: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    from sklearn.model_selection import StratifiedKFold

    outer = StratifiedKFold(n_splits=folds, shuffle=True, random_state=seed + 1)
    return list(outer.split(np.zeros((len(y), 1)), y))


def nested_estimate(
    x: np.ndarray, y: np.ndarray, *, params: FitParams, folds: int, seed: int, calibration: Calibration,
    cost_small: np.ndarray, cost_large: np.ndarray,
) -> NestedEstimate:
    routed = np.zeros(len(y))
    thresholds: list[float] = []
    for train_idx, test_idx in _outer_folds(y, folds=folds, seed=seed):
        inner = cross_val_scores(x[train_idx], y[train_idx], params=params, folds=folds, seed=seed)
        t = calibration.threshold(inner, y[train_idx])
        w, b = fit_raw(x[train_idx], y[train_idx], params=params)
        scores = 1.0 / (1.0 + np.exp(-(x[test_idx] @ w + b)))
        routed[test_idx] = (scores >= t).astype(float)
        thresholds.append(t)
    metrics = routing_metrics(routed, y, threshold=0.5, cost_small=cost_small, cost_large=cost_large)
    return NestedEstimate(metrics=metrics, thresholds=thresholds, routed=routed)


def keyword_rule_nested(
    rows: Sequence[LabelledPrompt], *, folds: int, seed: int, target_recall: float
) -> np.ndarray:
    """Routed (1.0 = large) per row by a keyword rule tuned on the other folds (the scorer's outer folds)."""
    y = np.asarray([int(r.large) for r in rows])
    routed = np.zeros(len(rows))
    for train_idx, test_idx in _outer_folds(y, folds=folds, seed=seed):
        rule = fit_keyword_rule([rows[i] for i in train_idx], target_recall=target_recall)
        routed[test_idx] = rule.predict([rows[i].text for i in test_idx])
    return routed


def percentile_ms(samples: Sequence[float], q: float) -> float:
    return float(np.percentile(np.asarray(samples) * 1000.0, q))


@dataclass(frozen=True, slots=True)
class Timings:
    wall_s: list[float]  # what a request waits
    cpu_s: list[float]  # process CPU time: the work itself, without the waits of a CPU shared with others


def decision_latency(
    *, artifact: ScorerArtifact, texts: Sequence[str], embeddings: np.ndarray, embedder: Embedder | None,
    samples: int, compute_samples: int,
) -> dict[str, Timings]:
    """Per `resolve` call: 'with embedding', 'structural only' and (if embedder) 'computing embedding'."""
    alias = Alias(tiers=[DEFAULT_SMALL, DEFAULT_LARGE])
    scorer = TierScorer(artifact=artifact)
    reuse = TieredResolver(config=TierConfig(aliases={"auto": alias}), scorer=scorer, embedder=embedder)
    only = TieredResolver(
        config=TierConfig(aliases={"auto": alias}, embedding="reuse_only"), scorer=scorer, embedder=None
    )

    async def timed(resolver: TieredResolver, n: int, *, with_embedding: bool) -> Timings:
        wall: list[float] = []
        cpu: list[float] = []
        for i in range(n):
            j = i % len(texts)
            start, start_cpu = time.perf_counter(), time.process_time()
            await resolver.resolve("auto", texts[j], embedding=embeddings[j] if with_embedding else None)
            wall.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        return Timings(wall_s=wall, cpu_s=cpu)

    async def main() -> dict[str, Timings]:
        await timed(reuse, min(20, samples), with_embedding=True)  # warm caches
        result = {
            "with cache embedding": await timed(reuse, samples, with_embedding=True),
            "structural only (reuse_only, no embedding)": await timed(only, samples, with_embedding=False),
        }
        if embedder is not None and compute_samples > 0:
            await timed(reuse, 1, with_embedding=False)  # load the model outside the measurement
            result["computing the embedding (MiniLM)"] = await timed(reuse, compute_samples, with_embedding=False)
        return result

    return asyncio.run(main())


def structural_columns(x: np.ndarray) -> np.ndarray:
    return x[:, :N_STRUCT]
