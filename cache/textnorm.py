"""Text normalisation for the near-miss verifier.

`analyse(text)` -> `Analysis`:
- `quoted`: quoted strings ('…', "…", `…`, code fences) and every line after the first (a pasted payload),
  whitespace-collapsed, in order;
- `numbers`: numeric values in order (digit groups joined, number words "zero".."million" folded);
- `idents`: tokens mixing letters and digits or code punctuation (x200, ec2, node.js, c++) and arithmetic
  operators (`op+`, `op-`, ...);
- `words`: content stems in order — lower-cased, courtesy clauses dropped, contractions and `ALIASES`
  expanded, Snowball (Porter2) stems, `SYNONYMS` folded to one representative, `STOPWORDS` dropped (and
  tokens one typo away from a framing word such as "waht");
- `pairs`: (verb stem, particle) for "turn on", "log out", ...;
- `markers`: marker -> the first content token and the first non-number content token after each of its
  occurrences;
- `proper`: stems of capitalised words that do not start a sentence (names, places, products);
- `surface`: the lower-cased token behind each of `words` (word frequencies are looked up on real words);
- `clauses`: the clause each of `words` is in (a greeting or a thank-you is a clause of its own);
- `positions`: the token index of each of `words`, to tell which words stand next to each other.

The word lists live in `fleetgate.cache.lexicon`.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from functools import lru_cache
from types import MappingProxyType
from typing import Any

from fleetgate.cache import lexicon

_SMALL_NUMBERS = (
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
    "sixteen seventeen eighteen nineteen twenty"
)
_NUMBER_WORDS = MappingProxyType({w: i for i, w in enumerate(_SMALL_NUMBERS.split())} | {
    "thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
    "hundred": 100, "thousand": 1000, "million": 1_000_000, "dozen": 12,
})
_COURTESY = re.compile(
    r"\bif (?:it is|it's|its) not (?:too much )?(?:trouble|a problem|to ask)\b"
    r"|\bif you (?:do not|don't|dont) mind\b|\bno worries\b|\bnot sure if\b|\bthanks? (?:you )?in advance\b"
    r"|\bwalk (?:me|us) through\b"
)
_CONTRACTIONS = (  # (a substring every match contains, pattern, replacement), applied in this order
    ("can", re.compile(r"\bcan't\b|\bcannot\b"), "can not"),
    ("'", re.compile(r"\bwon't\b"), "will not"),
    ("'", re.compile(r"n't\b"), " not"),
    ("'", re.compile(r"'re\b"), " are"),
    ("'", re.compile(r"'ll\b"), " will"),
    ("'", re.compile(r"'ve\b"), " have"),
    ("'", re.compile(r"'m\b"), " am"),
    ("'", re.compile(r"'d\b"), " would"),
    ("'", re.compile(r"\b(it|what|that|there|here|who|where|how|when|he|she)'s\b"), r"\1 is"),
    ("'", re.compile(r"'s\b"), ""),
    ("a.m", re.compile(r"\ba\.m\.?"), "am"),
    ("p.m", re.compile(r"\bp\.m\.?"), "pm"),
)
_DIGIT = re.compile(r"\d")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}\b)")
_NUMBER_UNIT = re.compile(r"\b(\d+(?:\.\d+)?)(?=[a-z%]+\b)")
_HYPHEN = re.compile(r"(?<=[a-z])-(?=[a-z])")
_NUMBER_HYPHEN = re.compile(r"\b(\d+)-(?=[a-z]{2,}\b)")
_OPERATOR = re.compile(r"(?:(?<=[\s\d(])|^)([-+*/^=<>])(?=[\s\d(x])")
_QUOTED = re.compile(r"```.*?```|`[^`]+`|\"[^\"]+\"|“[^”]+”|(?<![\w])'(?=\S)[^'\n]*[^'\s]'(?![\w])", re.DOTALL)
_QUOTE_MARKS = ("`", '"', "\u201c", "'")  # every `_QUOTED` match starts with one of these
_TOKEN = re.compile(
    r"(?<![a-z0-9])--?[a-z][a-z0-9-]*|op[-+*/^=<>]|w/o?|[a-z0-9µà-öø-ÿ]+(?:[.+#\-/'^][a-z0-9à-öø-ÿ]+)*(?:\+\+|#)?"
    r"|%|\$|€|£"  # letters with accents belong to words ("cuánto"); "2^n" is one token
)
_NUMERIC = re.compile(r"^\d+(?:[.,/]\d+)*$")
_PROPER = re.compile(r"(?<![.!?:\n]\s)(?<![.!?:\n])(?<!^)\b([A-Z][A-Za-z]+)\b")
_CLAUSE = re.compile(r"[,;:.!?\u2014\u2013]+(?=\s|$)|\s-\s")  # punctuation that ends a clause, not "node.js"
NEGATION = "<not>"  # every negation word ("not", "no", "never", "without", ...) becomes this one word


@dataclass(frozen=True, slots=True)
class Analysis:
    quoted: tuple[str, ...]
    numbers: tuple[str, ...]
    idents: tuple[str, ...]
    words: tuple[str, ...]
    pairs: frozenset[tuple[str, str]]
    markers: dict[str, frozenset[str]]
    proper: frozenset[str] = frozenset()  # stems of capitalised words inside a sentence (names, products)
    surface: tuple[str, ...] = ()  # the lower-cased token each of `words` came from (for word frequencies)
    clauses: tuple[int, ...] = ()  # the clause (split at , ; : . ! ? and dashes) each of `words` is in
    positions: tuple[int, ...] = ()  # the token index of each of `words` (adjacency: "express shipping")


@lru_cache(maxsize=1)
def _stemmer() -> Any:
    import snowballstemmer

    return snowballstemmer.stemmer("english")


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    return str(_stemmer().stemWord(word))


@lru_cache(maxsize=1)
def _tables() -> tuple[dict[str, str], frozenset[str], dict[str, str]]:
    """(synonym stem -> representative stem, stop stems, critical stem -> kind)."""
    synonyms: dict[str, str] = {}
    for line in lexicon.SYNONYMS:
        group = line.split()
        for w in group:
            synonyms[stem(w)] = stem(group[0])
    stops = frozenset(stem(w) for w in lexicon.STOPWORDS) | lexicon.STOPWORDS
    critical: dict[str, str] = {}
    for kind, text in lexicon.CRITICAL_LISTS:
        for w in text.split():
            critical.setdefault(synonyms.get(stem(w), stem(w)), kind)
    return synonyms, stops, critical


def critical_kind(word_stem: str) -> str | None:
    return _tables()[2].get(word_stem)


@lru_cache(maxsize=1)
def _polarity() -> dict[str, int]:
    synonyms = _tables()[0]
    out: dict[str, int] = {}
    for positive, negative in lexicon.POLAR_PAIRS:
        for word, sign in ((positive, 1), (negative, -1)):
            out[word] = sign
            out[synonyms.get(stem(word), stem(word))] = sign
    return out


def polarity(word: str) -> int:
    """+1 for the positive side of a polar pair ("enable", "on"), -1 for the negative side, 0 otherwise."""
    return _polarity().get(word, 0)


def _squash(text: str) -> str:
    return " ".join(text.split()).strip(" .:")


def _payload(text: str) -> tuple[str, list[str]]:
    """Split off quoted spans and every line after the first; return (frame, spans)."""
    spans = [_squash(m.group(0).strip("'\"`“”")) for m in _QUOTED.finditer(text)]
    frame = _QUOTED.sub(" ", text)
    lines = [line for line in frame.splitlines() if line.strip()]
    if len(lines) > 1:
        spans.append(_squash("\n".join(lines[1:])))
        frame = lines[0]
    return frame, [s for s in spans if s]


_SPAN_TEXT = re.compile(r"[^\w\s]+")


def plain_text(text: str) -> str:
    """Lower-cased words only: punctuation and spacing dropped ("Why?" and "why" are one text)."""
    return " ".join(_SPAN_TEXT.sub(" ", text.lower()).split())


def unquote_shared(text: str, other: str) -> str:
    """`text` with the quote marks dropped around each short one-line span ("what does 'yield from' do")
    whose words the `other` prompt has outside quotes ("what does yield from do"): quoting a word is a way
    of writing it, not a different payload. Code fences, long spans and spans the other side quotes too (or
    lacks) are left alone, so the slot veto still compares them."""
    if not any(mark in text for mark in _QUOTE_MARKS) or not _QUOTED.search(text):
        return text
    free = f" {plain_text(_QUOTED.sub(' ', other))} "

    def keep_or_drop(m: re.Match[str]) -> str:
        raw = m.group(0)
        inner = raw.strip("'\"`“”")
        plain = plain_text(inner)
        if raw.startswith("```") or "\n" in inner or not plain or len(plain.split()) > 8 or f" {plain} " not in free:
            return raw
        return inner

    return _QUOTED.sub(keep_or_drop, text)


def tokens(frame: str) -> list[str]:
    """Lower-cased frame text -> tokens with courtesy removed and contractions/aliases expanded."""
    # Each pattern runs only when the character it cannot match without is there (the same result: no
    # replacement adds one), which halves a lookup's text analysis.
    for needs, pattern, repl in _CONTRACTIONS:
        if needs in frame:
            frame = pattern.sub(repl, frame)
    frame = _COURTESY.sub(" ", frame)  # after the contractions: "if it isn't too much to ask"
    if "," in frame:
        frame = _THOUSANDS.sub("", frame)  # 1,250,000 -> 1250000
    if _DIGIT.search(frame):
        frame = _NUMBER_UNIT.sub(r"\1 ", frame)  # 6am -> 6 am, 5km -> 5 km, 2x -> 2 x
    if "-" in frame:
        frame = _HYPHEN.sub(" ", frame)  # one-sentence -> one sentence
        frame = _NUMBER_HYPHEN.sub(r"\1 ", frame)  # 4-line -> 4 line, as "four-line" -> four line
    if any(c in frame for c in "-+*/^=<>"):
        frame = _OPERATOR.sub(r" op\1 ", frame)  # arithmetic operators
    out: list[str] = []
    for tok in _TOKEN.findall(frame):
        out.extend(lexicon.ALIASES.get(tok, tok).split())
    return out


@lru_cache(maxsize=65536)  # a word's answer never changes; the typo scan below costs ~10 µs a word
def _is_stop(tok: str, stops: frozenset[str]) -> bool:
    if tok in stops or stem(tok) in stops:
        return True
    if len(tok) < 3:
        return False
    from rapidfuzz.distance import OSA

    return any(OSA.distance(tok, w, score_cutoff=1) <= 1 for w in lexicon.TYPO_STOPWORDS if abs(len(w) - len(tok)) <= 1)


def _proper(frame: str) -> frozenset[str]:
    """Capitalised words that do not start a sentence ("flights to Los Angeles"), as content stems."""
    synonyms = _tables()[0]
    out = set()
    for m in _PROPER.finditer(frame):
        word = m.group(1).lower()
        if word != "i":
            out.add(synonyms.get(stem(word), stem(word)))
    return frozenset(out)


_IDENT, _NUMBER, _WORD, _STOP = range(4)


@lru_cache(maxsize=65536)  # a token's class never changes; a prompt's tokens are mostly ones seen before
def _classify(tok: str) -> tuple[int, str]:
    """(class, normalised value) of one token: an operator or identifier (itself), a number (its digits), a
    negation (`NEGATION`), a content word (its representative stem) or a stop word."""
    if len(tok) == 3 and tok.startswith("op") and not tok[2].isalpha():  # "op+", not the word "opt"
        return _IDENT, tok
    # "one" is far more often a pronoun ("which one", "a new one") than a count: it stays a word
    if _NUMERIC.match(tok) or (tok in _NUMBER_WORDS and tok != "one"):
        return _NUMBER, tok if _NUMERIC.match(tok) else str(_NUMBER_WORDS[tok])
    if any(c.isdigit() for c in tok) or any(c in tok for c in ".+#/") or tok.startswith("-"):  # --flag
        return _IDENT, tok
    if tok in lexicon.NEGATIONS:
        return _WORD, NEGATION
    synonyms, stops, _ = _tables()
    if _is_stop(tok, stops):
        return _STOP, ""
    s = stem(tok)
    return _WORD, synonyms.get(s, s)


def analyse(text: str) -> Analysis:
    text = unicodedata.normalize("NFKC", text).replace("\u2019", "'")
    proper = _proper(_payload(text)[0])
    text = text.lower()
    frame, spans = _payload(text)
    numbers: list[str] = []
    idents: list[str] = []
    words: list[str] = []
    surface: list[str] = []
    pairs: set[tuple[str, str]] = set()
    markers: dict[str, set[str]] = {}
    toks: list[str] = []
    clause_of: list[int] = []  # clause index of each token
    for number, clause in enumerate(_CLAUSE.split(frame)):
        clause_toks = tokens(clause)
        toks += clause_toks
        clause_of += [number] * len(clause_toks)
    clauses: list[int] = []
    positions: list[int] = []
    content: list[tuple[int, str]] = []  # (position, normalised token) of every non-stop token
    for i, tok in enumerate(toks):
        kind, value = _classify(tok)
        if kind == _IDENT:
            idents.append(value)
        elif kind == _NUMBER:
            numbers.append(value)
        elif kind == _WORD:
            words.append(value)
            surface.append(tok)
            clauses.append(clause_of[i])
            positions.append(i)
            if value != NEGATION and i + 1 < len(toks) and toks[i + 1] in lexicon.PARTICLES:
                pairs.add((value, toks[i + 1]))
        else:
            continue
        content.append((i, value))
    for i, tok in enumerate(toks):
        if tok in lexicon.MARKERS:
            after = [w for pos, w in content if pos > i]
            if after:
                markers.setdefault(tok, set()).update(
                    w for w in (after[0], next((w for w in after if not w.isdigit()), "")) if w)
    return Analysis(quoted=tuple(spans), numbers=tuple(numbers), idents=tuple(idents), words=tuple(words),
                    pairs=frozenset(pairs), markers={k: frozenset(v) for k, v in markers.items()}, proper=proper,
                    surface=tuple(surface), clauses=tuple(clauses), positions=tuple(positions))


# Spelling normalisation of the text the embedding sees. A prompt typed in a hurry ("how do i revrese a lsit
# in pyhton") drifts far from its clean form in MiniLM's space (word pieces of non-words carry little
# meaning), below the similarity gate before the verifier can judge it. Each lower-case word that is not an
# English word (Zipf < `_RARE_ZIPF` in `wordfreq`) is replaced by the nearest common word (Zipf >=
# `_COMMON_ZIPF`, the `_VOCABULARY` most frequent) within optimal string alignment distance 1, or 2 for words
# of five letters or more, that starts with the same letter (or the first two swapped); ties go to the more
# frequent word. Capitalised and mixed-case words (names, "KeyError"), words with digits and words under
# four letters (too many neighbours: "fnd") are left as written. Only the embedding's input changes:
# the verifier compares the texts as written (its word match knows typos), so a wrong correction can lift
# a pair over the similarity gate but cannot make the verifier accept it.
_RARE_ZIPF = 2.0
_COMMON_ZIPF = 3.0
_VOCABULARY = 40_000
_SPELL_WORD = re.compile(r"(?<![\w'.\-/])[a-z]{4,}(?![\w'\-/]|\.\w)")


@lru_cache(maxsize=1)
def _vocabulary() -> dict[tuple[int, str], list[str]]:
    """The common words by (length, first letter): a misspelling keeps its first letter or swaps the first
    two, so a lookup scans one or two of these lists, not every word of the length (~20x less work, which
    bounds what a prompt of made-up words costs the event loop)."""
    from wordfreq import top_n_list, zipf_frequency

    by_start: dict[tuple[int, str], list[str]] = {}
    for word in top_n_list("en", _VOCABULARY):
        if word.isalpha() and word.isascii() and zipf_frequency(word, "en") >= _COMMON_ZIPF:
            by_start.setdefault((len(word), word[0]), []).append(word)
    return by_start


# At most this many words of one text go through the correction's vocabulary scan (~0.15 ms each, on the
# event loop); the rest stay as written. A typed prompt has a few typos; a prompt of 250 made-up words would
# otherwise cost the loop ~40 ms here and as much again in the verifier's language check.
MAX_CORRECTIONS = 16


@lru_cache(maxsize=65536)
def needs_correction(word: str) -> bool:
    """Whether `correct_word` would look `word` up: four letters or more and not an English word."""
    from wordfreq import zipf_frequency

    return len(word) >= 4 and zipf_frequency(word, "en") < _RARE_ZIPF


def corrected(words: Iterable[str], *, budget: int = MAX_CORRECTIONS) -> list[str]:
    """`words` with the first `budget` that need it corrected (`correct_word`), the rest as written."""
    out: list[str] = []
    for word in words:
        if budget > 0 and needs_correction(word):
            budget -= 1
            word = correct_word(word)
        out.append(word)
    return out


@lru_cache(maxsize=65536)
def correct_word(word: str) -> str:
    """The common English word `word` is most likely a misspelling of, or `word` itself."""
    from rapidfuzz.distance import OSA
    from rapidfuzz.process import extract
    from wordfreq import zipf_frequency

    if not needs_correction(word):
        return word
    limit = 2 if len(word) >= 5 else 1
    vocabulary = _vocabulary()
    best: tuple[int, float, str] | None = None
    for length in range(max(4, len(word) - limit), len(word) + limit + 1):
        # a misspelling keeps its first letter, or swaps the first two
        choices = vocabulary.get((length, word[0]), []) + [
            w for w in vocabulary.get((length, word[1]), []) if w[1] == word[0]]
        for choice, distance, _ in extract(word, choices, scorer=OSA.distance, score_cutoff=limit, limit=None):
            key = (int(distance), -zipf_frequency(choice, "en"), choice)
            if best is None or key < best:
                best = key
    return word if best is None else best[2]


def embedding_text(text: str) -> str:
    """`text` with its lower-case misspellings corrected (`correct_word`, the first `MAX_CORRECTIONS`):
    what the embedding sees."""
    spans = [m.span() for m in _SPELL_WORD.finditer(text)]
    if not spans:
        return text
    fixed = corrected(text[a:b] for a, b in spans)
    out, last = [], 0
    for (a, b), word in zip(spans, fixed, strict=True):
        out += [text[last:a], word]
        last = b
    return "".join(out) + text[last:]
