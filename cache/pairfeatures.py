"""Structured comparison of two prompts: hard vetoes, then the pair model's feature vector.

`veto(a, b)` returns a reason when the two prompts differ in something that always changes the answer,
whatever the wording around it; these are exact structural checks, not word lists:
- `slot`: quoted strings, code and pasted payloads (lines after the first) differ (a short span one side
  quotes and the other writes unquoted is no payload: `verifier.analyse_pair` drops its quote marks);
- `number`: different numbers, or the same numbers in another order ("port 8080 on host port 80");
- `identifier`: different identifiers or arithmetic operators (x200, ec2, c++, `+` vs `-`);
- `language`: both prompts are clearly written in a language (`prompt_language`: the mean `wordfreq` Zipf
  frequency of their words per language, by a margin) and the languages differ: French against Italian,
  Spanish against English;
- `negation`: a negation word on one side only that nothing explains (`_unanswered_negation`: not in a
  clause of its own, a wrapper such as "hope this isn't a silly question", and with no negative word left
  on the other side, by morphology or polarity, `negative_word`: "without sugar" / "sugar-free", "not
  print" / "suppress" go to the model, which counts `negations`), a verb particle flipped ("turn on" /
  "turn off", "opt in" / "opt out"), or left-over polar words of opposite signs on the two sides ("enable" /
  "disable", "enable" / "turn off"; `lexicon.POLAR_PAIRS`): one alone may be rewording, not opposites;
- the critical kind of the words (`scope` for "all" / "single", `comparative`, ...): a shared word with a
  different critical word right before it on each side. Two ordinary modifiers ("express shipping" /
  "standard shipping", but also "prior revision" / "previous revision", "Roth IRA" / "traditional IRA") are
  no veto since round 3 of issue 12 (37 true paraphrases against 44 near misses on the development data):
  the model weighs them (`modifier_swaps`, and the token alignment's `align_swap`, the contextual
  similarity of the two modifiers);
- `order`: the arguments after a relational marker both prompts use are swapped ("X better than Y" vs
  "Y better than X", "N yen in dollars" vs "N dollars in yen", "A to B" vs "B to A").

`features(a, b, similarity=..., match=...)` describes the rest for the learned pair model
(`fleetgate.cache.pairmodel`), each a number (`FEATURES` names them, in order):
- the embedding's cosine similarity (and its excess over 0.8, a kink the linear model can use);
- the size of the difference (`fleetgate.cache.wordmatch.match`): unmatched words, the larger and the
  smaller side, whether it is one-sided (an added requirement), one word against one word (a substitution), its
  share of all content words, and how many pairs matched only as typos or acronyms;
- what the difference is made of: generic words (Zipf >= 5, "help", "make"), content words, unknown
  strings (misspellings the matcher could not pair), capitalised names, and the verifier's critical kinds
  (polar opposite, format, language, unit, date, scope, comparative, constraint); content words added on
  one side only (an added requirement, "... for a beginner") apart from generic ones (a politeness wrapper),
  and unmatched words inside a clause that also holds matched words (an added detail) rather than in a
  clause of their own ("Hope you are well.");
- surface similarity: rapidfuzz's normalised Indel ratio of the lower-cased prompts, and their length ratio;
- `rewrite_distance`: the share of unmatched words times (1 - similarity): a large rewrite is a paraphrase
  only when the embedding still finds the two close (two different questions on one topic are not);
- `question_mismatch`: both prompts ask a wh-question and share no question word ("how long" / "how much");
- `inversions`: matched word pairs in another order on the two sides (a moved clause, or swapped
  arguments: the token alignment's same-word feature tells them apart);
- `language_mismatch`: the two prompts' majority word language differs (`wordfreq`);
- `modifier_swaps`: shared words with a different modifier right before them (`swapped_modifiers`);
- `negations`: negation words left over (the ones the `negation` veto let through);
- `conversation`: the two messages follow the same earlier turns (the partition holds the whole history),
  where short follow-ups lean on that shared context ("How do I stop it?" / "How can I prevent that?");
- the gap in the share of words more frequent in another major language than in English (`wordfreq`):
  a question asked in French against the same question in English;
- token alignment (`fleetgate.cache.tokenalign.ALIGN_FEATURES`): how well every content word of one prompt
  aligns with a word of the other by MiniLM's contextual token states, a representation that is not a word
  list (the worst-aligned words, the weighted mean, the share left unaligned, capitalised names);
- `align_residual` (`fleetgate.cache.asymmetry`): a learned head over the token states of the words that one
  side adds and the other does not explain: a constraint, a format, an audience, a step ("... told entirely
  through letters") against a courtesy or a redundant word ("Hi, quick question: ...").
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from functools import lru_cache

from fleetgate.cache.asymmetry import STATE_FEATURES, STATE_NEUTRAL
from fleetgate.cache.textnorm import NEGATION, Analysis, corrected, critical_kind, polarity
from fleetgate.cache.wordmatch import WordMatch, zipf

_KINDS = ("negation", "format", "language", "unit", "date", "scope", "comparative", "constraint")
_KIND_OF = {"proglang": "language"}  # one weight for natural and programming languages
_QUESTION = re.compile(r"\bhow (?:much|many|long|often|far|old|big)\b|\b(?:what|how|why|when|where|who|which)\b")
_OTHER_LANGUAGES = ("fr", "es", "de", "it", "pt", "nl")  # wordfreq's large word lists besides English
_LANGUAGE_MARGIN = 0.5  # mean Zipf frequency of a prompt's words: its language over the next one

FEATURES: tuple[str, ...] = (
    "similarity", "similarity_over_080", "diff_words", "larger_side", "smaller_side", "one_sided", "one_to_one",
    "diff_share", "typos", "acronyms", "diff_generic", "diff_content", "one_sided_content", "diff_attached",
    "one_sided_attached", "diff_unknown", "diff_proper",
    *(f"kind_{k}" for k in _KINDS), "char_ratio", "length_ratio", "foreign_gap", "rewrite_distance",
    "question_mismatch", "conversation", "inversions", "language_mismatch", "modifier_swaps", "negations",
    *STATE_FEATURES,
)


def _particle_flip(a: Analysis, b: Analysis) -> bool:
    both = a.pairs | b.pairs
    return any(v == verb and p != particle for verb, particle in a.pairs ^ b.pairs for v, p in both)


def _swapped(a: Analysis, b: Analysis) -> bool:
    content_a = set(a.words) | set(a.numbers) | set(a.idents)
    content_b = set(b.words) | set(b.numbers) | set(b.idents)
    for marker in a.markers.keys() & b.markers.keys():
        only_a, only_b = a.markers[marker] - b.markers[marker], b.markers[marker] - a.markers[marker]
        if any(x in content_b for x in only_a) and any(y in content_a for y in only_b):
            return True
    return False


def slot_veto(a: Analysis, b: Analysis) -> str:
    """The vetoes that need no word match (quoted or pasted text, numbers, identifiers, another language),
    or "": the first checks of `veto`, which `precheck` runs before paying for the match."""
    if a.quoted != b.quoted:
        return "slot"
    if a.numbers != b.numbers:
        return "number"
    if a.idents != b.idents:  # in order too: "2^n faster than n!" / "n! faster than 2^n"
        return "identifier"
    if languages_differ(a, b):
        return "language"
    return ""


def veto(a: Analysis, b: Analysis, *, match: WordMatch) -> str:
    """The reason two prompts can never share an answer, or ""."""
    reason = slot_veto(a, b)
    if reason:
        return reason
    if _particle_flip(a, b):
        return "negation"
    if _swapped(a, b):
        return "order"
    if _unanswered_negation(a, match.left, b, match.right) or _unanswered_negation(b, match.right, a, match.left):
        return "negation"
    if opposite_polarity(a, b, match):
        return "negation"
    swaps = swapped_modifiers(a, b, match=match)
    # a swapped modifier of a critical kind ("all" / "single", "larger" / "smaller") always changes the
    # answer; two ordinary words ("express" / "standard", but also "prior" / "previous") go to the model
    return next((k for pair in swaps for k in map(critical_kind, pair) if k), "")


_NEGATIVE_PREFIX = re.compile(r"^(?:un|dis|non|in|im|ir|il|de|anti)(?=[a-z]{3})")
_NEGATIVE_SUFFIX = re.compile(r"[a-z]{3}(?:less|free)$")


def negative_word(surface: str) -> bool:
    """A word that carries a negation in itself, by morphology or polarity, not by a list of its own:
    a negative prefix on a known word ("unable", "disallow", "nonstop"), "-less" / "-free" ("sugarless",
    "free" of "sugar-free"), or the negative side of a polar pair ("disable", "stop", "off")."""
    from fleetgate.cache.textnorm import stem

    if surface == "free" or _NEGATIVE_SUFFIX.search(surface) or polarity(stem(surface)) < 0:
        return True
    m = _NEGATIVE_PREFIX.match(surface)
    return m is not None and zipf(surface) >= 2.5 and zipf(surface[m.end():]) >= 3.0


def _unanswered_negation(x: Analysis, free_x: tuple[int, ...], y: Analysis, free_y: tuple[int, ...]) -> bool:
    """A negation word left over on `x`'s side that nothing explains: not in a clause of its own (a wrapper,
    "Not urgent at all, but ...", "hope this isn't a silly question: ..."), and with no negative word left
    over on the other side ("without sugar" / "sugar-free", "not print warnings" / "suppress warnings" is
    left to the model, which sees `negations`)."""
    left = [i for i in free_x if x.words[i] == NEGATION]
    if not left:
        return False
    free = set(free_x)
    anchored = {x.clauses[i] for i in range(len(x.words)) if i not in free} if x.clauses else set()
    attached = [i for i in left if not x.clauses or x.clauses[i] in anchored]
    if not attached:
        return False
    return not any(negative_word(_surface(y, j)) for j in free_y if y.words[j] != NEGATION)


def _surface(x: Analysis, i: int) -> str:
    return x.surface[i] if i < len(x.surface) else x.words[i]


def _swapped_positions(a: Analysis, b: Analysis, *, match: WordMatch) -> list[tuple[int, int]]:
    """(index in a.words, index in b.words) of each swapped modifier (`swapped_modifiers`)."""
    free_a, free_b = set(match.left), set(match.right)

    def before(x: Analysis, i: int, free: set[int]) -> int | None:
        if 0 < i < len(x.positions) and x.positions[i - 1] == x.positions[i] - 1 and i - 1 in free:
            return i - 1
        return None

    # every occurrence counts, not only the one the matcher paired: "delivery" and "shipping" are one stem
    same = {(i, j) for i, w in enumerate(a.words) for j, v in enumerate(b.words) if w == v} | set(match.pairs)
    out: list[tuple[int, int]] = []
    for i, j in sorted(same):
        pa, pb = before(a, i, free_a), before(b, j, free_b)
        if pa is not None and pb is not None and a.words[pa] != b.words[pb]:
            out.append((pa, pb))
    return out


def swapped_modifiers(a: Analysis, b: Analysis, *, match: WordMatch) -> list[tuple[str, str]]:
    """(word in a, word in b) right before a shared word, different, and unmatched on both sides: "express
    shipping" / "standard shipping", "enable 2FA" / "disable two-factor authentication". A swapped modifier
    inside an otherwise reworded question is a near miss or a synonym ("prior" / "previous revision")."""
    return [(a.words[i], b.words[j]) for i, j in _swapped_positions(a, b, match=match)]


def swapped_surfaces(a: Analysis, b: Analysis, *, match: WordMatch) -> list[tuple[str, str]]:
    """The swapped modifiers as written (lower-cased), for the token alignment (`tokenalign.align_features`)."""
    return [(_surface(a, i), _surface(b, j)) for i, j in _swapped_positions(a, b, match=match)]


def modifier_swaps(a: Analysis, b: Analysis, *, match: WordMatch) -> int:
    return len(swapped_modifiers(a, b, match=match))


def _signs(x: Analysis, unmatched: tuple[int, ...]) -> set[int]:
    """Polarity of the left-over words, and of the particle of a left-over verb ("turn off": -1)."""
    free = set(unmatched)
    signs = {polarity(x.words[i]) for i in free}
    signs |= {polarity(particle) for verb, particle in x.pairs if verb in {x.words[i] for i in free}}
    return signs - {0}


def opposite_polarity(a: Analysis, b: Analysis, match: WordMatch) -> bool:
    """A positive polar word left over on one side and a negative one on the other: "enable" / "disable",
    "enable 2FA" / "turn off two-factor authentication" (one polar word alone may be rewording)."""
    sa, sb = _signs(a, match.left), _signs(b, match.right)
    return any(-s in sb for s in sa)


def _questions(text: str) -> frozenset[str]:
    return frozenset(m.group(0).replace(" ", "-") for m in _QUESTION.finditer(text))


def _question_mismatch(a: str, b: str) -> float:
    """1 when both prompts ask a wh-question and share no question word ("how long" vs "how much", "what is"
    vs "how do I"): a different question on the same topic more often than a paraphrase."""
    qa, qb = _questions(a), _questions(b)
    return float(bool(qa) and bool(qb) and not (qa & qb))


def _attached(x: Analysis, unmatched: tuple[int, ...]) -> int:
    """Unmatched words in a clause that also holds a matched word: a detail added to the question itself
    ("... if I need the money back within a year"), not a wrapper around it ("Thanks a lot!")."""
    if not x.clauses:
        return len(unmatched)
    free = set(unmatched)
    anchored = {x.clauses[i] for i in range(len(x.words)) if i not in free}
    return sum(x.clauses[i] in anchored for i in unmatched)


def _foreign(word: str) -> bool:
    from wordfreq import zipf_frequency

    english = zipf(word)
    return any(zipf_frequency(word, lang) > english + 1.0 for lang in _OTHER_LANGUAGES)


_foreign_cached = lru_cache(maxsize=65536)(_foreign)


def _language(word: str) -> str:
    """The language a word votes for: English unless another major language uses it clearly more often
    (by the margin of `_foreign`: "por", "cento"), so that English words other languages borrow ("python",
    "capital") do not make an English prompt foreign; "" for an unknown string."""
    from wordfreq import zipf_frequency

    scores = {lang: zipf_frequency(word, lang) for lang in ("en", *_OTHER_LANGUAGES)}
    best = max(scores, key=scores.__getitem__)
    if scores[best] <= 0:
        return ""
    return best if scores[best] > scores["en"] + 1.0 else "en"


_language_cached = lru_cache(maxsize=65536)(_language)


def _votes(x: Analysis) -> Counter[str]:
    return Counter(filter(None, map(_language_cached, x.surface or x.words)))


@lru_cache(maxsize=65536)
def _frequencies(word: str) -> tuple[float, ...]:
    from wordfreq import zipf_frequency

    return tuple(zipf_frequency(word, lang) for lang in ("en", *_OTHER_LANGUAGES))


def prompt_language(x: Analysis) -> str:
    """The language a prompt is clearly written in, or "": the language whose word list gives its words (at
    least three) the highest mean Zipf frequency (`wordfreq`), by a margin of `_LANGUAGE_MARGIN` over the
    next one. A sum over all words, not a vote per word: related languages share words ("por", "de" in
    Spanish and Portuguese) and a vote splits on them, where "é" and "cento" still tip the sum."""
    return _language_of(x.surface or x.words)


@lru_cache(maxsize=16384)  # per prompt, not per candidate pair: a lookup compares one prompt with several
def _language_of(words: tuple[str, ...]) -> str:
    if len(words) < 3:
        return ""
    langs = ("en", *_OTHER_LANGUAGES)
    # a misspelt English word counts as the word it misspells ("wirte", "abot"), so typos never make a
    # prompt foreign (a foreign word that happens to be close to an English one only makes it less clear)
    # (the first `MAX_CORRECTIONS` of them: a prompt of made-up words costs the event loop a bounded time)
    totals = [sum(column) / len(words)
              for column in zip(*(_frequencies(w) for w in corrected(words)), strict=True)]
    order = sorted(range(len(langs)), key=totals.__getitem__, reverse=True)
    return langs[order[0]] if totals[order[0]] - totals[order[1]] >= _LANGUAGE_MARGIN else ""


def languages_differ(a: Analysis, b: Analysis) -> bool:
    """Both prompts are clearly written in a language (`prompt_language`) and the two differ: the answers
    are in different languages (French against Italian, Spanish against English), whatever the question."""
    la, lb = prompt_language(a), prompt_language(b)
    return bool(la) and bool(lb) and la != lb


def language_mismatch(a: Analysis, b: Analysis) -> float:
    """1 when the two prompts' most common word language (by `wordfreq`, each word voting for the language
    where it is clearly most frequent, `_language`) differs: Spanish against Portuguese, where `foreign_gap`
    sees two foreign prompts alike."""
    def top(x: Analysis) -> str:
        votes = _votes(x)
        return votes.most_common(1)[0][0] if votes else ""

    la, lb = top(a), top(b)
    return float(bool(la) and bool(lb) and la != lb)


def foreign_share(x: Analysis) -> float:
    """Share of a prompt's content words more frequent in another major language than in English."""
    words = x.surface or x.words
    return sum(map(_foreign_cached, words)) / len(words) if words else 0.0


