"""Matching the content words of two prompts: what is left over is "the difference".

`match(a, b)` pairs the content stems of two `Analysis` objects, in three passes, and returns the indices
left unmatched on each side plus how many pairs needed a typo or an acronym:

1. exact: equal stems (a multiset match);
2. typo: a stem whose stem or surface form is within optimal string alignment distance 1 of the other's
   (2 when the shorter is >= 5 characters), where at least one of the two is not a known English word, or
   an inflection the stemmer missed (one a prefix of the other within 4 characters). Never for words under
   4 characters (acronyms: "FSA"/"HSA"), a prefix added in front ("mount"/"unmount"), or a capitalised
   name inside a sentence ("Niger"/"Nigeria"). Two *known* words
   (Zipf frequency >= `KNOWN_ZIPF` in `wordfreq`'s English list, e.g. "Austria"/"Australia",
   "Slovakia"/"Slovenia", "formal"/"normal") are different words, never a typo of each other; so are two
   words of the verifier's critical lists ("larger"/"large");
3. acronym: a 2-5 letter token on one side spelled by the initials of consecutive unmatched words on the
   other ("ETF" / "exchange-traded fund", "LCM" / "least common multiple").

Word frequencies come from `wordfreq` (a maintained, offline word-frequency list): they separate real
words from misspellings without a hand-written dictionary, and tell generic words (high frequency) from
specific ones for the pair model's features.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache

from fleetgate.cache.textnorm import NEGATION, Analysis, critical_kind

KNOWN_ZIPF = 3.0  # at or above: a real English word (typos of common words sit below, "langauge" 1.7)


@lru_cache(maxsize=65536)
def zipf(word: str) -> float:
    """Zipf frequency of an English word (0 for unknown strings, about 7 for "the")."""
    from wordfreq import zipf_frequency

    return float(zipf_frequency(word, "en"))


@dataclass(frozen=True, slots=True)
class WordMatch:
    left: tuple[int, ...]  # indices into a.words left unmatched
    right: tuple[int, ...]  # indices into b.words left unmatched
    typos: int
    acronyms: int
    pairs: tuple[tuple[int, int], ...] = ()  # (i, j): a.words[i] matched b.words[j] exactly or as a typo

    @property
    def inversions(self) -> int:
        """Matched pairs whose order differs between the two sides ("X faster than Y" / "Y faster than X",
        or a clause moved to the front): a full match in another order is not proof of the same question."""
        js = [j for _, j in sorted(self.pairs)]
        return sum(1 for x in range(len(js)) for y in range(x + 1, len(js)) if js[x] > js[y])


def _moved_clause(a: Analysis, b: Analysis, pairs: list[tuple[int, int]]) -> bool:
    """The matched words keep their order, or one whole clause moved to the other end: an increasing run of
    at least three words cut in two where a clause ends on one side ("In Rust, how do I read a file?" /
    "How do I read a file in Rust?"). Two words swapped, a deeper shuffle ("Go faster than Java" / "Java
    faster than Go") or a move inside one clause ("How many euros is 250 Swiss francs?" / "How many Swiss
    francs is 250 euros?") is not a moved clause."""
    js = [j for _, j in pairs]
    cut = next((k for k in range(1, len(js)) if js[k] < js[k - 1]), None)
    if cut is None:
        return True
    if len(js) < 3 or js[cut:] + js[:cut] != sorted(js):
        return False
    i_before, i_after = pairs[cut - 1][0], pairs[cut][0]
    j_last, j_first = js[-1], js[0]  # on b's side, the block that comes first ends at j_last
    return bool(a.clauses and b.clauses) and (a.clauses[i_before] != a.clauses[i_after]
                                               or b.clauses[j_last] != b.clauses[j_first])


def full_match(a: Analysis, b: Analysis, m: WordMatch) -> bool:
    """Every word matched, the two prompts ask the same thing in other function words, and no model is needed:
    nothing left over, no acronym, every typo pair has a known English word on one side ("renmae" /
    "rename"; two rare strings a letter apart, "sshd" / "sssd", may be two names), and the words keep their
    order or one clause moved whole (`_moved_clause`). Anything else goes to the pair model."""
    if m.left or m.right or m.acronyms:
        return False
    for i, j in m.pairs:
        if a.words[i] != b.words[j] and max(zipf(_surface(a, i)), zipf(_surface(b, j))) < KNOWN_ZIPF:
            return False
    return _moved_clause(a, b, sorted(m.pairs))


def _surface(x: Analysis, i: int) -> str:
    return x.surface[i] if i < len(x.surface) else x.words[i]


def _distance(a: str, b: str, limit: int) -> int:
    from rapidfuzz.distance import OSA

    return int(OSA.distance(a, b, score_cutoff=limit))


def is_typo(stem_a: str, stem_b: str, surface_a: str, surface_b: str) -> bool:
    """Whether two different words are one word misspelt (see the module docstring)."""
    if NEGATION in (stem_a, stem_b):
        return False
    short, long_ = sorted((stem_a, stem_b), key=len)
    if len(short) < 4 or long_.endswith(short):  # short words and acronyms match exactly; "un"+"mount"
        return False
    short_surface, long_surface = sorted((surface_a, surface_b), key=len)
    if long_surface.endswith(short_surface):  # "archive"/"unarchive" (stems "archiv"/"unarch")
        return False
    critical = bool(critical_kind(stem_a)) + bool(critical_kind(stem_b))
    if long_.startswith(short) and len(short) >= 4:  # inflections the stemmer missed: "summar"/"summari"
        suffix = long_[len(short):]
        return suffix not in ("er", "r", "est", "st") and len(suffix) <= (2 if critical else 4)
    if critical == 2:
        return False
    known_a, known_b = zipf(surface_a) >= KNOWN_ZIPF, zipf(surface_b) >= KNOWN_ZIPF
    if known_a and known_b:
        return False
    shortest = min(len(surface_a), len(surface_b), len(short))
    limit = 2 if shortest >= 5 else 1  # one of the two is not a word: a misspelling may be two edits away
    return min(_distance(stem_a, stem_b, limit), _distance(surface_a, surface_b, limit)) <= limit


def _acronyms(short: Analysis, free_short: list[int], long_: Analysis, free_long: list[int]) -> int:
    """Match acronyms in `short`'s free words against runs of initials in `long_`'s; mutates the lists."""
    found = 0
    for i in list(free_short):
        token = short.surface[i] if i < len(short.surface) else short.words[i]
        if not (2 <= len(token) <= 5 and token.isalpha()):
            continue
        initials = [(j, (long_.surface[j] if j < len(long_.surface) else long_.words[j])[:1]) for j in free_long]
        for start in range(len(initials) - len(token) + 1):
            run = initials[start : start + len(token)]
            if "".join(c for _, c in run) == token:
                free_short.remove(i)
                for j, _ in run:
                    free_long.remove(j)
                found += 1
                break
    return found


def match(a: Analysis, b: Analysis) -> WordMatch:
    names = a.proper | b.proper  # a capitalised name matches only exactly: "Niger" is not "Nigeria"
    pool: dict[str, list[int]] = defaultdict(list)
    for j, w in enumerate(b.words):
        pool[w].append(j)
    free_a: list[int] = []
    pairs: list[tuple[int, int]] = []
    for i, w in enumerate(a.words):
        # names do not inflect: "Alien" / "Aliens" (one stem) are two films
        same = [j for j in pool[w] if w not in names or _surface(a, i) == _surface(b, j)]
        if same:
            pool[w].remove(same[0])
            pairs.append((i, same[0]))
        else:
            free_a.append(i)
    free_b = sorted(j for js in pool.values() for j in js)
    typos = 0
    for i in list(free_a):
        if a.words[i] in names:
            continue
        sa = a.surface[i] if i < len(a.surface) else a.words[i]
        for j in (j for j in free_b if b.words[j] not in names):
            sb = b.surface[j] if j < len(b.surface) else b.words[j]
            if is_typo(a.words[i], b.words[j], sa, sb):
                pairs.append((i, j))
                free_a.remove(i)
                free_b.remove(j)
                typos += 1
                break
    acronyms = _acronyms(a, free_a, b, free_b) + _acronyms(b, free_b, a, free_a)
    return WordMatch(left=tuple(free_a), right=tuple(free_b), typos=typos, acronyms=acronyms, pairs=tuple(pairs))
