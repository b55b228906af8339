"""The near-miss verifier: may the answer cached for prompt `a` be served for prompt `b`?

Cosine similarity cannot tell "enable 2FA" from "disable 2FA" (0.88 on MiniLM, above many true
paraphrases), so a semantic candidate must also pass, on the two last user messages
(`fleetgate.cache.textnorm.analyse` gives spans, numbers, identifiers, content stems, clauses, markers):

1. the structural vetoes of `fleetgate.cache.pairfeatures.veto` (`slot`, `number`, `identifier`,
   `language`, `negation`, `order`, a critical modifier swapped): differences that change the answer
   whatever the wording around them;
2. the word match (`fleetgate.cache.wordmatch.match`: exact stems, typos of non-words, acronyms): when
   every word matched, in order or with one clause moved (`wordmatch.full_match`), the two prompts ask
   the same thing in other function words, and the pair passes;
3. otherwise the learned pair model (`fleetgate.cache.pairmodel`) scores the difference (its size, what it
   is made of, where it sits, the embedding similarity, surface similarity, the token alignment of
   `fleetgate.cache.tokenalign`, MiniLM's contextual token states, and the residual head of
   `fleetgate.cache.asymmetry`, what those states say about the words one side adds) and the pair passes when the
   probability is >= the model's cross-validated threshold (or `min_confidence` when set).
`precheck` runs stages 1-2 (cheap, on the event loop); `alignment` + `judge` run stage 3 (the cache runs it
in a worker thread, for the few candidates that get there). Its token states come with the cache's own
embedding pass of each text when the embedder is the int8 ONNX one (`tokenalign.TokenStates.share`); a text
embedded in another spelling, or with another embedder, costs an encoder pass of its own. Before any of
that the cache asks `judge_without_alignment`, which settles the pair when no token-state feature in its
range could change the verdict, so the states are computed only for the pairs they can decide. Since issue
30 that is most near misses (the residual head's score is clipped to [-1.5, 1.0], and a clear near miss stays
one at its best score: all of `bench gateway`'s varied misses), while a pair the model may accept needs its
states, to show that neither side asks for something the other does not (`fleetgate.cache.asymmetry`).

A rejection by the model is reported by what the difference holds, for the rejection metric: `entity` for
a swapped modifier of a shared word ("overnight" / "standard delivery"), the first critical kind among the
unmatched words (`format`, `language`, ...), `entity` for a capitalised name,
`constraint` for words added on one side only, `entity` for one word against one word, else `rewrite`.

`verify` is symmetric in `a` and `b` up to floating point. Cost: two analyses (cached per text, so a stored
entry is analysed once) and, for a pair that reaches the model, the token states of texts not seen before
(grouped into words from the embedding pass's states in the cache; one MiniLM encoder pass each, a few ms,
for a text no embedding pass gave, as in `verify` alone; a stored entry's are kept) and a 40-term dot
product.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from fleetgate.cache.asymmetry import SCORE_RANGE, STATE_FEATURES, STATE_NEUTRAL, residual_inputs, state_features
from fleetgate.cache.pairfeatures import features, slot_veto, swapped_modifiers, swapped_surfaces, veto
from fleetgate.cache.pairmodel import PairModel, load_model
from fleetgate.cache.textnorm import Analysis, analyse, critical_kind, embedding_text, plain_text, unquote_shared
from fleetgate.cache.tokenalign import TokenStates
from fleetgate.cache.wordmatch import WordMatch, full_match, match

_analysis = lru_cache(maxsize=16384)(analyse)  # stored entries are compared again and again


def analyse_pair(text_a: str, text_b: str) -> tuple[Analysis, Analysis]:
    """The two prompts' analyses, after dropping the quote marks around a span the other side writes
    unquoted (`textnorm.unquote_shared`)."""
    return _analysis(unquote_shared(text_a, text_b)), _analysis(unquote_shared(text_b, text_a))


@dataclass(frozen=True, slots=True)
class Verdict:
    ok: bool
    reason: str = ""
    confidence: float | None = None  # the pair model's probability, when it was asked


def _why(a: Analysis, b: Analysis, m: WordMatch) -> str:
    if swapped_modifiers(a, b, match=m):
        return "entity"  # "overnight delivery" / "standard delivery": another kind of the same thing
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


@dataclass(frozen=True, slots=True)
class Pending:
    """A pair that passed the vetoes with words left over: the pair model decides (`judge`)."""

    a: Analysis
    b: Analysis
    match: WordMatch
    text_a: str
    text_b: str


def _empty(x: Analysis) -> bool:
    return not (x.words or x.numbers or x.idents or x.quoted)


def precheck(text_a: str, text_b: str) -> Verdict | Pending:
    """The cheap stages (vetoes, word match): a `Verdict`, or `Pending` when the pair model must decide."""
    a, b = analyse_pair(text_a, text_b)
    reason = slot_veto(a, b)  # the same verdict `veto` would give first, without the word match
    if reason:
        return Verdict(False, reason)
    if _empty(a) and _empty(b) and plain_text(text_a) != plain_text(text_b):
        # Nothing but function words on either side ("Why?" / "How?", "What is it?" / "How do I do that?"):
        # the word match would call that a full match with nothing to compare, and a follow-up in one
        # conversation would be served another follow-up's answer. Only the same words pass.
        return Verdict(False, "empty")
    m = match(a, b)
    reason = veto(a, b, match=m)
    if reason:
        return Verdict(False, reason)
    if full_match(a, b, m):
        return Verdict(True)
    return Pending(a=a, b=b, match=m, text_a=text_a, text_b=text_b)


def judge(pending: Pending, *, similarity: float, align: Sequence[float], conversation: bool = False,
           model: PairModel | None = None, min_confidence: float | None = None) -> Verdict:
    """The pair model's verdict; `align`: `alignment` of the two texts (`asymmetry.STATE_FEATURES`)."""
    model = model or load_model()
    p = model.probability(features(pending.a, pending.b, similarity=similarity, match=pending.match,
                                   text_a=pending.text_a, text_b=pending.text_b, conversation=conversation,
                                   align=align))
    bar = model.threshold if min_confidence is None else min_confidence
    return Verdict(True, confidence=p) if p >= bar else Verdict(False, _why(pending.a, pending.b, pending.match),
                                                                confidence=p)


