"""Picker: the endpoint with the highest total score; ties broken at random.

Formula: order endpoints by (total score desc, random key); the first is chosen, the second is the
fallback. Random tie-breaking spreads load when scores are equal (e.g. an idle fleet) instead of
always favouring the first listed endpoint. Parameters: `seed` (optional, for reproducible runs).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from fleetgate.core.types import Endpoint
from fleetgate.router.plugins.base import PluginContext, param


class MaxScorePicker:
    def __init__(self, *, name: str, rng: random.Random) -> None:
        self.name = name
        self.rng = rng

    def pick(self, endpoints: Sequence[Endpoint], totals: Sequence[float]) -> list[int]:
        # Scores within 1e-9 count as equal; `sorted` is stable, so a shuffled start breaks ties at random.
        order = list(range(len(totals)))
        self.rng.shuffle(order)
        return sorted(order, key=lambda i: -round(totals[i], 9))


def build(*, name: str, parameters: dict[str, Any], ctx: PluginContext) -> MaxScorePicker:
    seed = param(parameters, "seed", None, int)
    return MaxScorePicker(name=name, rng=random.Random(seed) if seed is not None else ctx.rng)
