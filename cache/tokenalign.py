"""Token-level alignment of two prompts with MiniLM's contextual token states (BERTScore-style).

A second representation of a pair, not a word list: each content word of one prompt is aligned to its most
similar word on the other side, by the cosine of MiniLM's last-layer token states (a word's state is the
mean of its word pieces'). A paraphrase aligns every content word well ("lowest" / "reduced"); a near miss
leaves one word badly aligned or aligned to a different word whose context is the same ("Austria" /
"Australia", "formal" / "relaxed"). Features for the pair model (`ALIGN_FEATURES`):
- `align_worst`: the worst best-match cosine over the content words of both sides;
- `align_worst2`: the second worst (one odd word may be a wrapper; two are a difference);
- `align_mean`: the rarity-weighted mean best-match cosine (BERTScore F with word-frequency weights:
  rare words weigh more, "the" almost nothing);
- `align_unaligned`: the share of content words whose best match is below `UNALIGNED`;
- `align_capital_worst`: the worst best match of a capitalised word inside a sentence (names, places;
  1.0 when there is none);
- `align_same_word_worst`: the lowest cosine between the states of one content word present on both sides:
  the same word in another role ("Go faster than Java" / "Java faster than Go", "noon in London, time in
  Tokyo" / the reverse) has another context, which the contextual states carry and a bag of words does not;
- `align_swap`: the lowest cosine between the states of two different modifiers of one shared word
  (`pairfeatures.swapped_surfaces`): a synonym ("prior" / "previous revision", "minor" / "small burn")
  sits close, another kind of the thing ("economy" / "priority shipping") far (1.0 when there is none).
Content words are those with English Zipf frequency below `FUNCTION_ZIPF` (`wordfreq`): frequency, not a list.

The states are the last encoder layer's output of the cache's own MiniLM pass: when the cache embeds with the
int8 ONNX embedder (the default), `share` attaches this `TokenStates` to it and the pass that embeds a text
also hands over that text's token states and tokenizer offsets (`offer`; `fleetgate.core.minilm_onnx`), kept
raw in a small LRU of their own (`offered_size` texts: the cache embeds many texts it never aligns) until
`words(text)` asks for them; only then are they grouped into words and moved to the `Words` LRU
(`cache_size` texts). The states are keyed by the exact text: a text embedded in another spelling
(`fleetgate.cache.textnorm.embedding_text` corrected a typo) is not the text the verifier reads, and gets a
pass of its own, as does a text whose states were never offered or already dropped. That pass runs on the
attached embedder's session (one ONNX session in the process); without one (the fp32 or sentence-transformers
embedder, training, `verify` alone) `TokenStates` loads the int8 file itself on first use, with the token-state
output added (`minilm_onnx.states_graph`). Either way a text's states are the same, bit for bit: a padded row
of a batch gives what the text gives alone.
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

FUNCTION_ZIPF = 5.6  # at or above: a function word ("the" 7.7, "how" 6.3, "make" 5.9; "help" 5.8, "file" 5.2)
UNALIGNED = 0.55
ALIGN_FEATURES = (
    "align_worst",
    "align_worst2",
    "align_mean",
    "align_unaligned",
    "align_capital_worst",
    "align_same_word_worst",
    "align_swap",
)
NEUTRAL: tuple[float, ...] = (1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0)  # two prompts with no content word to compare
_WORD = re.compile(r"[A-Za-z][A-Za-z'\-]*")


class Words:
    """The words of one prompt with their token states (unit vectors), lower-cased text and capitalisation."""

    __slots__ = ("capital", "text", "vectors")

    def __init__(self, text: Sequence[str], vectors: np.ndarray, capital: Sequence[bool]) -> None:
        self.text = tuple(text)
        self.vectors = vectors
        self.capital = tuple(capital)


class TokenStates:
    """MiniLM's last-layer token states per word, from the cache's ONNX file. Thread-safe, lazily loaded."""

    def __init__(self, *, model_dir: Path | None = None, variant: str = "int8", cache_size: int = 4096,
                 offered_size: int = 16_384, offered_bytes: int = 64 << 20) -> None:
        self._model_dir = model_dir
        self._variant = variant
        self._session: Any | None = None
        self._tokenizer: Any | None = None
        self._encoder: Any | None = None  # the embedder whose passes give the states (`share`)
        self._lock = threading.Lock()
        self._memo: OrderedDict[str, Words] = OrderedDict()
        self._cache_size = cache_size
        # texts embedded by the shared encoder, not grouped into words yet: (token states, character offsets)
        # Bounded in texts and in bytes (a 20-token prompt's states are ~31 kB, a 256-token one's 400 kB): a
        # lookup's candidates are entries stored by earlier lookups, which kept their states here, so the
        # budget sets how far back a candidate's states come without a pass of their own (~2,000 prompts).
        self._offered: OrderedDict[str, tuple[np.ndarray, np.ndarray]] = OrderedDict()
        self._offered_size = offered_size
        self._offered_budget = offered_bytes
        self._offered_bytes = 0
        self.passes = 0  # encoder passes of its own, for texts no embedding handed over (tests, diagnostics)

    def share(self, encoder: object) -> bool:
        """Take the token states of the texts `encoder` embeds, and run this object's own passes on its
        session, when it is the same ONNX file (`OnnxMiniLMEmbedder`, this variant and model folder); returns
        whether it is. Otherwise nothing changes (a separate session, loaded on first use)."""
        from fleetgate.core.minilm_onnx import OnnxMiniLMEmbedder

        if (not isinstance(encoder, OnnxMiniLMEmbedder) or encoder.variant != self._variant
                or encoder.model_dir != self._model_dir):
            return False
        encoder.keep_states(self)
        with self._lock:
            self._encoder = encoder  # the latest: an earlier one's states are the same
            self._session = None  # a session of its own loaded before is not needed any more
        return True

    @property
    def shared(self) -> bool:
        """Whether the states come from the embedder's session (`share`) rather than one of its own."""
        return self._encoder is not None

    def load(self) -> None:
        encoder = self._encoder
        if encoder is not None:
            encoder.load()
            return
        with self._lock:
            if self._session is not None or self._encoder is not None:
                return
            from fleetgate.core.minilm import minilm_dir
            from fleetgate.core.minilm_export import ensure_onnx
            from fleetgate.core.minilm_onnx import cpu_session, minilm_tokenizer, states_graph

            folder = self._model_dir or minilm_dir()
            tokenizer = minilm_tokenizer(folder)
            graph, self._output = states_graph(
                ensure_onnx(model_dir=folder, variant="int8" if self._variant == "int8" else "fp32"))
            self._session = cpu_session(graph, threads=1)
            self._tokenizer = tokenizer

    def offer(self, text: str, states: np.ndarray, offsets: np.ndarray) -> None:
        """The token states of `text` from an embedding pass (tokens x 384) and the tokenizer's character
        offsets (tokens x 2): kept, ungrouped, until `words(text)` asks (the oldest dropped past
        `offered_size` texts or `offered_bytes`)."""
        with self._lock:
            if text in self._memo:
                return
            old = self._offered.pop(text, None)
            if old is not None:
                self._offered_bytes -= old[0].nbytes + old[1].nbytes
            self._offered[text] = (states, offsets)
            self._offered_bytes += states.nbytes + offsets.nbytes
            while self._offered and (len(self._offered) > self._offered_size
                                     or self._offered_bytes > self._offered_budget):
                _, (dropped, dropped_offsets) = self._offered.popitem(last=False)
                self._offered_bytes -= dropped.nbytes + dropped_offsets.nbytes

    def words(self, text: str) -> Words:
        with self._lock:
            hit = self._memo.get(text)
            if hit is not None:
                self._memo.move_to_end(text)
                return hit
            offered = self._offered.pop(text, None)
            if offered is not None:
                self._offered_bytes -= offered[0].nbytes + offered[1].nbytes
        words = _words(text, *(offered if offered is not None else self._pass(text)))
        with self._lock:
            self._memo[text] = words
            while len(self._memo) > self._cache_size:
                self._memo.popitem(last=False)
        return words

    def compute(self, text: str) -> Words:
        """The words of `text`, always by a fresh encoder pass (not cached: for timing)."""
        return _words(text, *self._pass(text))

    def _pass(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """`text` through the encoder alone: (token states, character offsets per token)."""
        if self._encoder is None and self._session is None:
            self.load()
        with self._lock:  # `share` may swap the session for the encoder's meanwhile
            self.passes += 1
            encoder, session = self._encoder, self._session
        if encoder is not None:
            states, offsets = encoder.token_states(text)
            return states, offsets
        assert session is not None and self._tokenizer is not None
        enc = self._tokenizer.encode(text)
        ids = np.array([enc.ids], dtype=np.int64)
        (states,) = session.run([self._output], {"input_ids": ids, "attention_mask": np.ones_like(ids)})
        return states[0], np.array(enc.offsets, dtype=np.int64).reshape(len(enc.ids), 2)


def _words(text: str, states: np.ndarray, offsets: np.ndarray) -> Words:
    """Group the token states of `text` into its words (a word's vector: the mean of its word pieces')."""
    spans = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    groups: list[list[int]] = [[] for _ in spans]
    for t, (start, end) in enumerate(offsets.tolist()):
        if end <= start:
            continue  # [CLS], [SEP]
        for w, (ws, we) in enumerate(spans):
            if ws <= start < we:
                groups[w].append(t)
                break
    keep = [w for w, g in enumerate(groups) if g]
    if not keep:
        return Words((), np.zeros((0, states.shape[1]), dtype=np.float32), ())
    vectors = np.stack([states[groups[w]].mean(axis=0) for w in keep])
    vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-9)
    texts = [text[spans[w][0] : spans[w][1]] for w in keep]
    capital = [
        t[:1].isupper() and spans[w][0] > 0 and not re.search(r"[.!?:]\s*$", text[: spans[w][0]])
        for t, w in zip(texts, keep, strict=True)
    ]
    return Words([t.lower() for t in texts], vectors, capital)


