"""The ONNX Runtime MiniLM agrees with the sentence-transformers reference, prompt by prompt.

Hand-written prompts (short, long past the 256-token truncation, code, non-English, punctuation only);
the ONNX files are exported on first use into the model cache folder when missing.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from fleetgate.cache.build import build_embedder
from fleetgate.cache.config import CacheConfig, SemanticConfig
from fleetgate.cache.embedding import BatchingEmbedder, MiniLMEmbedder, OnnxMiniLMEmbedder, is_minilm

pytestmark = pytest.mark.slow

PROMPTS = [
    "How do I reset my password?",
    "What are the steps to reset my password?",
    "Tomato soup",
    "Write a haiku about the sea at night.",
    "In Python, how do I reverse a string?",
    "How do I group by one column and sum another in SQL?",
    "def f(x):\n    return [i * i for i in range(x) if i % 2]\n\nWhat does this function return for 7?",
    "Quelle est la capitale de l'Australie ?",
    "¿Cuántos días tiene un año bisiesto?",
    "!!! ??? ...",
    "a",
    "Summarise the following text. " + "The quarterly report shows revenue growth in every region. " * 60,
    "Translate 'good morning' into German, Japanese and Swahili, and explain the politeness levels.",
    "What major events happened in 1989?",
    "What major events happened in 1998?",
]


@pytest.fixture(scope="module")
def reference() -> Iterator[np.ndarray]:
    yield MiniLMEmbedder(threads=1).embed(PROMPTS)


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_every_prompt_agrees_with_the_reference(reference: np.ndarray, variant: str) -> None:
    onnx = OnnxMiniLMEmbedder(variant=variant)  # type: ignore[arg-type]
    one_by_one = np.concatenate([onnx.embed([p]) for p in PROMPTS])
    batched = onnx.embed(PROMPTS)
    for vectors in (one_by_one, batched):
        assert vectors.shape == (len(PROMPTS), 384) and vectors.dtype == np.float32
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
        cosine = (vectors * reference).sum(axis=1)
        assert cosine.min() >= (0.9999 if variant == "fp32" else 0.99), cosine
    # grouping and padding within a batch do not change a text's vector (int8: activations are
    # quantised per block of one row, never with the batch's other texts)
    assert np.allclose(one_by_one, batched, atol=1e-4)


def test_paraphrases_stay_closer_than_unrelated_text() -> None:
    v = OnnxMiniLMEmbedder().embed(PROMPTS[:3])
    assert float(v[0] @ v[1]) > float(v[0] @ v[2]) + 0.3


def test_the_default_cache_embedder_is_the_batched_int8_onnx_minilm() -> None:
    embedder = build_embedder(CacheConfig())
    assert isinstance(embedder, BatchingEmbedder) and isinstance(embedder.inner, OnnxMiniLMEmbedder)
    assert embedder.inner.variant == "int8" and is_minilm(embedder)
    fp32 = build_embedder(CacheConfig(semantic=SemanticConfig(embedder="minilm-onnx")))
    assert isinstance(fp32, BatchingEmbedder) and isinstance(fp32.inner, OnnxMiniLMEmbedder)
    assert fp32.inner.variant == "fp32"
    reference = build_embedder(CacheConfig(semantic=SemanticConfig(embedder="minilm")))
    assert isinstance(reference, BatchingEmbedder) and isinstance(reference.inner, MiniLMEmbedder)
    assert not is_minilm(build_embedder(CacheConfig(semantic=SemanticConfig(embedder="hashing"))))
