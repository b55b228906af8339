"""Spelling correction of the text the cache embeds (`fleetgate.cache.textnorm.embedding_text`), and the bound
on what a prompt of made-up words costs the event loop there and in the verifier's language check."""

from __future__ import annotations

import random
import string

import pytest

from fleetgate.cache import textnorm
from fleetgate.cache.pairfeatures import prompt_language
from fleetgate.cache.textnorm import MAX_CORRECTIONS, analyse, correct_word, embedding_text


@pytest.mark.parametrize(("typed", "meant"), [("revrese", "reverse"), ("lsit", "list"), ("rceipe", "recipe"),
                                               ("ohuse", "house")])
def test_a_misspelling_becomes_the_common_word_it_misspells(typed: str, meant: str) -> None:
    assert correct_word(typed) == meant


@pytest.mark.parametrize("word", ["python", "teh", "the", "reverse"])
def test_real_words_and_short_ones_stay(word: str) -> None:
    assert correct_word(word) == word


def test_only_lower_case_words_outside_identifiers_are_corrected() -> None:
    text = "how do i revrese a lsit in Pyhton 3.11 with np.argsrot"
    assert embedding_text(text) == "how do i reverse a list in Pyhton 3.11 with np.argsrot"


def made_up(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(5, 9))) for _ in range(n)]


def test_a_prompt_of_made_up_words_costs_a_bounded_number_of_vocabulary_scans(
        monkeypatch: pytest.MonkeyPatch) -> None:
    scans: list[str] = []
    real = textnorm.correct_word.__wrapped__

    def counting(word: str) -> str:
        scans.append(word)
        return real(word)

    monkeypatch.setattr(textnorm, "correct_word", counting)
    words = made_up(200, seed=1)
    out = embedding_text(" ".join(words))
    assert len(scans) == MAX_CORRECTIONS  # every word needs it; only the first ones get it
    assert out.split()[MAX_CORRECTIONS:] == words[MAX_CORRECTIONS:]
    scans.clear()
    prompt_language(analyse(" ".join(made_up(200, seed=2))))
    assert len(scans) <= MAX_CORRECTIONS
