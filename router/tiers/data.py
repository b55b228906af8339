"""Labelled tier prompts (`tier_queries.*.jsonl`): loading and token estimates for cost figures."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from fleetgate.core.errors import ConfigError

DEFAULT_DATA = Path(__file__).resolve().parents[3] / "shared" / "data" / "eval" / "tier_queries.dev.jsonl"
TIERS = ("small", "large")


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


def estimate_tokens(text: str) -> int:
    """Prompt tokens for cost estimates: ~4 characters per token (English, BPE tokenizers)."""
    return max(1, round(len(text) / 4))
