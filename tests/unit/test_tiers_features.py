"""Structural signals and embedding handling of the tier scorer's features."""

from __future__ import annotations

import time

import numpy as np
import pytest

from fleetgate.router.tiers.embedding import EMBEDDING_DIM
from fleetgate.router.tiers.features import (
    MAX_CHARS,
    STRUCTURAL_FEATURES,
    feature_matrix,
    feature_vector,
    normalize_embedding,
    scoring_text,
    structural_features,
)


def feat(text: str, name: str) -> float:
    return float(structural_features(text)[STRUCTURAL_FEATURES.index(name)])


def test_code_markers_raise_the_code_signal() -> None:
    plain = "Tell me about the history of the bicycle."
    code = "Why does this fail?\n```python\ndef f(x):\n    return x.items()\n```"
    assert feat(code, "code") > feat(plain, "code") == 0.0


def test_math_signal_counts_numbers_and_math_words() -> None:
    assert feat("Prove that the square root of 2 is irrational.", "math") > 0
    assert feat("A train leaves at 3 pm going 60 km/h; how many hours until 240 km?", "math") > feat(
        "Say hello to my friend.", "math"
    )


def test_multi_step_instructions_raise_the_steps_signal() -> None:
    one = "Translate 'good morning' into French."
    many = "First list the options. Then compare them step by step. Finally recommend one.\n1. cost\n2. speed"
    assert feat(many, "steps") > feat(one, "steps")


def test_question_words_and_constraints() -> None:
    assert feat("Why does TCP use a three-way handshake?", "why_how") > 0
    assert feat("What is the capital of Peru?", "what_who") > 0
    meals = "Plan a week of meals: it must cost under 50 dollars, without nuts, at most 30 minutes each."
    assert feat(meals, "constraints") == pytest.approx(np.log1p(3))


def test_quoted_share_is_high_for_a_text_to_transform() -> None:
    email = "Proofread: 'Dear team, I wanted to let you know that the meeting on friday has been moved to monday.'"
    assert feat(email, "quoted_share") > 0.7
    assert feat("Explain how vaccines train the immune system.", "quoted_share") == 0.0


def test_length_is_log_damped() -> None:
    short, long = feat("one two three", "log_words"), feat(" ".join(["word"] * 500), "log_words")
    assert short == pytest.approx(np.log1p(3))
    assert long == pytest.approx(np.log1p(500))


def test_huge_prompts_are_bounded_in_cost() -> None:
    huge = "x = f(y); " * (MAX_CHARS // 2)
    start = time.perf_counter()
    structural_features(huge)
    assert time.perf_counter() - start < 0.5
    assert feat(huge, "log_words") == feat(huge[:MAX_CHARS], "log_words")


def test_normalize_embedding_accepts_only_finite_384_vectors() -> None:
    v = np.arange(1, EMBEDDING_DIM + 1, dtype=np.float32)
    n = normalize_embedding(list(v))
    assert n is not None and np.linalg.norm(n) == pytest.approx(1.0)
    assert np.allclose(n * np.linalg.norm(v), v)
    assert normalize_embedding(None) is None
    assert normalize_embedding(np.ones(512)) is None  # another model's vector
    assert normalize_embedding(np.zeros(EMBEDDING_DIM)) is None
    bad = np.ones(EMBEDDING_DIM)
    bad[3] = np.nan
    assert normalize_embedding(bad) is None
    assert normalize_embedding("not a vector") is None


def test_feature_vector_and_matrix_agree() -> None:
    rng = np.random.default_rng(1)
    emb = rng.normal(size=(2, EMBEDDING_DIM))
    texts = ["Write a function that merges two sorted lists.", "hi!"]
    matrix = feature_matrix(texts, emb)
    assert matrix.shape == (2, len(STRUCTURAL_FEATURES) + EMBEDDING_DIM)
    for i, text in enumerate(texts):
        unit = emb[i] / np.linalg.norm(emb[i])
        assert np.allclose(matrix[i], feature_vector(text, unit))


def test_scoring_text_is_the_last_user_turn_of_a_chat() -> None:
    chat = "<|system|>Be brief.\n<|user|>first\nline two\n<|assistant|>ok\n<|user|>Translate 'hi'.\n"
    assert scoring_text(chat) == "Translate 'hi'."
    assert scoring_text("<|system|>only a system prompt\n") == "<|system|>only a system prompt\n"
    assert scoring_text("plain completion prompt") == "plain completion prompt"
    assert scoring_text("<|user|>multi\nline\n") == "multi\nline"
