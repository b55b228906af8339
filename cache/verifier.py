"""The near-miss verifier: may the answer cached for prompt `a` be served for prompt `b`?

Cosine similarity cannot tell "enable 2FA" from "disable 2FA" (0.88 on MiniLM, above many true
paraphrases), so a semantic candidate must also pass these rules on the two last user messages, in order
(`fleetgate.cache.textnorm.analyse` gives spans, numbers, identifiers, content stems, particles, markers):

1. `slot`: quoted strings, code and pasted payloads (lines after the first) are identical, in order.
2. `number`: the same numbers in the same order ("port 8080 on host port 80" is not the swap).
3. `identifier`: the same identifiers and arithmetic operators (x200, ec2, c++, `+` vs `-`).
4. `negation`: the same verb particles ("turn on" vs "turn off").
5. `order`: for a marker both prompts use ("than", "to", "from", "over", "of", "in"), the arguments
   after it are not swapped ("X better than Y" vs "Y better than X", "A to B" vs "B to A").
6. content stems: each side's stems are matched on the other side, exactly or as a typo (optimal string
   alignment distance 1 for stems of >= 4 characters, 2 for >= 8, but never between two known critical
   words; or one a prefix of the other within 4 characters, 2 for critical words, never a comparative
   "-er"/"-est" suffix). For the unmatched stems ("the difference"):
   - a negation or a `CRITICAL` word (polar opposite, format, natural or programming language, unit, date,
     scope, comparative, constraint) rejects, reported by its kind;
   - a capitalised word inside a sentence (a name, place or product) rejects (`entity`);
   - no difference accepts;
   - words on one side only reject (`constraint`: an added requirement or detail);
   - one word against one word rejects (`entity`: a substitution, "laptop" vs "mattress");
   - a larger rewrite (both sides differ, at least three words in all) is accepted only when the
     embedding similarity is >= `rewrite_min` (default 0.86): a paraphrase rather than a near miss.

Parameters: `rewrite_min`, the typo distances above, the word lists in `fleetgate.cache.lexicon`.
`verify` is symmetric in `a` and `b`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from fleetgate.cache.textnorm import NEGATION, Analysis, analyse, critical_kind

REWRITE_MIN = 0.86


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str = ""


def _typo(a: str, b: str) -> bool:
    from rapidfuzz.distance import OSA

    short, long_ = sorted((a, b), key=len)
    if len(short) < 4 or NEGATION in (a, b):
        return False
    critical = bool(critical_kind(a)) + bool(critical_kind(b))
    if long_.startswith(short):  # inflections the stemmer missed: "summar"/"summari", "declin"/"declind"
        suffix = long_[len(short) :]
        return suffix not in ("er", "r", "est", "st") and len(suffix) <= (2 if critical else 4)
    if critical == 2:  # two different known words ("larger" / "large") are never a typo of each other
        return False
    limit = 2 if len(short) >= 8 else 1
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


def _particle_flip(a: Analysis, b: Analysis) -> bool:
    both = a.pairs | b.pairs
    return any(v == verb and p != particle for verb, particle in a.pairs ^ b.pairs for v, p in both)


def _swapped(a: Analysis, b: Analysis) -> bool:
    content_a = set(a.words) | set(a.numbers) | set(a.idents)
    content_b = set(b.words) | set(b.numbers) | set(b.idents)
    for marker in a.markers.keys() & b.markers.keys():
        for arg_a, arg_b in zip(a.markers[marker], b.markers[marker], strict=True):
            if arg_a and arg_b and arg_a != arg_b and arg_a in content_b and arg_b in content_a:
                return True
    return False


def compare(a: Analysis, b: Analysis, *, similarity: float, rewrite_min: float = REWRITE_MIN) -> Verdict:
    if a.quoted != b.quoted:
        return Verdict(False, "slot")
    if a.numbers != b.numbers:
        return Verdict(False, "number")
    if set(a.idents) != set(b.idents):
        return Verdict(False, "identifier")
    if _particle_flip(a, b):
        return Verdict(False, "negation")
    if _swapped(a, b):
        return Verdict(False, "order")
    left, right = _unmatched(a.words, b.words), _unmatched(b.words, a.words)
    diff = [*left, *right]
    if NEGATION in diff:
        return Verdict(False, "negation")
    kinds = [k for k in map(critical_kind, diff) if k]
    if kinds:
        return Verdict(False, kinds[0])
    if any(w in a.proper or w in b.proper for w in diff):
        return Verdict(False, "entity")
    if not diff:
        return Verdict(True)
    if not left or not right:
        return Verdict(False, "constraint")
    if len(left) == 1 and len(right) == 1:
        return Verdict(False, "entity")
    if similarity < rewrite_min:
        return Verdict(False, "rewrite")
    return Verdict(True)


def verify(a: str, b: str, *, similarity: float, rewrite_min: float = REWRITE_MIN) -> Verdict:
    """Whether an answer cached for prompt `a` may be served for prompt `b` (symmetric)."""
    return compare(analyse(a), analyse(b), similarity=similarity, rewrite_min=rewrite_min)
