"""Prompt features for the tier scorer: cheap structural signals plus the MiniLM sentence embedding.

Inputs: the prompt text (the gateway passes the conversation's user-visible text) and, optionally, its
384-dimensional MiniLM embedding. Output: one float vector, `[structural..., embedding...]`.

Structural signals (computed in one tokenising pass plus a few cheap regexes over at most `MAX_CHARS`
characters, so the cost is bounded; each is a count or a share, log-damped where counts grow with length):
- `log_words`: log(1 + words). Length is weak evidence on its own (short puzzles need the strong tier,
  long texts to proofread do not), so it is one input among many, never a rule.
- `code`: code fences, braces, semicolons, calls `f(`, `def`/`return`/`import`/`lambda`, stack traces.
- `math`: numbers, arithmetic operators, and words such as prove, integral, probability, equation.
- `steps`: multi-step instructions: "step by step", "first ... then", enumerations, sentence count.
- `why_how`: reasoning question words (why, how, explain); `what_who`: factual question words.
- `constraints`: requirement words (must, without, at least, no more than, exactly, trade-off, budget).
- `analysis`: verbs that ask for open work (design, analyze, compare, implement, optimize, debug, plan).
- `simple_task`: verbs of short transformations (translate, classify, extract, summarize, rewrite, fix
  grammar, format, define).
- `quoted_share`: share of characters inside quotes or after a colon-introduced text block: a prompt that is
  mostly a text to transform is usually a cheap-tier task whatever its length.
The embedding is L2-normalised here (the cache's may or may not be); a vector of the wrong size is rejected.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from fleetgate.router.tiers.embedding import EMBEDDING_DIM

MAX_CHARS = 4_000  # MiniLM reads ~256 word pieces (~1,000 characters); later text adds little signal

STRUCTURAL_FEATURES: tuple[str, ...] = (
    "log_words",
    "code",
    "math",
    "steps",
    "why_how",
    "what_who",
    "constraints",
    "analysis",
    "simple_task",
    "quoted_share",
)

# One pass tokenises the lower-cased text; single words are looked up in sets, stems with startswith, phrases
# with str.count (C speed). Case-insensitive regex alternations were 10x slower on long prompts.
_TOKEN = re.compile(r"[a-z0-9_']+")
_CALL = re.compile(r"\w\(")
_NUMBER = re.compile(r"\d+(?:[.,]\d+)?")
_OPERATOR = re.compile(r"[+\-*/^=<>]\s?\d")
_ENUMERATION = re.compile(r"^[ \t]*(?:\d+[.)]|[-*\u2022])[ \t]", re.MULTILINE)
_SENTENCE = re.compile(r"[.!?](?:\s|$)")
_QUOTED = re.compile(r"'[^'\n]{12,}'|\"[^\"\n]{12,}\"|\u201c[^\u201d]{12,}\u201d|:[ \t]*\n[\s\S]{40,}")



def _words(spaced: str) -> frozenset[str]:
    return frozenset(spaced.split())


_CODE_SYMBOLS = ("```", "{", "}", ";", "=>", "==", "!=", "->", "::", "+=")
_LEXICON: Mapping[str, tuple[frozenset[str], tuple[str, ...], tuple[str, ...]]] = MappingProxyType({
    # feature: (words, stems, phrases)
    "code": (
        _words("def return import lambda async await const elif struct func printf println traceback exception "
                  "null regex segfault stacktrace sql json yaml api"),
        (),
        ("stack trace",),
    ),
    "math": (
        _words("prove proof theorem lemma integral derivative probability equation equations solve irrational "
                  "prime primes divisible modulo percent ratio rate average sum"),
        (),
        ("how many", "how much", "expected value"),
    ),
    "steps": (
        _words("first then next finally afterwards including"),
        (),
        ("step by step", "step-by-step", "after that", "and then", "followed by"),
    ),
    "why_how": (_words("why how explain justify"), (), ("what would happen", "what happens", "walk me")),
    "what_who": (_words("who when where which what's"), (), ("what is", "what are")),
    "constraints": (
        _words("must should without exactly ensure only constraint constraints requirement requirements "
                  "tradeoff tradeoffs budget deadline minimize minimise maximize maximise optimal handle "
                  "guarantee"),
        (),
        ("at least", "at most", "no more than", "trade-off", "edge case"),
    ),
    "analysis": (
        _words("design analyze analyse analysis compare evaluate implement optimize optimise debug refactor plan "
                  "strategy derive reason critique assess algorithm complexity bug fail fails wrong"),
        ("architect", "scal", "concurren"),
        (),
    ),
    "simple_task": (
        _words("translate classify extract summarize summarise tldr rewrite rephrase paraphrase proofread correct "
                  "format convert define definition list label synonym hello hi thanks"),
        ("categor",),
        ("tl;dr", "fix the grammar", "fix grammar", "spelling", "typos", "capital of", "thank you"),
    ),
})


def lexicon_terms(groups: tuple[str, ...]) -> tuple[str, ...]:
    """The words and phrases of the named lexicon groups (sorted): the keyword rule's candidate keywords."""
    terms: set[str] = set()
    for name in groups:
        words, _stems, phrases = _LEXICON[name]
        terms.update(words, phrases)
    return tuple(sorted(terms))