def content_weight(word: str) -> float:
    """How much a word counts as content: 0 for function words (Zipf >= `FUNCTION_ZIPF`), more the rarer."""
    from fleetgate.cache.wordmatch import zipf

    return max(0.0, FUNCTION_ZIPF - zipf(word))


def align_features(a: Words, b: Words, swaps: Sequence[tuple[str, str]] = ()) -> tuple[float, ...]:
    """`ALIGN_FEATURES` of two prompts' words (symmetric); `swaps`: the swapped modifiers (word in a, word
    in b) of `fleetgate.cache.pairfeatures.swapped_surfaces`."""
    if not len(a.text) or not len(b.text):
        return NEUTRAL
    sims = a.vectors @ b.vectors.T
    best = [(w, c, float(s)) for w, c, s in zip(a.text, a.capital, sims.max(axis=1), strict=True)]
    best += [(w, c, float(s)) for w, c, s in zip(b.text, b.capital, sims.max(axis=0), strict=True)]
    weights = [content_weight(w) for w, _, _ in best]
    content = [(s, c, wt) for (_, c, s), wt in zip(best, weights, strict=True) if wt > 0]
    if not content:
        return NEUTRAL
    scores = sorted(s for s, _, _ in content)
    total = sum(wt for _, _, wt in content)
    mean = sum(s * wt for s, _, wt in content) / total
    capitals = [s for s, c, _ in content if c]
    same = [
        max(float(sims[i, j]) for j, v in enumerate(b.text) if v == w)
        for i, w in enumerate(a.text)
        if w in b.text and content_weight(w) > 0
    ]
    swapped = [
        float(sims[a.text.index(x), b.text.index(y)]) for x, y in swaps if x in a.text and y in b.text
    ]
    return (
        scores[0],
        scores[1] if len(scores) > 1 else scores[0],
        mean,
        sum(s < UNALIGNED for s in scores) / len(scores),
        min(capitals, default=1.0),
        min(same, default=1.0),
        min(swapped, default=1.0),
    )
