"""Sentence embedders for the semantic cache.

`OnnxMiniLMEmbedder`: MiniLM on ONNX Runtime (`fleetgate.core.minilm_onnx`), the default.
`MiniLMEmbedder`: the reference, sentence-transformers (`fleetgate.core.minilm`).
`RemoteEncoder` (`fleetgate.cache.remote_encoder`): MiniLM served by an encoder service (`/v1/embeddings`).
Both give the same vectors (cosine >= 0.99 per prompt, README "Semantic cache"); the gateway wraps the one it
uses in a `BatchingEmbedder` (`fleetgate.core.embed_batcher`) and shares it with the tier router.

`HashingEmbedder`: a deterministic bag-of-words embedder (signed feature hashing of lower-cased word
unigrams and bigrams into `dim` buckets, L2-normalised). It needs no model files and is what the fast unit
tests use; it is a poor semantic model and is not meant for production.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Sequence
from typing import Protocol

import numpy as np

from fleetgate.core.embed_batcher import BatchingEmbedder
from fleetgate.core.minilm import MINILM_DIM, MiniLMEmbedder
from fleetgate.core.minilm_onnx import OnnxMiniLMEmbedder

__all__ = ["MINILM_DIM", "BatchingEmbedder", "Embedder", "HashingEmbedder", "MiniLMEmbedder", "OnnxMiniLMEmbedder",
           "encoder_of", "is_minilm", "serves_minilm"]

_WORD = re.compile(r"[a-z0-9]+")


class Embedder(Protocol):
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array (len(texts), dim), rows L2-normalised. Blocking."""
        ...


def encoder_of(embedder: object) -> object:
    """The encoder inside wrappers that keep it as `inner` (the micro-batcher, the evaluation's memo)."""
    for _ in range(4):  # bounded: a test double may answer any attribute
        inner = getattr(embedder, "inner", None)
        if inner is None:
            break
        embedder = inner
    return embedder


def is_minilm(embedder: object) -> bool:
    """True for a MiniLM embedder in this process (either backend, batched or not): its vectors are valid for
    the tier scorer, which may call its blocking `embed` from its own thread."""
    inner = embedder.inner if isinstance(embedder, BatchingEmbedder) else embedder
    return isinstance(inner, MiniLMEmbedder | OnnxMiniLMEmbedder)


def serves_minilm(embedder: object) -> bool:
    """True for MiniLM in this process or from an encoder service (`fleetgate.cache.remote_encoder`, which
    checks the service's identity): the static prefilter's table and the verifier's token states fit it."""
    from fleetgate.cache.remote_encoder import RemoteEncoder

    inner = embedder.inner if isinstance(embedder, BatchingEmbedder) else embedder
    return is_minilm(embedder) or isinstance(inner, RemoteEncoder)


class HashingEmbedder:
    """Deterministic feature-hashing embedder (tests; deployments without torch)."""

    def __init__(self, *, dim: int = 256) -> None:
        self.dim = dim

    def _bucket(self, feature: str) -> tuple[int, float]:
        digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
        value = int.from_bytes(digest, "little")
        return value % self.dim, (1.0 if value >> 63 else -1.0)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            words = _WORD.findall(text.lower())
            for feature in [*words, *(f"{a} {b}" for a, b in itertools.pairwise(words))]:
                col, sign = self._bucket(feature)
                out[row, col] += sign
            norm = float(np.linalg.norm(out[row]))
            if norm > 0:
                out[row] /= norm
        return out
