"""The length-plus-keyword baseline: tuning reaches the target recall with the fewest large calls."""

from __future__ import annotations

import numpy as np
import pytest

from fleetgate.router.tiers.data import DEFAULT_TRAIN, LabelledPrompt, load_labelled
from fleetgate.router.tiers.keyword_rule import KeywordRule, fit_keyword_rule


def row(i: int, text: str, large: bool) -> LabelledPrompt:
    return LabelledPrompt(id=str(i), text=text, large=large)


def test_predict_uses_length_or_keywords() -> None:
    rule = KeywordRule(min_words=6, keywords=("prove", "step by step"))
    got = rule.predict(["Prove it.", "hi there", "one two three four five six", "Explain step by step", "PROVE"])
    assert list(got) == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert list(KeywordRule(min_words=100, keywords=()).predict(["prover"])) == [0.0]  # whole words only


def test_tuning_keeps_the_telling_keywords_and_the_length_cut() -> None:
    rows = [row(i, f"Prove that {i} is odd or even.", True) for i in range(6)]
    rows += [row(10 + i, f"Design a system for {i} users", True) for i in range(6)]
    rows += [row(20 + i, "word " * (30 + i), True) for i in range(4)]  # long: only length catches them
    rows += [row(30 + i, f"What is the capital of country {i}?", False) for i in range(12)]
    rows += [row(50 + i, f"Summarize: {'word ' * 8} {i}", False) for i in range(6)]
    rule = fit_keyword_rule(rows, target_recall=1.0)
    assert {"prove", "design"} <= set(rule.keywords)
    routed = rule.predict([r.text for r in rows])
    y = np.asarray([r.large for r in rows])
    assert routed[y].all() and not routed[~y].any()  # separable here: perfect
    assert 12 <= rule.min_words <= 30


@pytest.mark.parametrize("target", [0.8, 0.95])
def test_tuned_rule_meets_its_target_on_the_tuning_rows(target: float) -> None:
    rows = load_labelled(DEFAULT_TRAIN)
    rule = fit_keyword_rule(rows, target_recall=target)
    routed = rule.predict([r.text for r in rows]).astype(bool)
    y = np.asarray([r.large for r in rows])
    assert routed[y].mean() >= target
    assert routed.mean() < 1.0