def _damp(count: float) -> float:
    return math.log1p(count)


def _index_words() -> tuple[Mapping[str, tuple[str, ...]], tuple[str, ...]]:
    by_word: dict[str, list[str]] = {}
    for name, (words, _stems, _phrases) in _LEXICON.items():
        for word in words:
            by_word.setdefault(word, []).append(name)
    stems = tuple(stem for _words_, stems, _phrases in _LEXICON.values() for stem in stems)
    return MappingProxyType({w: tuple(names) for w, names in by_word.items()}), stems


_BY_WORD, _ALL_STEMS = _index_words()


def _lexicon_counts(lower: str, tokens: list[str]) -> dict[str, int]:
    counts = {name: sum(lower.count(p) for p in phrases) for name, (_w, _s, phrases) in _LEXICON.items()}
    for token, n in Counter(tokens).items():
        for name in _BY_WORD.get(token, ()):
            counts[name] += n
        if token.startswith(_ALL_STEMS):
            for name, (_w, stems, _p) in _LEXICON.items():
                if stems and token.startswith(stems):
                    counts[name] += n
    return counts


def structural_features(text: str) -> np.ndarray:
    """The structural signals in `STRUCTURAL_FEATURES` order, as float64."""
    t = text[:MAX_CHARS]
    lower = t.lower()
    tokens = _TOKEN.findall(lower)
    c = _lexicon_counts(lower, tokens)
    code = c["code"] + sum(t.count(s) for s in _CODE_SYMBOLS) + len(_CALL.findall(t))
    math_hits = c["math"] + len(_OPERATOR.findall(t)) + min(len(_NUMBER.findall(t)), 20) / 4
    steps = c["steps"] + len(_ENUMERATION.findall(t)) + max(len(_SENTENCE.findall(t)) - 1, 0)
    quoted = sum(len(m.group(0)) for m in _QUOTED.finditer(t))
    values = (
        _damp(len(tokens)),
        _damp(code),
        _damp(math_hits),
        _damp(steps),
        _damp(c["why_how"]),
        _damp(c["what_who"]),
        _damp(c["constraints"]),
        _damp(c["analysis"]),
        _damp(c["simple_task"]),
        quoted / max(len(t), 1),
    )
    return np.asarray(values, dtype=np.float64)


_TURN = re.compile(r"(?:^|\n)<\|(system|user|assistant|tool|developer|function)\|>")


def scoring_text(prompt_text: str) -> str:
    """The text to score: the last user turn of the gateway's chat serialisation (`<|role|>content\n` per
    message, `fleetgate.gateway.parsing.chat_prompt_text`), the same text the semantic cache embeds; any other
    prompt (completions) as it is. System prompts and earlier turns are left out: the labels describe requests."""
    if not prompt_text.startswith("<|"):
        return prompt_text
    parts = _TURN.split(prompt_text)  # ["", role, content, role, content, ...]
    for i in range(len(parts) - 2, 0, -2):
        if parts[i] == "user":
            return parts[i + 1].removesuffix("\n")
    return prompt_text


def normalize_embedding(embedding: Any) -> np.ndarray | None:
    """The embedding as a unit float64 vector, or None when it is missing or not a 384-d MiniLM vector."""
    if embedding is None:
        return None
    try:
        vector = np.asarray(embedding, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        return None
    if vector.shape != (EMBEDDING_DIM,) or not np.all(np.isfinite(vector)):
        return None
    norm = float(np.linalg.norm(vector))
    if norm == 0.0:
        return None
    return vector / norm


def feature_vector(text: str, embedding: np.ndarray) -> np.ndarray:
    """`[structural..., embedding...]` for one prompt; `embedding` must already be normalised."""
    return np.concatenate([structural_features(text), embedding])


def feature_matrix(texts: list[str], embeddings: np.ndarray) -> np.ndarray:
    rows = [structural_features(t) for t in texts]
    norms = np.linalg.norm(embeddings, axis=1, keepdims=True)
    return np.hstack([np.vstack(rows), embeddings / np.where(norms == 0, 1.0, norms)])
