"""The frozen evaluation sets stay frozen and well-formed.

`tests/data/eval/*.frozen*.jsonl` judge the cache verifier and the tier router: they are never tuned on,
only reported. Pinning their digests makes any edit a deliberate change (update `FROZEN.sha256` in the
same commit and say why), never a quiet "fix" of a row that a new rule happens to get wrong.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

EVAL = Path(__file__).resolve().parent.parent / "data" / "eval"


def _checker() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_frozen", EVAL / "check_frozen.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _rows(name: str) -> list[dict[str, Any]]:
    with (EVAL / name).open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (EVAL / "FROZEN.sha256").read_text().splitlines():
        digest, name = line.split()
        pins[name] = digest
    return pins


@pytest.mark.parametrize("name", sorted(_pins()))
def test_frozen_file_matches_its_pinned_digest(name: str) -> None:
    digest = hashlib.sha256((EVAL / name).read_bytes()).hexdigest()
    assert digest == _pins()[name], f"{name} changed: frozen sets are only edited on purpose (update FROZEN.sha256)"


def test_every_frozen_set_is_pinned() -> None:
    assert sorted(p.name for p in EVAL.glob("*.frozen*.jsonl")) == sorted(_pins())


@pytest.mark.parametrize("name", ["frozen", "frozen2", "frozen3", "frozen4", "frozen5", "frozen6"])
def test_cache_sets_pass_the_schema_checker(name: str) -> None:
    checker = _checker()
    pair_prefix, conv_prefix = checker.SETS[name]
    pairs = _rows(f"cache_pairs.{name}.jsonl")
    convs = _rows(f"cache_conversations.{name}.jsonl")
    assert len(pairs) >= 400 and len(convs) >= 60
    assert checker.check_pairs(rows=pairs, id_prefix=pair_prefix) == []
    assert checker.check_conversations(rows=convs, id_prefix=conv_prefix) == []


def test_schema_checker_reports_a_flipped_label_and_a_duplicate_id() -> None:
    checker = _checker()
    pairs = [dict(row) for row in _rows("cache_pairs.frozen.jsonl")[:20]]
    pairs[0]["same"] = not pairs[0]["same"]
    pairs[1]["id"] = pairs[2]["id"]
    problems = checker.check_pairs(rows=pairs)
    assert any(pairs[0]["id"] in p for p in problems)
    assert any("duplicate" in p for p in problems)


def test_tier_set_is_well_formed_and_length_is_no_signal() -> None:
    rows = _rows("tier_queries.frozen.jsonl")
    assert len(rows) >= 300
    assert len({row["id"] for row in rows}) == len(rows)
    assert all(set(row) == {"id", "prompt", "tier", "category"} and row["prompt"].strip() for row in rows)
    assert {row["tier"] for row in rows} == {"small", "large"}
    short_large = [r for r in rows if r["tier"] == "large" and len(r["prompt"].split()) <= 20]
    long_small = [r for r in rows if r["tier"] == "small" and len(r["prompt"].split()) >= 80]
    assert len(short_large) >= 25 and len(long_small) >= 20
