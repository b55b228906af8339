"""Word matching of the near-miss verifier: typos of non-words, distinct real words, acronyms (hand-written)."""

from __future__ import annotations

import pytest

from fleetgate.cache.textnorm import analyse
from fleetgate.cache.wordmatch import KNOWN_ZIPF, full_match, is_typo, match, zipf


@pytest.mark.parametrize(("a", "b"), [
    ("language", "langauge"),  # transposition
    ("restart", "restrat"),
    ("environment", "enviroment"),  # deletion
    ("billing", "biling"),  # the stems differ ("bill" / "bile"), the surfaces are one edit apart
    ("calculate", "calcualte"),
])
def test_a_misspelt_word_matches_its_word(a: str, b: str) -> None:
    assert zipf(b) < KNOWN_ZIPF <= zipf(a)
    from fleetgate.cache.textnorm import stem

    assert is_typo(stem(a), stem(b), a, b) and is_typo(stem(b), stem(a), b, a)


@pytest.mark.parametrize(("a", "b"), [
    ("austria", "australia"),  # two real words are two words, however close
    ("slovakia", "slovenia"),
    ("formal", "normal"),
    ("mount", "unmount"),  # a prefix in front changes the meaning
    ("archive", "unarchive"),
    ("fsa", "hsa"),  # short words and acronyms match exactly or not at all
])
def test_distinct_words_are_not_typos(a: str, b: str) -> None:
    from fleetgate.cache.textnorm import stem

    assert not is_typo(stem(a), stem(b), a, b)


def test_a_capitalised_name_matches_only_exactly() -> None:
    m = match(analyse("What currency does Niger use?"), analyse("What currency does Nigeria use?"))
    assert m.left and m.right and m.typos == 0


@pytest.mark.parametrize(("short", "long_"), [
    ("What is an ETF?", "What is an exchange-traded fund?"),
    ("How do I set up a VPN?", "How do I set up a virtual private network?"),
])
def test_an_acronym_matches_the_initials_of_its_words(short: str, long_: str) -> None:
    for a, b in ((short, long_), (long_, short)):
        m = match(analyse(a), analyse(b))
        assert (m.left, m.right, m.acronyms) == ((), (), 1)


def test_what_is_left_over_is_the_difference() -> None:
    m = match(analyse("Suggest a laptop for programming."), analyse("Suggest a laptop for programming on a budget."))
    b = analyse("Suggest a laptop for programming on a budget.")
    assert m.left == () and [b.words[j] for j in m.right] == ["budget"]


@pytest.mark.parametrize(("a", "b", "swaps"), [
    ("How long does express shipping take?", "What is the delivery time for standard shipping?", 1),
    ("How long does standard shipping take?", "What is the delivery time for standard shipping?", 0),
    ("Which areas are best to stay in?", "What neighborhoods should I stay in?", 0),  # not next to each other
])
def test_modifier_swaps_count_a_different_word_right_before_a_shared_one(a: str, b: str, swaps: int) -> None:
    from fleetgate.cache.pairfeatures import modifier_swaps

    x, y = analyse(a), analyse(b)
    assert modifier_swaps(x, y, match=match(x, y)) == swaps


@pytest.mark.parametrize(("a", "b", "opposite"), [
    ("How do I enable dark mode?", "How do I disable dark mode?", True),
    ("How can I turn off dark mode?", "What are the steps to enable dark mode?", True),
    ("How can I turn on dark mode?", "What are the steps to enable dark mode?", False),
    ("How do I stop my dog from barking?", "How can I get my dog to quit barking?", False),  # one polar word
])
def test_opposite_polarity_needs_a_left_over_polar_word_of_each_sign(a: str, b: str, opposite: bool) -> None:
    from fleetgate.cache.pairfeatures import opposite_polarity

    x, y = analyse(a), analyse(b)
    assert opposite_polarity(x, y, match(x, y)) is opposite


@pytest.mark.parametrize(("a", "b", "full"), [
    ("In Rust, how do I read a file?", "How do I read a file in Rust?", True),  # a clause moved whole
    ("How do I rename a branch in git?", "how do i renmae a branch in git", True),  # a typo of a known word
    ("How many euros is 250 Swiss francs?", "How many Swiss francs is 250 euros?", False),  # moved in a clause
    ("Is Go faster than Java here?", "Is Java faster than Go here?", False),  # swapped
    ("How do I restart the sshd service?", "How do I restart the sssd service?", False),  # two rare strings
])
def test_full_match_needs_the_same_order_or_a_moved_clause(a: str, b: str, full: bool) -> None:
    x, y = analyse(a), analyse(b)
    assert full_match(x, y, match(x, y)) is full
