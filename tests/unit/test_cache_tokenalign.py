"""`TokenStates` fed by the embedding pass (`offer`), without the model: grouping, bounds, threads, who shares.

The states here are made up (a token's state is a one-hot of its word), so what is checked is the
book-keeping: an offered text is grouped into words only when asked, with no encoder pass; both LRUs stay
bounded; and only the int8 ONNX embedder is shared. That a padded batch gives the states a text gives alone
is checked with the real model in tests/component/test_cache_token_states.py.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from fleetgate.cache.config import CacheConfig, SemanticConfig
from fleetgate.cache.embedding import BatchingEmbedder, HashingEmbedder, OnnxMiniLMEmbedder, encoder_of
from fleetgate.cache.evaluation import MemoEmbedder
from fleetgate.cache.metrics import CacheMetrics
from fleetgate.cache.tokenalign import TokenStates
from fleetgate.cache.twolayer import TwoLayerCache
from fleetgate.core.kvstore import MemoryKVStore


def fake_states(text: str, dim: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """[CLS], one token per whitespace-separated word (state: a one-hot of the word's index), [SEP]."""
    offsets, start = [(0, 0)], 0
    for word in text.split():
        start = text.index(word, start)
        offsets.append((start, start + len(word)))
        start += len(word)
    offsets.append((0, 0))
    states = np.zeros((len(offsets), dim), dtype=np.float32)
    for t in range(1, len(offsets) - 1):
        states[t, (t - 1) % dim] = 1.0
    return states, np.array(offsets, dtype=np.int64)


class NoEncoder(TokenStates):
    """Fails on an encoder pass of its own: every text must come from `offer`."""

    def _pass(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        raise AssertionError(f"an encoder pass for {text!r}")


def test_an_offered_text_is_grouped_into_words_when_asked_without_a_pass() -> None:
    states = NoEncoder()
    text = "Deploy the Rust service"
    states.offer(text, *fake_states(text))
    words = states.words(text)
    assert words.text == ("deploy", "the", "rust", "service")
    assert words.capital == (False, False, True, False)  # "Rust" inside the sentence; the first word is not
    assert np.array_equal(words.vectors, np.eye(8, dtype=np.float32)[:4])
    assert states.words(text) is words  # memoised
    assert states.passes == 0


def test_words_are_built_only_for_texts_asked_for() -> None:
    states = NoEncoder()
    for i in range(5):
        states.offer(f"text number {i}", *fake_states(f"text number {i}"))
    assert len(states._memo) == 0 and len(states._offered) == 5  # raw states only: no grouping paid yet
    states.words("text number 3")
    assert list(states._memo) == ["text number 3"] and "text number 3" not in states._offered


def test_offered_states_and_words_stay_bounded() -> None:
    states = NoEncoder(offered_size=3, cache_size=2)
    texts = [f"prompt {i} about something" for i in range(10)]
    for text in texts:
        states.offer(text, *fake_states(text))
    assert list(states._offered) == texts[-3:]  # the oldest dropped: embedded, never aligned
    with pytest.raises(AssertionError, match="an encoder pass"):
        states.words(texts[0])  # dropped: it would need a pass of its own
    for text in texts[-3:]:
        states.words(text)
    assert list(states._memo) == texts[-2:] and not states._offered


def test_offered_states_stay_within_their_byte_budget() -> None:
    """Hostile 256-token prompts must not hold the count cap's worth of large arrays."""
    one = sum(a.nbytes for a in fake_states("a long prompt"))
    states = NoEncoder(offered_bytes=4 * one)
    for i in range(20):
        states.offer(f"a long prompt{i}", *fake_states("a long prompt"))
    assert len(states._offered) == 4 and states._offered_bytes == 4 * one
    states.words("a long prompt19")
    assert len(states._offered) == 3 and states._offered_bytes == 3 * one


def test_a_text_already_grouped_is_not_offered_again() -> None:
    states = NoEncoder()
    states.offer("same text", *fake_states("same text"))
    words = states.words("same text")
    states.offer("same text", *fake_states("same text"))
    assert not states._offered and states.words("same text") is words


def test_offers_from_the_embedding_thread_and_reads_from_align_threads_interleave_safely() -> None:
    states = NoEncoder(offered_size=64, cache_size=32)
    texts = [f"question {chr(97 + i // 26)}{chr(97 + i % 26)} here" for i in range(400)]  # words: letters only
    errors: list[BaseException] = []

    def embed_thread() -> None:
        for text in texts:
            states.offer(text, *fake_states(text))

    def align_thread(offset: int) -> None:
        try:
            for text in texts[offset::4]:
                try:
                    assert states.words(text).text == tuple(text.split())
                except AssertionError as exc:
                    if "an encoder pass" not in str(exc):  # not offered yet, or already dropped: fine here
                        raise
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=embed_thread), *(threading.Thread(target=align_thread, args=(k,))
                                                         for k in range(4))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(states._offered) <= 64 and len(states._memo) <= 32


def test_only_the_int8_onnx_embedder_of_the_same_folder_is_shared(tmp_path: Path) -> None:
    int8 = OnnxMiniLMEmbedder(model_dir=tmp_path, variant="int8")  # nothing loads until it embeds
    assert encoder_of(BatchingEmbedder(embedder=int8)) is int8
    assert encoder_of(MemoEmbedder(BatchingEmbedder(embedder=int8))) is int8
    for other in (OnnxMiniLMEmbedder(model_dir=tmp_path, variant="fp32"), OnnxMiniLMEmbedder(variant="int8"),
                  HashingEmbedder()):
        states = TokenStates(model_dir=tmp_path)
        assert not states.share(other) and not states.shared
        assert getattr(other, "_sink", None) is None
    states = TokenStates(model_dir=tmp_path)
    assert states.share(int8) and states.shared and int8._sink is states
    assert int8._loaded is None  # sharing loads nothing


def make(tmp_path: Path, embedder: str, encoder: object) -> TwoLayerCache:
    config = CacheConfig(semantic=SemanticConfig(embedder=embedder, model_dir=str(tmp_path)))  # type: ignore[arg-type]
    return TwoLayerCache(config=config, kvstore=MemoryKVStore(), metrics=CacheMetrics(CollectorRegistry()),
                         embedder=BatchingEmbedder(embedder=encoder))  # type: ignore[arg-type]


def test_the_cache_shares_its_token_states_with_an_int8_onnx_embedder_only(tmp_path: Path) -> None:
    int8 = OnnxMiniLMEmbedder(model_dir=tmp_path, variant="int8")
    cache = make(tmp_path, "minilm-onnx-int8", int8)
    assert cache.token_states is not None and cache.token_states.shared and int8._sink is cache.token_states
    fp32 = OnnxMiniLMEmbedder(model_dir=tmp_path, variant="fp32")
    make(tmp_path, "minilm-onnx", fp32)
    assert fp32._sink is None  # its states are not the int8 ones the pair model was fitted on
    assert make(tmp_path, "hashing", HashingEmbedder()).token_states is None
