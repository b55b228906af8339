"""Labelled tier prompts (`tier_queries.*.jsonl`): where they live, loading, token estimates for cost figures.

Three sources, each a JSONL file of `{"id", "prompt", "tier": "small"|"large", "category"}` rows:
- `DEFAULT_TRAIN`: the project's own hand-written training prompts (`router/tiers/data/train.jsonl`);
- `default_dev()`: the reference dev set beside the clone (`../shared/data/eval/tier_queries.dev.jsonl`, or
  `$FLEETGATE_EVAL_DATA/tier_queries.dev.jsonl`); optional: training and evaluation work without it;
- `DEFAULT_FROZEN`: the frozen test set (`tests/data/eval/tier_queries.frozen.jsonl`), never trained on.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from fleetgate.core.errors import ConfigError

_REPO = Path(__file__).resolve().parents[2]
DEFAULT_TRAIN = Path(__file__).resolve().with_name("data") / "train.jsonl"
DEFAULT_FROZEN = _REPO / "tests" / "data" / "eval" / "tier_queries.frozen.jsonl"
DEV_FILE = "tier_queries.dev.jsonl"
TIERS = ("small", "large")


def default_dev() -> Path:
    """The dev set: `$FLEETGATE_EVAL_DATA` (a folder) when set, else `../shared/data/eval` beside the clone."""
    folder = os.environ.get("FLEETGATE_EVAL_DATA")
    return (Path(folder) if folder else _REPO.parent / "shared" / "data" / "eval") / DEV_FILE


def default_training_data() -> list[Path]:
    """What `fleetgate tier train` fits on by default: the project's prompts, plus the dev set when present."""
    dev = default_dev()
    return [DEFAULT_TRAIN, dev] if dev.is_file() else [DEFAULT_TRAIN]


@dataclass(frozen=True, slots=True)
class LabelledPrompt:
    id: str
    text: str
    large: bool  # the smallest tier that answers well is the large one
    category: str = ""


def load_labelled(path: Path) -> list[LabelledPrompt]:
    """Rows `{"id", "prompt", "tier": "small"|"large", "category"}`; errors name the file and line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError as exc:
        raise ConfigError(f"labelled data {path} does not exist") from exc
    rows: list[LabelledPrompt] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
            tier = obj["tier"]
            if tier not in TIERS:
                raise ValueError(f"tier must be one of {TIERS}, got {tier!r}")
            rows.append(
                LabelledPrompt(
                    id=str(obj.get("id", number)), text=str(obj["prompt"]), large=tier == "large",
                    category=str(obj.get("category", "")),
                )
            )
        except (json.JSONDecodeError, KeyError, ValueError) as exc:
            raise ConfigError(f"{path}:{number}: not a labelled tier prompt: {exc}") from exc
    if not rows:
        raise ConfigError(f"labelled data {path} is empty")
    return rows


def load_many(paths: Sequence[Path]) -> list[LabelledPrompt]:
    """The rows of several files, in order; an id that appears twice is an error (it would be judged twice)."""
    rows = [row for path in paths for row in load_labelled(path)]
    seen: set[str] = set()
    for row in rows:
        if row.id in seen:
            raise ConfigError(f"labelled prompt id {row.id!r} appears twice in {', '.join(map(str, paths))}")
        seen.add(row.id)
    return rows


def estimate_tokens(text: str) -> int:
    """Prompt tokens for cost estimates: ~4 characters per token (English, BPE tokenizers)."""
    return max(1, round(len(text) / 4))
