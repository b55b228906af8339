"""The baseline the learned scorer must beat: a length-plus-keyword rule, tuned on the same training data.

Rule: a prompt goes to the large tier when it has at least `min_words` words or contains one of `keywords`
(whole words or phrases, case-insensitive). Candidates are the words and phrases of the structural lexicon's
"hard work" groups (code, math, steps, why/how, constraints, analysis). Tuning, on labelled prompts:
1. each candidate's precision on the tuning rows = share of `large` among the rows that contain it;
   candidates seen in fewer than `min_support` rows are dropped (their precision is noise);
2. for each precision floor p in `PRECISION_FLOORS`, the keywords with precision >= p are kept, and
   `min_words` is the largest length at which the rule still reaches the target recall of `large`;
3. the (p, min_words) pair that sends the fewest prompts to the large tier wins (ties: the longer list).
This is how a person tunes such a rule by hand (keep the telling words, pick the length cut), done
exhaustively, so the comparison in `fleetgate tier eval` is with a rule at its best on the training data.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fleetgate.router.tiers.data import LabelledPrompt
from fleetgate.router.tiers.features import lexicon_terms

KEYWORD_GROUPS: tuple[str, ...] = ("code", "math", "steps", "why_how", "constraints", "analysis")
PRECISION_FLOORS: tuple[float, ...] = (0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
_TOKEN = re.compile(r"[a-z0-9_']+")


def _terms_in(text: str, candidates: frozenset[str], phrases: tuple[str, ...]) -> set[str]:
    lower = text.lower()
    found = {tok for tok in _TOKEN.findall(lower) if tok in candidates}
    found.update(p for p in phrases if p in lower)
    return found


@dataclass(frozen=True, slots=True)
class KeywordRule:
    min_words: int
    keywords: tuple[str, ...]

    def predict(self, texts: Sequence[str]) -> np.ndarray:
        """1.0 for prompts the rule sends to the large tier, else 0.0."""
        words = frozenset(k for k in self.keywords if " " not in k and "-" not in k)
        phrases = tuple(k for k in self.keywords if k not in words)
        return np.asarray(
            [float(len(t.split()) >= self.min_words or bool(_terms_in(t, words, phrases))) for t in texts]
        )


def fit_keyword_rule(
    rows: Sequence[LabelledPrompt], *, target_recall: float, min_support: int = 3,
) -> KeywordRule:
    """The rule with the fewest large-tier calls whose recall of `large` on `rows` is >= `target_recall`."""
    candidates = lexicon_terms(KEYWORD_GROUPS)
    words = frozenset(k for k in candidates if " " not in k and "-" not in k)
    phrases = tuple(k for k in candidates if k not in words)
    found = [_terms_in(r.text, words, phrases) for r in rows]
    y = np.asarray([r.large for r in rows], dtype=bool)
    lengths = np.asarray([len(r.text.split()) for r in rows])
    precision: dict[str, float] = {}
    for term in candidates:
        hits = np.asarray([term in f for f in found])
        if hits.sum() >= min_support:
            precision[term] = float(y[hits].mean())
    best: tuple[float, int, KeywordRule] | None = None
    for floor in PRECISION_FLOORS:
        kept = tuple(sorted(t for t, p in precision.items() if p >= floor))
        by_keyword = np.asarray([bool(f.intersection(kept)) for f in found])
        for min_words in sorted(set(lengths.tolist()) | {int(lengths.max()) + 1}, reverse=True):
            routed = by_keyword | (lengths >= min_words)
            if routed[y].mean() >= target_recall:
                share = float(routed.mean())
                if best is None or (share, -len(kept)) < (best[0], -best[1]):
                    best = (share, len(kept), KeywordRule(min_words=min_words, keywords=kept))
                break
    if best is None:  # unreachable: min_words = 1 sends everything to the large tier
        raise ValueError("no keyword rule reaches the target recall")
    return best[2]