def features(a: Analysis, b: Analysis, *, similarity: float, match: WordMatch, text_a: str, text_b: str,
             conversation: bool = False, align: Sequence[float] = STATE_NEUTRAL) -> list[float]:
    """The pair model's inputs, in `FEATURES` order; `align`: `fleetgate.cache.tokenalign.align_features` of
    the two prompts with the residual head's score (`asymmetry.state_features`; `STATE_NEUTRAL` when token
    states are not available: tests, `verify` without a `TokenStates`)."""
    from rapidfuzz.distance import Indel

    diff = [(a, i) for i in match.left] + [(b, j) for j in match.right]
    left, right = len(match.left), len(match.right)
    total = len(a.words) + len(b.words)
    generic = content = unknown = proper = 0
    kinds = dict.fromkeys(_KINDS, 0)
    for side, i in diff:
        stem = side.words[i]
        freq = zipf(_surface(side, i))
        if freq >= 5.0:
            generic += 1
        elif freq >= 2.5:
            content += 1
        else:
            unknown += 1
        proper += stem in a.proper or stem in b.proper
        kind = critical_kind(stem)
        if kind:
            kinds[_KIND_OF.get(kind, kind)] += 1
    la, lb = text_a.strip().lower(), text_b.strip().lower()
    one_sided = (left == 0) != (right == 0)
    attached = _attached(a, match.left) + _attached(b, match.right)
    return [
        similarity, max(0.0, similarity - 0.8), float(left + right), float(max(left, right)), float(min(left, right)),
        float(one_sided), float(left == 1 and right == 1), (left + right) / max(total, 1),
        float(match.typos), float(match.acronyms), float(generic), float(content),
        float(content if one_sided else 0), float(attached), float(attached if one_sided else 0),
        float(unknown), float(proper),
        *(float(kinds[k]) for k in _KINDS),
        float(Indel.normalized_similarity(la, lb)), min(len(la), len(lb)) / max(len(la), len(lb), 1),
        abs(foreign_share(a) - foreign_share(b)), (left + right) / max(total, 1) * (1.0 - similarity),
        _question_mismatch(la, lb), float(conversation), float(match.inversions), language_mismatch(a, b),
        float(modifier_swaps(a, b, match=match)),
        float(sum(a.words[i] == NEGATION for i in match.left) + sum(b.words[j] == NEGATION for j in match.right)),
        *map(float, align),
    ]
