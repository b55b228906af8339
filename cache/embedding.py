"""Sentence embedders for the semantic cache.

`MiniLMEmbedder`: the kernel's one MiniLM loader (`fleetgate.core.minilm`), shared with the tier router.

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

from fleetgate.core.minilm import MINILM_DIM, MiniLMEmbedder

__all__ = ["MINILM_DIM", "Embedder", "HashingEmbedder", "MiniLMEmbedder"]

_WORD = re.compile(r"[a-z0-9]+")


class Embedder(Protocol):
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """float32 array (len(texts), dim), rows L2-normalised. Blocking."""
        ...


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
