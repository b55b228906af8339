"""Picker: weighted random, P(e) proportional to max(total_e, 0) ** `power`.

A softer alternative to max-score: spreads load in proportion to scores. `power` (default 1)
sharpens (> 1) or flattens (< 1) the preference. When every total is 0 the choice is uniform.
The remaining endpoints follow the chosen one by score (the fallback is the best of the rest).
Parameters: `power`, `seed` (optional).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from fleetgate.core.types import Endpoint
from fleetgate.router.plugins.base import PluginContext, param


class WeightedRandomPicker:
    def __init__(self, *, name: str, rng: random.Random, power: float = 1.0) -> None:
        if power <= 0:
            raise ValueError("power must be positive")
        self.name = name
        self.rng = rng
        self.power = power

    def pick(self, endpoints: Sequence[Endpoint], totals: Sequence[float]) -> list[int]:
        n = len(totals)
        weights = [max(t, 0.0) ** self.power for t in totals]
        if sum(weights) <= 0:
            weights = [1.0] * n
        first = self.rng.choices(range(n), weights=weights, k=1)[0]
        rest = sorted((i for i in range(n) if i != first), key=lambda i: -totals[i])
        return [first, *rest]


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> WeightedRandomPicker:
    seed = param(parameters, "seed", None, int)
    rng = random.Random(seed) if seed is not None else ctx.rng
    return WeightedRandomPicker(name=name, rng=rng, power=param(parameters, "power", 1.0, float))
