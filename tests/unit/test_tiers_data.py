"""Labelled tier data: the project's own training prompts, optional dev data, clear errors, no outside files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from fleetgate.core.errors import ConfigError
from fleetgate.router.tiers.data import (
    DEFAULT_TRAIN,
    DEV_FILE,
    default_dev,
    default_training_data,
    load_labelled,
    load_many,
)

TESTS = Path(__file__).resolve().parents[1]


def test_the_training_prompts_ship_with_the_repository() -> None:
    rows = load_labelled(DEFAULT_TRAIN)
    assert len(rows) >= 400 and len({r.id for r in rows}) == len(rows) and len({r.text for r in rows}) == len(rows)
    large = [r for r in rows if r.large]
    assert 0.3 < len(large) / len(rows) < 0.7
    assert sum(len(r.text.split()) <= 20 for r in large) >= 100  # short hard prompts, the dev set's blind spot
    assert sum(len(r.text.split()) >= 60 for r in rows if not r.large) >= 10  # long easy ones


def test_training_data_without_the_dev_set_beside_the_clone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FLEETGATE_EVAL_DATA", str(tmp_path))
    assert default_dev() == tmp_path / DEV_FILE
    assert default_training_data() == [DEFAULT_TRAIN]
    (tmp_path / DEV_FILE).write_text(json.dumps({"id": "d1", "prompt": "hi", "tier": "small"}) + "\n")
    assert default_training_data() == [DEFAULT_TRAIN, tmp_path / DEV_FILE]


def test_load_many_rejects_an_id_seen_twice(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text(json.dumps({"id": "x", "prompt": "hi", "tier": "small"}) + "\n")
    b.write_text(json.dumps({"id": "x", "prompt": "Prove it.", "tier": "large"}) + "\n")
    assert [r.text for r in load_many([a])] == ["hi"]
    with pytest.raises(ConfigError, match="'x' appears twice"):
        load_many([a, b])
    b.write_text('{"id": "y", "prompt": "hi", "tier": "medium"}\n')
    with pytest.raises(ConfigError, match=r"b.jsonl:1: .*tier must be one of"):
        load_many([b])


def test_no_test_reads_data_from_outside_the_clone() -> None:
    """`make test` must pass on a plain clone: no test may read ../shared (the reference data beside it)."""
    # Paths built in code: a string literal that starts with ../shared, or `/ "shared"` on a Path.
    outside = re.compile(r"""["']\.\./shared|/\s*["']shared["']""")
    offenders = [
        str(path.relative_to(TESTS))
        for path in TESTS.rglob("*.py")
        if path != Path(__file__).resolve() and outside.search(path.read_text(encoding="utf-8"))
    ]
    assert offenders == []
