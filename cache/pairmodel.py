"""The learned pair model: probability that one cached answer is right for both prompts.

A logistic regression over the standardised features of `fleetgate.cache.pairfeatures` (names in
`FEATURES`): p = 1 / (1 + exp(-(intercept + sum(coef_i * (x_i - mean_i) / scale_i)))). A candidate is
accepted when p >= `threshold`, the operating point chosen by cross-validation for precision with a margin
(`fleetgate.cache.training`). Inference is a dot product in plain Python: no scikit-learn at run time.

The shipped weights live in `pair_model.json` beside this module and are refitted with
`fleetgate cache-eval --fit` from the dev set and the hand-written training rows in `data/`. The same file
holds the residual head (`fleetgate.cache.asymmetry.ResidualHead`) whose score is the model's input
`align_residual`: the two are fitted together, so they travel together.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from fleetgate.cache.asymmetry import ResidualHead
from fleetgate.cache.pairfeatures import FEATURES

MODEL_PATH = Path(__file__).resolve().parent / "pair_model.json"


@dataclass(frozen=True, slots=True)
class PairModel:
    features: tuple[str, ...]
    mean: tuple[float, ...]
    scale: tuple[float, ...]
    coef: tuple[float, ...]
    intercept: float
    threshold: float
    info: dict[str, Any]  # how it was fitted (rows, cross-validated precision/recall): reported, not used
    head: ResidualHead | None = None  # the residual head behind `align_residual` (None: fitted without states)

    @property
    def uses_alignment(self) -> bool:
        """Whether any token-alignment feature has a weight: if not, a lookup never computes token states."""
        return any(c != 0.0 for f, c in zip(self.features, self.coef, strict=True) if f.startswith("align_"))

    def probability(self, x: Sequence[float]) -> float:
        z = self.intercept + sum(c * (v - m) / s for c, v, m, s in zip(self.coef, x, self.mean, self.scale,
                                                                          strict=True))
        return _sigmoid(z)

    def probability_bounds(self, low: Sequence[float], high: Sequence[float]) -> tuple[float, float]:
        """The least and the greatest probability over every input with low[i] <= x[i] <= high[i] (the
        model is linear in its inputs before the sigmoid: each input at the end of its range that lowers,
        or raises, the score)."""
        terms = [(c * (lo - m) / s, c * (hi - m) / s) for c, lo, hi, m, s in zip(self.coef, low, high, self.mean,
                                                                                  self.scale, strict=True)]
        z_low = self.intercept + sum(min(t) for t in terms)
        z_high = self.intercept + sum(max(t) for t in terms)
        return _sigmoid(z_low), _sigmoid(z_high)

    def to_json(self) -> str:
        raw: dict[str, Any] = {"features": list(self.features), "mean": list(self.mean), "scale": list(self.scale),
                               "coef": list(self.coef), "intercept": self.intercept, "threshold": self.threshold,
                               "info": self.info}
        if self.head is not None:
            raw["residual_head"] = self.head.to_dict()
        return json.dumps(raw, indent=1) + "\n"

    @classmethod
    def from_json(cls, text: str) -> PairModel:
        raw = json.loads(text)
        features = tuple(raw["features"])
        if features != FEATURES:
            raise ValueError(f"pair model was fitted on features {features}, the code computes {FEATURES}: "
                             "refit it with `fleetgate cache-eval --fit`")
        lengths = {len(raw[k]) for k in ("mean", "scale", "coef")}
        if lengths != {len(features)}:
            raise ValueError("pair model: mean, scale and coef must have one value per feature")
        return cls(features=features, mean=tuple(map(float, raw["mean"])), scale=tuple(map(float, raw["scale"])),
                   coef=tuple(map(float, raw["coef"])), intercept=float(raw["intercept"]),
                   threshold=float(raw["threshold"]), info=dict(raw.get("info", {})),
                   head=ResidualHead.from_dict(raw["residual_head"]) if "residual_head" in raw else None)


def _sigmoid(z: float) -> float:
    return 1.0 / (1.0 + math.exp(-max(-50.0, min(50.0, z))))


@lru_cache(maxsize=4)
def load_model(path: Path = MODEL_PATH) -> PairModel:
    return PairModel.from_json(path.read_text(encoding="utf-8"))
