"""The near-miss verifier: may the answer cached for prompt `a` be served for prompt `b`?

Cosine similarity cannot tell "enable 2FA" from "disable 2FA" (0.88 on MiniLM, above many true
paraphrases), so a semantic candidate must also pass, on the two last user messages
(`fleetgate.cache.textnorm.analyse` gives spans, numbers, identifiers, content stems, clauses, markers):

1. the structural vetoes of `fleetgate.cache.pairfeatures.veto` (`slot`, `number`, `identifier`,
   `negation`, `order`): differences that change the answer whatever the wording around them;
2. the word match (`fleetgate.cache.wordmatch.match`: exact stems, typos of non-words, acronyms): when
   nothing is left over the two prompts ask the same thing in other function words, and the pair passes;
3. otherwise the learned pair model (`fleetgate.cache.pairmodel`) scores the difference (its size, what it
   is made of, where it sits, the embedding similarity, surface similarity) and the pair passes when the
   probability is >= the model's cross-validated threshold (or `min_confidence` when set).

A rejection by the model is reported by what the difference holds, for the rejection metric: the first
critical kind among the unmatched words (`format`, `language`, ...), `entity` for a capitalised name,
`constraint` for words added on one side only, `entity` for one word against one word, else `rewrite`.

`verify` is symmetric in `a` and `b` up to floating point. Cost: two analyses (cached per text, so a stored
entry is analysed once) and a 31-term dot product: about 0.03 ms per candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

from fleetgate.cache.pairfeatures import features, veto
from fleetgate.cache.pairmodel import PairModel, load_model
from fleetgate.cache.textnorm import Analysis, analyse, critical_kind
from fleetgate.cache.wordmatch import WordMatch, match

_analysis = lru_cache(maxsize=16384)(analyse)  # stored entries are compared again and again


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str = ""
    confidence: float | None = None  # the pair model's probability, when it was asked


def _why(a: Analysis, b: Analysis, m: WordMatch) -> str:
    diff = [a.words[i] for i in m.left] + [b.words[j] for j in m.right]
    kind = next((k for k in map(critical_kind, diff) if k), None)
    if kind:
        return kind
    if any(w in a.proper or w in b.proper for w in diff):
        return "entity"
    if not m.left or not m.right:
        return "constraint"
    if len(m.left) == 1 and len(m.right) == 1:
        return "entity"  # one word swapped for another: "laptop" / "mattress", "heavier" / "lighter"
    return "rewrite"


def compare(a: Analysis, b: Analysis, *, similarity: float, text_a: str, text_b: str, conversation: bool = False,
            model: PairModel | None = None, min_confidence: float | None = None) -> Verdict:
    m = match(a, b)
    reason = veto(a, b, match=m)
    if reason:
        return Verdict(False, reason)
    if not m.left and not m.right:
        return Verdict(True)
    model = model or load_model()
    p = model.probability(features(a, b, similarity=similarity, match=m, text_a=text_a, text_b=text_b,
                                   conversation=conversation))
    bar = model.threshold if min_confidence is None else min_confidence
    return Verdict(True, confidence=p) if p >= bar else Verdict(False, _why(a, b, m), confidence=p)


def warm_up() -> None:
    """Load what the first verification would otherwise load on a request's time (stemmer, rapidfuzz, the
    word frequency lists): about three seconds."""
    verify("How do I warm up the verifier?", "Comment préchauffer le vérificateur, s'il vous plaît ?", similarity=0.9)


def verify(a: str, b: str, *, similarity: float, conversation: bool = False, min_confidence: float | None = None,
           model: PairModel | None = None) -> Verdict:
    """Whether an answer cached for prompt `a` may be served for prompt `b`; `conversation`: both follow the
    same earlier user turns (the cache's partition guarantees the history is identical)."""
    return compare(_analysis(a), _analysis(b), similarity=similarity, text_a=a, text_b=b, conversation=conversation,
                   model=model, min_confidence=min_confidence)