# What the token-state features can be: cosines of unit vectors, a share (`tokenalign.ALIGN_FEATURES`), and
# the residual head's clipped score (`asymmetry.SCORE_RANGE`)
_ALIGN_RANGE = {name: ((0.0, 1.0) if name == "align_unaligned" else SCORE_RANGE if name == "align_residual"
                       else (-1.0, 1.0)) for name in STATE_FEATURES}


def judge_without_alignment(pending: Pending, *, similarity: float, conversation: bool = False,
                            model: PairModel | None = None, min_confidence: float | None = None) -> Verdict | None:
    """`judge`'s verdict when no token alignment could change it, else None (the token states are needed).

    Every other input is known; each alignment feature is bounded (`_ALIGN_RANGE`; `align_swap` is exactly
    1.0 when no modifier is swapped), and the model is linear in them, so the least and greatest probability
    over those ranges (`PairModel.probability_bounds`) decide the pair when both fall on one side of the
    bar. The residual head's score (`align_residual`) is clipped to `asymmetry.SCORE_RANGE`, so its weight widens
    the band of pairs left undecided: those need the token states. That saves the token states' encoder
    pass for the candidate texts no embedding handed over."""
    model = model or load_model()
    known = {} if swapped_surfaces(pending.a, pending.b, match=pending.match) else {"align_swap": 1.0}
    low = [known.get(name, _ALIGN_RANGE[name][0]) for name in STATE_FEATURES]
    high = [known.get(name, _ALIGN_RANGE[name][1]) for name in STATE_FEATURES]
    base = features(pending.a, pending.b, similarity=similarity, match=pending.match, text_a=pending.text_a,
                    text_b=pending.text_b, conversation=conversation, align=STATE_NEUTRAL)
    fixed = base[: len(base) - len(STATE_FEATURES)]
    p_low, p_high = model.probability_bounds([*fixed, *low], [*fixed, *high])
    bar = model.threshold if min_confidence is None else min_confidence
    if p_low >= bar:
        return Verdict(True, confidence=p_low)
    if p_high < bar:
        return Verdict(False, _why(pending.a, pending.b, pending.match), confidence=p_high)
    return None


def alignment(pending: Pending, states: TokenStates, *, model: PairModel | None = None) -> tuple[float, ...]:
    """The token-state features of a pending pair (`asymmetry.STATE_FEATURES`: the token alignment and the
    model's residual head; blocking, run it off the event loop: an encoder pass per text whose states neither
    the embedding pass handed over nor an earlier alignment kept)."""
    return state_features(states.words(pending.text_a), states.words(pending.text_b),
                          swapped_surfaces(pending.a, pending.b, match=pending.match),
                          head=(model or load_model()).head)


def pair_alignment(text_a: str, text_b: str, states: TokenStates) -> tuple[tuple[float, ...], np.ndarray]:
    """Training and cross-validation: the token alignment of two prompts from their texts (`STATE_FEATURES`
    with a residual score of 0) and the residual head's inputs (`asymmetry.residual_inputs`), which the fit
    turns into the score."""
    a, b = analyse_pair(text_a, text_b)
    words_a, words_b = states.words(text_a), states.words(text_b)
    return (state_features(words_a, words_b, swapped_surfaces(a, b, match=match(a, b))),
            residual_inputs(words_a, words_b))


@lru_cache(maxsize=4)
def default_states(model_dir: Path | None = None) -> TokenStates:
    """One `TokenStates` per model folder and process (a cache shares it with its int8 ONNX embedder; otherwise
    its own ONNX session loads on first use)."""
    return TokenStates(model_dir=model_dir)


def warm_up(*, states: TokenStates | None) -> None:
    """Load what the first verification would otherwise load on a request's time (stemmer, rapidfuzz, the
    word frequency lists, the token-state session when `states` is given): about three seconds."""
    a, b = "How do I warm up the verifier?", "Comment préchauffer le vérificateur, s'il vous plaît ?"
    embedding_text("how do i wram up teh verifer")  # the spelling vocabulary
    step = precheck(a, b)
    if isinstance(step, Pending):
        use = states is not None and load_model().uses_alignment
        judge(step, similarity=0.9, align=alignment(step, states) if use and states is not None else STATE_NEUTRAL)


def verify(a: str, b: str, *, similarity: float, conversation: bool = False, min_confidence: float | None = None,
           model: PairModel | None = None, states: TokenStates | None = None) -> Verdict:
    """Whether an answer cached for prompt `a` may be served for prompt `b`; `conversation`: both follow the
    same earlier user turns (the cache's partition guarantees the history is identical). Blocking when the
    pair model is asked (token states); the cache runs that part in a worker thread."""
    step = precheck(a, b)
    if isinstance(step, Verdict):
        return step
    model = model or load_model()
    align = alignment(step, states or default_states(), model=model) if model.uses_alignment else STATE_NEUTRAL
    return judge(step, similarity=similarity, align=align, conversation=conversation, model=model,
                 min_confidence=min_confidence)
