"""The ONNX Runtime MiniLM agrees with the sentence-transformers reference, prompt by prompt.

Hand-written prompts (short, long past the 256-token truncation, code, non-English, punctuation only) and
every user prompt of the committed frozen eval set (tests/data/eval); the ONNX files are exported on first
use into the model cache folder when missing.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from fleetgate.bench.embedder import eval_prompts
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


FROZEN = eval_prompts(Path(__file__).parents[1] / "data" / "eval")  # the committed frozen eval prompts
TEXTS = PROMPTS + FROZEN


@pytest.fixture(scope="module")
def reference() -> Iterator[np.ndarray]:
    yield MiniLMEmbedder(threads=1).embed(TEXTS)


def test_the_frozen_prompts_are_there() -> None:
    assert len(FROZEN) > 1000  # the agreement below covers the committed eval set, not a handful


@pytest.mark.parametrize("variant", ["fp32", "int8"])
def test_every_prompt_agrees_with_the_reference(reference: np.ndarray, variant: str) -> None:
    onnx = OnnxMiniLMEmbedder(variant=variant)  # type: ignore[arg-type]
    one_by_one = np.concatenate([onnx.embed([p]) for p in TEXTS])
    batched = np.concatenate([onnx.embed(TEXTS[i : i + 32]) for i in range(0, len(TEXTS), 32)])
    for vectors in (one_by_one, batched):
        assert vectors.shape == (len(TEXTS), 384) and vectors.dtype == np.float32
        assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-4)
        cosine = (vectors * reference).sum(axis=1)
        worst = int(cosine.argmin())
        assert cosine.min() >= (0.9999 if variant == "fp32" else 0.99), (cosine.min(), TEXTS[worst])
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
    assert embedder.memo_entries == 4096  # the exact-text memo is on by default
    off = build_embedder(CacheConfig(semantic=SemanticConfig(embed_memo=0)))
    assert isinstance(off, BatchingEmbedder) and off.memo_entries == 0
    fp32 = build_embedder(CacheConfig(semantic=SemanticConfig(embedder="minilm-onnx")))
    assert isinstance(fp32, BatchingEmbedder) and isinstance(fp32.inner, OnnxMiniLMEmbedder)
    assert fp32.inner.variant == "fp32"
    reference = build_embedder(CacheConfig(semantic=SemanticConfig(embedder="minilm")))
    assert isinstance(reference, BatchingEmbedder) and isinstance(reference.inner, MiniLMEmbedder)
    assert not is_minilm(build_embedder(CacheConfig(semantic=SemanticConfig(embedder="hashing"))))


def test_a_failed_export_is_a_clear_error_and_leaves_no_partial_file(tmp_path: Path) -> None:
    from fleetgate.core.errors import ConfigError
    from fleetgate.core.minilm_export import ensure_onnx, onnx_file

    (tmp_path / "config.json").write_text("{}")  # a model folder without weights: the export must fail
    with pytest.raises(ConfigError, match=r"exporting MiniLM to ONNX \(int8\) failed"):
        ensure_onnx(model_dir=tmp_path, variant="int8")
    assert not onnx_file(model_dir=tmp_path, variant="int8").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json"]  # temporaries cleaned up
