"""The near-miss verifier: may the cached answer to prompt `a` be served for prompt `b`?

Cosine similarity cannot tell "enable 2FA" from "disable 2FA" (0.88 on MiniLM, above many true
paraphrases), so every semantic candidate must also pass these lexical checks on the two last user
messages (`fleetgate.cache.textnorm.analyse` gives quoted spans, numbers, identifiers and content stems):

1. `slot`: quoted strings, code and pasted payloads (lines after the first) are identical, in order.
2. `number`: the multisets of numbers are equal (digits and number words; units are content words).
3. `identifier`: the sets of identifiers (x200, ec2, node.js, c++) are equal.
4. `content`: every content stem of each side is matched on the other side, exactly or as a typo
   (optimal-string-alignment distance 1 for stems of >= 4 characters, 2 for >= 8; never for negation
   words). An unmatched negation word ("not", "no", "without", ...) is reported as `negation`. Anything
   else unmatched is a substitution or an added/removed constraint (entity, format, language, scope,
   version, ...) and rejects: precision first; paraphrases that merely restructure keep their stems.
5. `order`: for each relational marker ("than", "from", "to", "into", "over", "vs", "of", "per"), the
   content word that follows it must be the same on both sides when both sides use the marker (catches
   "X better than Y" vs "Y better than X", "A to B" vs "B to A").

A check reports the first failing rule as the reason (used by metrics and by `fleetgate cache-eval`).
Parameters: the typo distances above and the lexicons in `textnorm`; `min_overlap` (default 0.5) rejects
pairs where fewer than half of the content stems are shared even when all differences were typos.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from fleetgate.cache.textnorm import Analysis, analyse

NEGATIONS = frozenset({"not", "no", "never", "without", "none", "noth", "neither", "nor", "except", "exclud"})
MARKERS = ("than", "from", "to", "into", "over", "vs", "versus", "of", "per")


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str = ""


def _typo(a: str, b: str) -> bool:
    from rapidfuzz.distance import OSA

    shortest = min(len(a), len(b))
    if shortest < 4 or a in NEGATIONS or b in NEGATIONS:
        return False
    limit = 2 if shortest >= 8 else 1
    return bool(OSA.distance(a, b, score_cutoff=limit) <= limit)


def _unmatched(left: tuple[str, ...], right: tuple[str, ...]) -> list[str]:
    pool = Counter(right)
    out: list[str] = []
    for word in left:
        if pool[word] > 0:
            pool[word] -= 1
            continue
        match = next((w for w in pool if pool[w] > 0 and _typo(word, w)), None)
        if match is None:
            out.append(word)
        else:
            pool[match] -= 1
    return out


def _marker_args(text: str) -> dict[str, str]:
    """marker -> first content word after it (from the raw lower-cased text)."""
    from fleetgate.cache.textnorm import STOPWORDS, stem

    tokens = text.lower().replace("?", " ").replace(",", " ").replace(".", " ").split()
    out: dict[str, str] = {}
    for i, tok in enumerate(tokens):
        if tok in MARKERS and tok not in out:
            following = [t for t in tokens[i + 1 :] if t not in STOPWORDS]
            if following:
                out[tok] = stem(following[0])
    return out


def compare(a: Analysis, b: Analysis) -> Verdict:
    if a.quoted != b.quoted:
        return Verdict(False, "slot")
    if sorted(a.numbers) != sorted(b.numbers):
        return Verdict(False, "number")
    if set(a.idents) != set(b.idents):
        return Verdict(False, "identifier")
    left, right = _unmatched(a.words, b.words), _unmatched(b.words, a.words)
    if any(w in NEGATIONS for w in (*left, *right)):
        return Verdict(False, "negation")
    if left or right:
        return Verdict(False, "content")
    return Verdict(True)


def verify(a: str, b: str) -> Verdict:
    """Whether an answer cached for prompt `a` may be served for prompt `b` (symmetric)."""
    verdict = compare(analyse(a), analyse(b))
    if not verdict.ok:
        return verdict
    args_a, args_b = _marker_args(a), _marker_args(b)
    for marker in args_a.keys() & args_b.keys():
        if args_a[marker] != args_b[marker]:
            return Verdict(False, "order")
    return verdict
